"""Spark's Python daemon started while the driver plans a transform's job.

A run's first Python task makes Spark start the daemon (executor/daemon.py), which imports
pyarrow, confluent-kafka, psycopg and our formats before it forks a worker: ~0.45 CPU-s,
paid while the task waits. A transform's driver first spends about a second building and
checking the SQL plan (the session, the user's code, the contract checks), when the
executors have nothing to do; a one-task job started then, in a thread of its own, has the
daemon and one idle worker ready when the read tasks start (Spark reuses workers:
spark.python.worker.reuse). The built-in path has no such wait: its tasks start at once.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("pipeline")


def _nothing(_rows):
    return iter(())


def start_python_workers(sc) -> threading.Thread:
    """Run a one-task Python job in a daemon thread and return the thread. Its failure is
    only logged: the read tasks start the daemon themselves and report what fails."""

    def warm():
        try:
            sc.parallelize([0], 1).mapPartitions(_nothing).collect()
        except Exception:  # noqa: BLE001 - the real job reports a daemon that cannot start
            log.debug("warming Spark's Python workers failed", exc_info=True)

    thread = threading.Thread(target=warm, name="warm-python-workers", daemon=True)
    thread.start()
    return thread
