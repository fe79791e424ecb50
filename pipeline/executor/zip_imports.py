"""Cheap import-cache invalidation in Spark's Python workers, where CPython needs it.

Before every task a worker runs, pyspark's worker calls ``importlib.invalidate_caches()``
(so that files added with addPyFile become importable). On CPython before 3.13 that
makes every ``zipimporter`` in ``sys.path_importer_cache`` read its archive's whole
directory again: a worker holds 16 of them (pyspark.zip and each of its imported
subpackages, py4j's zip, spark-core's jar), ~0.09 CPU-s per task on the 2-core bench
machine, paid by each of a transform run's reader and writer tasks
(docs/benchmarks.md, "What made it fast").

``install()`` makes a zipimporter re-read its archive only when the archive changed on
disk since that importer last read it (its size or modification time): an unchanged
archive holds what it held, and a new archive gets a new importer anyway. Called by the
executor functions at the start of each task; idempotent; a worker's first task pays.

It patches a private behaviour of CPython's zipimport, so it fails safe: only CPython
before 3.13 is patched (newer ones do not re-read an unchanged archive), and anything
unexpected (no such method, an importer without ``archive``, a failing stat) leaves or
sends the call to CPython's own method: the plain path, never a failed task.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

_MARK = "_pipeline_lazy"  # set on our replacement: install() ran in this worker


def needed(implementation: str | None = None, version: tuple | None = None) -> bool:
    """CPython before 3.13 re-reads every zip archive's directory at each
    ``invalidate_caches()``; nothing else is patched."""
    implementation = implementation or sys.implementation.name
    version = version or sys.version_info[:2]
    return implementation == "cpython" and tuple(version) < (3, 13)


def _stamp(archive: str) -> tuple[int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def install() -> bool:
    """Patch ``zipimport.zipimporter.invalidate_caches`` (where needed); True if it is
    patched now. Never raises."""
    if not needed():
        return False
    try:
        return _install()
    except Exception:  # noqa: BLE001 - CPython's own invalidation stays: slower, correct
        log.debug("zip archive invalidation left as CPython has it", exc_info=True)
        return False


def _install() -> bool:
    import zipimport

    eager = zipimport.zipimporter.invalidate_caches
    if getattr(eager, _MARK, False):
        return True

    def invalidate_caches(self):
        try:
            stamp = _stamp(self.archive)
            if stamp is not None and getattr(self, "_pipeline_stamp", None) == stamp:
                return None
        except Exception:  # noqa: BLE001 - an importer we do not know: CPython's way
            return eager(self)
        result = eager(self)
        self._pipeline_stamp = stamp
        return result

    # This task's worker re-read every archive just before it ran: they are current.
    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter):
            finder._pipeline_stamp = _stamp(finder.archive)

    setattr(invalidate_caches, _MARK, True)
    zipimport.zipimporter.invalidate_caches = invalidate_caches
    return True
