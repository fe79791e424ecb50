"""Spark's Python daemon and a worker started while the driver plans a transform's job.

A run's first Python task makes Spark start its Python machinery: the JVM's runner and
worker-factory classes, then the daemon (executor/daemon.py), which imports pyarrow,
confluent-kafka, psycopg and our formats before it forks a worker (~0.45 CPU-s), all paid
while the read tasks wait. A transform's driver first spends about a second building and
checking the SQL plan, when the executors have nothing to do; a one-task ``mapInArrow``
job started then, in a thread of its own, has them ready when the read tasks start: Spark
reuses its idle worker (spark.python.worker.reuse). It is a SQL job, like the read tasks':
an RDD job's workers come from a daemon of their own (another environment), which the read
tasks would not use. The built-in path has no such wait: its tasks start at once.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("pipeline")


def _nothing(_batches):
    return iter(())


def start_python_workers(spark) -> threading.Thread:
    """Run a one-task ``mapInArrow`` job in a daemon thread and return the thread. Its
    failure is only logged: the read tasks start the daemon themselves and report what
    fails."""
    from pipeline.executor.transform.worker_imports import NO_PANDAS

    def warm():
        try:
            # Local properties are the thread's: its worker keeps pandas out, as the read
            # tasks' do (executor/transform/worker_imports.py), so it is the same worker they reuse.
            spark.sparkContext.setLocalProperty(NO_PANDAS, "true")
            spark.range(0, 1, 1, 1).mapInArrow(_nothing, "id long").collect()
        except Exception:  # noqa: BLE001 - the real job reports a daemon that cannot start
            log.debug("warming Spark's Python workers failed", exc_info=True)

    thread = threading.Thread(target=warm, name="warm-python-workers", daemon=True)
    thread.start()
    return thread
