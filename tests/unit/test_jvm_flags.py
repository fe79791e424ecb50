"""Every run's driver JVM starts with the client compiler alone and the serial collector
(issue 25): a transform's per-record work is in Python too since its input is the
built-in read (executor/feed.py), and C2 with the parallel collector cost as much CPU at
2M records and ~245 MB more peak RSS (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from pipeline.config import parse_settings
from pipeline.spark import launch, session
from pipeline.spark.session import JVM_FLAGS, spark_conf


@pytest.mark.parametrize("transform", [None, "m:f"])
def test_every_run_starts_its_jvm_with_the_light_flags(monkeypatch, transform):
    seen = {}
    monkeypatch.setattr(session, "get_context", lambda master, conf, jvm: seen.update(jvm=jvm))
    settings = parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "database": {"url": "postgresql://h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"},
                 **({"transform": transform} if transform else {})}}, environ={})
    launch.start_spark(settings, 2_000_000)
    assert seen == {"jvm": "light"}
    assert "-XX:TieredStopAtLevel=1" in JVM_FLAGS["light"]
    assert "-XX:+UseSerialGC" in JVM_FLAGS["light"]


def test_the_chosen_flags_reach_the_driver_jvm_unless_the_user_set_their_own():
    flags = spark_conf("local[2]", {}, jvm="light").get("spark.driver.extraJavaOptions")
    assert flags == JVM_FLAGS["light"]
    mine = {"spark.driver.extraJavaOptions": "-Xmx1g"}
    assert spark_conf("local[2]", mine, jvm="light").get(
        "spark.driver.extraJavaOptions") == "-Xmx1g"
