"""How a pipeline command's process ends: without the interpreter's final garbage
collections over everything the run loaded.

At exit, after the command is done (its transaction committed, its log handlers flushed
by logging's own exit hook, the driver JVM let go: spark/driver_jvm.py), CPython still
collects garbage over every object of pandas, pyarrow, pyspark and SQLAlchemy that the
run imported: 0.3-0.7 s on the run's critical path, while the command has nothing left to
do (docs/benchmarks.md, "Transform path: the driver's critical path"). Frozen first
(``gc.freeze``: the collector skips them), they go with the process. Objects still alive
at exit were never sure to be finalized (Python's data model: ``__del__`` is not
guaranteed to run for them); nothing of a run relies on it: its files and connections are
closed by ``with`` blocks and the Store, not by the collector.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_final_collection() -> None:
    """Freeze the process's objects at exit (once per process; atexit runs hooks in
    reverse order of registration, so hooks registered later, e.g. Spark's, run first)."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(gc.freeze)
