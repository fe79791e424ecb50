"""Spark's Python workers are forked from our daemon (spark.python.daemon.module, set in
spark/session.py): a worker has the heavy modules before its first task imports them."""

import gc
import os
import sys


def _worker_state(_):
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    # gc.freeze() runs in our daemon alone, after its imports: a frozen heap in a worker
    # means it was forked from a daemon that had imported them.
    yield (parent, gc.get_freeze_count() > 0,
           all(m in sys.modules for m in ("pyarrow", "confluent_kafka", "psycopg",
                                          "pipeline.executor.consume")),
           [p for p in sys.path if p.endswith(".jar")],
           sys.modules["pyspark"].__file__)


def test_workers_are_forked_from_the_preimporting_daemon(spark):
    sc = spark.sparkContext
    assert sc.getConf().get("spark.python.daemon.module") == "pipeline.executor.daemon"
    states = sc.parallelize(range(4), 4).mapPartitions(_worker_state).collect()
    assert states
    for parent, frozen, preimported, jars, pyspark_file in states:
        assert "pipeline.executor.daemon" in parent
        assert frozen and preimported
        # spark-core's jar, which Spark puts on the workers' path, was taken off by the
        # daemon before its imports (drop_jars: its directory, ~3 MB, in every worker).
        assert jars == []
        # The same pyspark is installed in this venv: imported from its compiled files,
        # not compiled from pyspark.zip's sources in the daemon (prefer_installed).
        assert ".zip" not in pyspark_file
    # That the daemon leaves pipeline.faults to each worker is tests/unit/test_daemon.py's
    # (a worker here may be a reused one whose earlier task imported it); that faults still
    # reach the workers, the fault and kill tests'.
