"""[spark]: the master a run uses without spark-submit, and Spark settings of the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.settings.base import Table


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[2]"
    min_partitions: int = 0
    conf: dict[str, str] = field(default_factory=dict)
    # A local master's driver JVM maps its classes from a class-data-sharing archive
    # written by an earlier run (spark/class_archive.py).
    class_archive: bool = True


class SparkTable(Table):
    master: str = "local[2]"
    min_partitions: int = 0
    conf: dict[str, Any] = {}
    class_archive: bool = True

    def value(self) -> SparkSettings:
        return SparkSettings(self.master, self.min_partitions,
                             {k: str(v) for k, v in self.conf.items()}, self.class_archive)
