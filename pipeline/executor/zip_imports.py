"""Cheap import-cache invalidation in Spark's Python workers.

Before every task a worker runs, pyspark's worker calls ``importlib.invalidate_caches()``
(so that files added with addPyFile become importable). On CPython before 3.13 that
makes every ``zipimporter`` in ``sys.path_importer_cache`` read its archive's whole
directory again: a worker holds 16 of them (pyspark.zip and each of its imported
subpackages, py4j's zip, spark-core's jar), ~0.09 CPU-s per task on the 2-core bench
machine, paid by each of a transform run's reader and writer tasks
(docs/benchmarks.md, "Transform path: the third pass").

``install()`` makes a zipimporter re-read its archive only when the archive changed on
disk since that importer last read it (its size or modification time): an unchanged
archive holds what it held, and a new archive gets a new importer anyway. Called by the
executor functions at the start of each task; idempotent; a worker's first task pays.
"""

from __future__ import annotations

import os
import sys


def _stamp(archive: str) -> tuple[int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def install() -> None:
    import zipimport

    eager = zipimport.zipimporter.invalidate_caches
    if getattr(eager, "_pipeline_lazy", False):
        return

    def invalidate_caches(self):
        stamp = _stamp(self.archive)
        if stamp is not None and getattr(self, "_pipeline_stamp", None) == stamp:
            return
        eager(self)
        self._pipeline_stamp = stamp

    # This task's worker re-read every archive just before it ran: they are current.
    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter):
            finder._pipeline_stamp = _stamp(finder.archive)

    invalidate_caches._pipeline_lazy = True
    zipimport.zipimporter.invalidate_caches = invalidate_caches
