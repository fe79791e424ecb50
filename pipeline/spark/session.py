"""The one place that builds a SparkContext: loopback binding, the job's Python for workers,
the driver JVM's flags. Imported lazily so that a run with nothing to read never loads it."""

from __future__ import annotations

import os
import socket
import sys

from pipeline.spark import numpy_converter, scratch

# The driver JVM's flags when we start it (a user's spark.driver.extraJavaOptions replaces
# them; under spark-submit the JVM is up already), for every kind of run ("light": the
# built-in sinks; "transform": a run with a user transform, whose JVM also turns rows to
# Arrow and back, with Arrow Java's own bounds and null checks on). Per-record work is in
# Python on both (a transform's input since executor/transform/feed.py): the client compiler alone
# and the serial collector start the JVM ~1.5 s sooner, and at 2M records under an
# identity transform the JVM spent the same CPU as with C2 and the parallel collector, its
# peak RSS ~245 MB less (docs/benchmarks.md).
_LIGHT = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xms32m"
JVM_FLAGS = {"light": _LIGHT, "transform": _LIGHT}


# Allocator settings for every process Spark starts for a run (the driver JVM and Python
# workers inherit our environment on one machine; a cluster's executors get them as
# spark.executorEnv): measured on a transform run of 500,000 records (docs/benchmarks.md,
# "Memory of the transform path"), they held ~85 MB less across four Python workers and
# the JVM at the same CPU. Arrow's default pool (jemalloc) keeps freed batches' pages; the
# system allocator returns them, and two malloc arenas instead of eight a core keep the
# JVM's many threads and the workers from each holding their own. A value the user set
# (environment or [spark.conf] spark.executorEnv.*) wins.
PROCESS_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}

# Spark's memory page for a run with a transform, unless set (spark-submit, [spark.conf]).
# Spark sizes it from the heap and the cores (8 MB for local[2]'s 1 GB driver) and a hash
# table takes a whole page for its first row: a transform's broadcast join of a small
# dimension table (conf/examples/transform.toml: 90 customers) kept an 8 MB long[] live in
# the driver for the whole run, which tipped its heap over one more full collection and a
# heap grown by half (JVM 338-351 -> 324-326 MB peak RSS; docs/benchmarks.md, "round four").
# 1 MB is Spark's own floor for small heaps; a sort or an aggregate over many rows takes
# more pages, and a record bigger than a page gets a page of its own, as before.
TRANSFORM_PAGE_SIZE = {"spark.buffer.pageSize": "1m"}


# Spark's Python daemon for one machine's workers (spark_conf; executor/daemon.py).
DAEMON_MODULE = "pipeline.executor.daemon"


