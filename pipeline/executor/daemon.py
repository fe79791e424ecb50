"""Spark's Python daemon for this job's workers (``spark.python.daemon.module``, set in
spark/session.py): import what every worker imports, once, then run pyspark's own daemon.

Spark forks each Python worker from its daemon, so a module the daemon has imported is in
every worker already, its pages shared until written: each worker no longer spends
~0.1-0.25 CPU-s importing pyarrow, confluent-kafka (its schema registry client alone
0.10-0.13 s), psycopg and our formats (measured: docs/benchmarks.md).

Every import here is optional: a module missing from an environment (fastavro, the
registry client's httpx, an older pyarrow) leaves it to the worker that needs it, as
before. pipeline.faults is NOT imported here: it reads PIPELINE_FAULT at import, which a
worker must do itself.
"""

from __future__ import annotations

import gc
import importlib

# What the read/decode/COPY tasks import (executor/, formats/) and their dependencies.
PREIMPORTS = (
    "pyarrow",
    "pyarrow.compute",
    "confluent_kafka",
    "confluent_kafka.schema_registry",
    "psycopg",
    "orjson",
    "pipeline.executor.consume",
    "pipeline.executor.stage",
    "pipeline.executor.feed",
    "pipeline.executor.task",
    "pipeline.formats.encode",
    "pipeline.formats.registry",
    "pipeline.formats.arrow_copy",
    "pipeline.formats.typed_rows",
    "pipeline.formats.arrow_rows",
    "pipeline.formats.arrow_columns",
)


def preimport(names: tuple[str, ...] = PREIMPORTS) -> list[str]:
    """Import ``names``, skipping any that fail; the ones imported."""
    done = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - optional: the worker imports it, or fails, itself
            continue
        done.append(name)
    return done


def main() -> None:
    preimport()
    # Move what is imported out of the collector's generations: a worker's collections then
    # never touch (and so copy) those shared pages.
    gc.freeze()
    from pyspark.daemon import manager  # reads sys.argv[1], the worker module, as it does

    manager()


if __name__ == "__main__":
    main()
