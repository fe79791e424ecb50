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
import contextlib
import gc
import logging
import os
import sys
from typing import NoReturn

_registered = False


def skip_final_collection() -> None:
    """Freeze the process's objects at exit (once per process; atexit runs hooks in
    reverse order of registration, so hooks registered later, e.g. Spark's, run first)."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(gc.freeze)



def end_hard_at_exit() -> None:
    """For the process's entry points only (``pipeline``, ``python -m pipeline``,
    pipeline/submit.py; ``cli.main`` stays callable in-process): once the command returned
    its code (``exit_process``) and the Python exit hooks registered since ran (Spark's, the
    JVM's release), flush the logs and end the process with that code, without the C
    libraries' own exit handlers. Two copies of OpenSSL (librdkafka's, bundled with
    confluent-kafka, and libpq's) clean up at exit while the other's threads may still use
    theirs: the process then died by SIGSEGV after its error line, and a scheduler saw -11
    instead of the code that says what to do. Registered first, so it runs last."""
    atexit.register(_exit_now)


def exit_process(code: int) -> NoReturn:
    global _exit_code
    _exit_code = code
    sys.exit(code)


_exit_code: int | None = None


def _exit_now() -> None:
    if _exit_code is None:  # the command did not return (KeyboardInterrupt): as Python does
        return
    logging.shutdown()  # its own hook was registered before ours: it would run after
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed stream has nothing to flush
            stream.flush()
    os._exit(_exit_code)