def spark_conf(master: str = "local[2]", conf: dict[str, str] | None = None,
               app_name: str = "kafka-offset-pipeline", jvm: str = "light",
               schema_registry: bool = False, arrow: bool = True):
    """The job's SparkConf: our defaults where nothing set the key (spark-submit's --conf and
    spark-defaults.conf win, so a cluster can turn the UI back on), then the user's
    ``[spark.conf]`` over it. ``schema_registry``: the workers read writer schemas from a
    registry (avro, protobuf), so the daemon preimports its client; ``arrow``: the workers
    may read Arrow (a transform), so it preimports pyarrow (executor/daemon.py)."""
    from pyspark import SparkConf

    from pipeline.executor.daemon import ARROW_ENV, REGISTRY_ENV

    conf = dict(conf or {})
    master = os.environ.get("PIPELINE_SPARK_MASTER", master)
    if submitted():
        master = _submitted_master()
    local = master.startswith("local")
    check_master_reachable(master)
    # Workers must run the job's interpreter (psycopg lives there): on one machine that is
    # ours; on a cluster, the packed environment named by spark.pyspark.python (see
    # docs/cluster.md). pyspark reads PYSPARK_PYTHON only, spark-submit maps the conf to it.
    if conf.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    elif local:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark_conf = SparkConf().setAppName(app_name)
    if not submitted():
        spark_conf.setMaster(master)  # under spark-submit, its --master decides
    defaults = {
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.log.level": "WARN",  # also under spark-submit, whose JVM is up already
        # A Python worker that crashes leaves its traceback in the error (no cost until then).
        "spark.python.worker.faulthandler.enabled": "true",
        # The progress bar redraws a line with carriage returns: on a terminal it shows
        # progress, in a log file or a pipe it is noise. The JVM writes it to its stderr,
        # which is ours (under spark-submit, ours once submit.py pointed it there).
        "spark.ui.showConsoleProgress": "true" if os.isatty(2) else "false",
        # Option values whose keys match are masked in plans, the UI and the event log.
        # Spark's default matches only "url"; a transform's own reads (JDBC, a Kafka source
        # of its own) may carry a password in their options.
        "spark.sql.redaction.options.regex": "(?i)url|jaas|sasl|password|secret|token",
    }
    if local:
        # One machine: nothing outside it needs to reach the driver, so never bind to an
        # external interface. On a cluster, executors connect back to the driver: its
        # address is Spark's (or spark-submit's, or [spark.conf]'s) to choose.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        defaults.update({"spark.driver.host": "127.0.0.1",
                         "spark.driver.bindAddress": "127.0.0.1"})
        if not conf.get("spark.pyspark.python"):
            # Workers are forked from a daemon that has imported pyarrow, confluent-kafka,
            # psycopg and our formats already (executor/daemon.py; docs/benchmarks.md).
            # Only where the workers run this interpreter, which imports pipeline: a
            # cluster's environment may bring pipeline per task (--py-files), too late for
            # a daemon, so there it is opt-in (docs/cluster.md).
            defaults["spark.python.daemon.module"] = DAEMON_MODULE
    for key, value in PROCESS_ENV.items():
        os.environ.setdefault(key, value)  # the driver JVM and, on one machine, the workers
        defaults[f"spark.executorEnv.{key}"] = os.environ[key]
    # Read by the daemon when it starts (after the JVM, whose environment it inherits).
    os.environ[REGISTRY_ENV] = "1" if schema_registry else "0"
    os.environ[ARROW_ENV] = "1" if arrow else "0"
    for key in (REGISTRY_ENV, ARROW_ENV):
        defaults[f"spark.executorEnv.{key}"] = os.environ[key]
    if jvm == "transform":
        defaults.update(TRANSFORM_PAGE_SIZE)
    if not submitted():
        # The driver JVM's scratch in a directory of this run's, which the next start of
        # Spark removes once the run is gone, killed or not (spark/scratch.py).
        local_dir, options = scratch.spark_settings(
            conf, conf.get("spark.driver.extraJavaOptions", JVM_FLAGS[jvm]),
            scratch.run_scratch(), local)
        defaults.update(local_dir)
        conf["spark.driver.extraJavaOptions"] = options
    for key, value in defaults.items():
        spark_conf.setIfMissing(key, value)
    for key, value in conf.items():
        spark_conf.set(key, value)
    return spark_conf


def get_context(master: str = "local[2]", conf: dict[str, str] | None = None,
                app_name: str = "kafka-offset-pipeline", jvm: str = "light",
                schema_registry: bool = False, arrow: bool = True):
    """Get or create the process's SparkContext, without Spark SQL: the built-in sinks
    only schedule Python tasks, and a SparkSession's SQL state costs ~2 s more to start
    (docs/benchmarks.md). A session created later on this context inherits its conf."""
    from pyspark import SparkContext

    numpy_converter.install()  # before the first JVM call: no pandas on the driver
    sc = SparkContext.getOrCreate(spark_conf(master, conf, app_name, jvm, schema_registry,
                                             arrow))
    sc.setLogLevel("WARN")
    return sc


def _submitted_master() -> str:
    """spark-submit passes its --master to the driver JVM as the spark.master property."""
    from pyspark import SparkConf, SparkContext

    numpy_converter.install()
    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    return SparkConf().get("spark.master", "local")


def check_master_reachable(master: str, timeout: float = 5.0) -> None:
    """A standalone master that does not answer: Spark would retry for a minute and then
    fail with an internal error; say it at once (transient: the cluster may come back)."""
    from pipeline.errors import TransientError

    if not master.startswith("spark://"):
        return
    errors = []
    for hostport in master[len("spark://"):].split(","):  # several masters: HA standby
        host, _, port = hostport.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else e
            errors.append(f"{hostport}: {why}")
    raise TransientError(f"Spark master {master} unreachable ({'; '.join(errors)}); check the "
                         "cluster (scripts/cluster status) and [spark] master, then retry; "
                         "nothing was read")


def submitted() -> bool:
    """True when spark-submit started this driver (it hands Python a gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_active() -> bool:
    """True if this process has started a JVM/SparkSession (tests use it to prove a no-op
    run never does)."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None
