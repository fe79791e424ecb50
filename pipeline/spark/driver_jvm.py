"""The driver JVM's start and exit, overlapped with the driver's own work instead of
waited for in turn (docs/benchmarks.md, "Transform path: the driver's critical path").

Start: a transform's job is built with ``DataFrame.mapInArrow``, which imports pandas
(pyspark's ``pandas_udf`` checks its version): ~0.5 s of imports on the driver's critical
path, after the JVM is up. Imported in a thread while the JVM starts (pyspark only polls
for its port file meanwhile), the plan finds them loaded. (A built-in run imports no
pandas at all: spark/numpy_converter.py.)

Exit: a JVM that pyspark started exits when its stdin closes, i.e. after this process
has exited, and then waits ~0.3 s more (JDK 17 waits up to 300 ms for threads still in
native code, e.g. py4j's server socket accept, before it exits). At this process's exit
(atexit: everything the run does is done, its transaction committed) ``release`` shuts
py4j's server down and closes the JVM's stdin: the JVM runs Spark's shutdown hooks
(SparkContext stop, the Python daemon, temporary directories) while the interpreter
finalizes, with nothing left in native code to wait for. pyspark's accumulator server,
which would print a traceback for the connection the exiting JVM closes, is told first that
it is shutting down.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import threading

log = logging.getLogger(__name__)

# What a transform's mapInArrow imports on the driver (pyspark.sql.pandas.map_ops ->
# functions.pandas_udf -> pandas.utils.require_minimum_pandas_version).
TRANSFORM_IMPORTS = ("pandas", "pyspark.sql.pandas.functions")
IMPORT_THREAD = "imports-while-jvm-starts"

_released: set[int] = set()  # the pids of JVMs whose release is registered


def import_while_starting(modules: tuple[str, ...] = TRANSFORM_IMPORTS) -> threading.Thread:
    """Import ``modules`` in a daemon thread, started before pyspark launches the JVM.
    A module that fails to import is left to whoever imports it next (pyspark itself
    copes without pandas)."""
    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - only a head start; the real import reports
                log.debug("importing %s while the JVM starts failed", name, exc_info=True)

    thread = threading.Thread(target=load, name=IMPORT_THREAD, daemon=True)
    thread.start()
    return thread


def release_at_exit(sc) -> bool:
    """Register ``release`` for the JVM behind ``sc`` if this process launched it (not
    under spark-submit, whose JVM started this process and outlives it), once per JVM.
    Registered after the class archive's finish_dump (spark/launch.py), it runs before it
    (atexit runs last registered first): the JVM that writes an archive exits sooner too."""
    gateway = getattr(sc, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if proc is None or getattr(proc, "pid", None) is None or proc.pid in _released:
        return False
    _released.add(proc.pid)
    atexit.register(release, gateway, proc)
    return True


def release(gateway, proc) -> None:
    """Let the JVM exit now: py4j's server shut down (its threads leave native code), then
    its stdin closed (pyspark's gateway server exits on EOF, running Spark's shutdown
    hooks, as it does when this process exits). Never raises: the run is done, and the
    JVM exits on its stdin's end anyway when this process does (the plain path)."""
    try:
        if proc.poll() is not None:
            return
    except Exception:  # noqa: BLE001 - not the Popen pyspark set: leave it be
        log.debug("the JVM's process cannot be polled", exc_info=True)
        return
    try:
        quiet_accumulator_server()
        gateway.shutdown()
    except Exception:  # noqa: BLE001 - the JVM still exits on its stdin's EOF
        log.debug("shutting down py4j's gateway failed", exc_info=True)
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except Exception:  # noqa: BLE001 - it closes when this process exits anyway
        log.debug("closing the JVM's stdin failed", exc_info=True)


def quiet_accumulator_server() -> None:
    """The active SparkContext's accumulator server (pyspark, a daemon thread here) reads
    task updates from a connection the JVM opened: the JVM exiting closes it, and the
    server would print the EOFError's traceback. Flagged as shutting down, with errors
    not printed (socketserver's handle_error): no task runs any more."""
    from pyspark import SparkContext

    server = getattr(SparkContext._active_spark_context, "_accumulatorServer", None)
    if server is not None:
        server.server_shutdown = True
        server.handle_error = lambda request, client_address: None
