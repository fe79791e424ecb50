"""Every run's driver JVM starts with the client compiler alone and the serial collector
(issue 25): a transform's per-record work is in Python too since its input is the
built-in read (executor/transform/feed.py), and C2 with the parallel collector cost as much CPU at
2M records and ~245 MB more peak RSS (docs/benchmarks.md)."""

from __future__ import annotations

import os
import tempfile

import pytest

from pipeline.config import parse_settings
from pipeline.spark import launch, session
from pipeline.spark.session import JVM_FLAGS, spark_conf


@pytest.fixture(autouse=True)
def no_running_jvm(monkeypatch, tmp_path):
    """spark_conf's SparkConf() reads the spark.* system properties of a JVM this process
    already runs (another test's SparkContext): these tests are about our defaults alone.
    A class archive would go to a directory of the test's (test_class_archive.py), and so
    does the run's scratch directory (spark/scratch.py: under the temporary directory)."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_jvm", None)
    monkeypatch.setenv("PIPELINE_CLASS_ARCHIVE_DIR", str(tmp_path / "archives"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.mark.parametrize("transform, jvm", [(None, "light"), ("m:f", "transform")])
def test_every_run_starts_its_jvm_with_the_light_flags(monkeypatch, transform, jvm):
    seen = {}
    monkeypatch.setattr(session, "get_context", lambda master, conf, jvm, schema_registry,
                        arrow: seen.update(jvm=jvm, conf=conf, registry=schema_registry,
                                           arrow=arrow))
    settings = parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "database": {"url": "postgresql://h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"},
                 **({"transform": transform} if transform else {})}}, environ={})
    launch.start_spark(settings, 2_000_000)
    # A json run's daemon leaves the schema registry client out, and pyarrow unless a
    # transform's workers read Arrow (executor/daemon.py).
    assert (seen["jvm"], seen["registry"], seen["arrow"]) == (jvm, False, bool(transform))
    for kind in ("light", "transform"):
        assert "-XX:TieredStopAtLevel=1" in JVM_FLAGS[kind]
        assert "-XX:+UseSerialGC" in JVM_FLAGS[kind]
    # the class archive's options come after the run's own flags (spark/class_archive.py)
    options = seen["conf"].get("spark.driver.extraJavaOptions", JVM_FLAGS[jvm])
    assert options.startswith(JVM_FLAGS[jvm])


def test_no_jvm_runs_without_arrows_bounds_and_null_checks(monkeypatch):
    # Arrow Java's checks off would turn a Spark or Arrow bug into a crash of the JVM or
    # silently wrong rows instead of a failed task (spark/arrow_settings.py)
    monkeypatch.setattr(session, "check_master_reachable", lambda master: None)
    for master in ("local[2]", "spark://h:7077"):
        conf = spark_conf(master, {}, jvm="transform")
        options = " ".join(conf.get(key) or "" for key in (
            "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"))
        flags = [o for o in options.split() if not o.startswith("-Djava.io.tmpdir=")]
        assert "arrow" not in " ".join(flags) and flags[:2] == ["-XX:+UseSerialGC",
                                                                "-XX:TieredStopAtLevel=1"]


def test_an_avro_runs_daemon_preimports_the_schema_registry_client(monkeypatch):
    seen = {}
    monkeypatch.setattr(session, "get_context", lambda master, conf, jvm, schema_registry,
                        arrow: seen.update(registry=schema_registry))
    launch.start_spark(parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "database": {"url": "postgresql://h/db"},
        "schema_registry": {"url": "http://r:8081"},
        "sink": {"format": "avro", "table": "t", "columns": {"id": "long"}}}, environ={}))
    assert seen == {"registry": True}


def test_the_chosen_flags_reach_the_driver_jvm_unless_the_user_set_their_own(tmp_path):
    flags = spark_conf("local[2]", {}, jvm="light").get("spark.driver.extraJavaOptions")
    scratch, rest = flags.split(" ", 1)  # the run's scratch directory first
    assert scratch.startswith(f"-Djava.io.tmpdir={tmp_path}/") and rest == JVM_FLAGS["light"]
    mine = {"spark.driver.extraJavaOptions": "-Xmx1g"}
    assert spark_conf("local[2]", mine, jvm="light").get(
        "spark.driver.extraJavaOptions") == f"{scratch} -Xmx1g"


def test_the_light_jvm_starts_with_a_small_heap():
    # the ergonomic initial heap is 1/64 of the machine's RAM (~380 MB on 24 GB), all of it
    # touched before the first collection; the heap grows from 32 MB as the run needs
    assert "-Xms32m" in JVM_FLAGS["light"].split()


def test_the_allocator_settings_go_to_the_jvm_and_the_executors(monkeypatch):
    for key in session.PROCESS_ENV:
        monkeypatch.delenv(key, raising=False)
    conf = spark_conf("local[2]", {}, jvm="light")
    assert conf.get("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL") == "system"
    assert conf.get("spark.executorEnv.MALLOC_ARENA_MAX") == "2"
    assert os.environ["MALLOC_ARENA_MAX"] == "2"  # the driver JVM inherits it
    # a user's own value wins, from the environment or from [spark.conf]
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    mine = {"spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}
    conf = spark_conf("local[2]", mine, jvm="light")
    assert conf.get("spark.executorEnv.MALLOC_ARENA_MAX") == "4"
    assert conf.get("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL") == "jemalloc"


def test_a_transforms_run_takes_small_memory_pages_unless_the_user_set_them(monkeypatch):
    """A hash table takes a whole Tungsten page for its first row: Spark's own size (8 MB
    for local[2]) kept the example's 90-customer broadcast join 8 MB of live heap and one
    more full collection (git history of docs/benchmarks.md)."""
    monkeypatch.setattr(session, "check_master_reachable", lambda master: None)
    key = "spark.buffer.pageSize"
    assert spark_conf("local[2]", {}, jvm="transform").get(key) == "1m"
    assert spark_conf("spark://h:7077", {}, jvm="transform").get(key) == "1m"
    assert spark_conf("local[2]", {}, jvm="light").get(key) is None  # no Tungsten pages
    assert spark_conf("local[2]", {key: "4m"}, jvm="transform").get(key) == "4m"
