"""The driver JVM's class-data-sharing archive (spark/class_archive.py): what it is keyed
by, which file is used, how a dump is put in place, and when a run uses none."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipeline.config import parse_settings
from pipeline.spark import class_archive as ca
from pipeline.spark import launch


def fake_jdk(root: Path, version: str = "17.0.15") -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "java").write_text("#!/bin/sh\n")
    (root / "bin" / "java").chmod(0o755)
    (root / "lib" / "server").mkdir(parents=True)
    (root / "lib" / "server" / "libjvm.so").write_bytes(b"jvm")
    (root / "release").write_text(f'IMPLEMENTOR="Test"\nJAVA_VERSION="{version}"\n')
    return root


def fake_spark(root: Path) -> Path:
    (root / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (root / "jars" / name).write_bytes(b"x")
    return root


@pytest.mark.parametrize("release, feature", [
    ('JAVA_VERSION="17.0.15"', 17), ('JAVA_VERSION="21"', 21),
    ('JAVA_VERSION="1.8.0_402"', 8), ('JAVA_VERSION="11.0.2"', 11), ("", 0)])
def test_the_jdk_feature_version_comes_from_its_release_file(release, feature):
    assert ca.java_feature(f'IMPLEMENTOR="x"\n{release}\n') == feature


def test_the_key_changes_with_the_jdk_the_classpath_the_flags_and_the_kind_of_run(tmp_path):
    jdk, spark = fake_jdk(tmp_path / "jdk"), fake_spark(tmp_path / "spark")

    def key(sql=False, flags="-Xms32m", extra=""):
        return ca.archive_key(ca.key_parts(jdk, spark, "4.0.0", flags, sql, extra))

    first = key()
    assert key() == first and len(first) == 20
    assert key(sql=True) != first
    assert key(flags="-Xms64m") != first
    assert key(extra="/opt/x.jar") != first
    assert ca.archive_key(ca.key_parts(jdk, spark, "4.0.1", "-Xms32m", False, "")) != first
    (spark / "jars" / "spark-core.jar").write_bytes(b"xy")  # a jar replaced
    assert key() != first
    second = key()
    (spark / "jars" / "extra.jar").write_bytes(b"x")  # a jar added
    assert key() != second
    third = key()
    (jdk / "release").write_text('JAVA_VERSION="17.0.16"\n')  # the JDK upgraded
    assert key() != third


def test_only_an_archive_of_the_size_in_its_name_is_used(tmp_path):
    key, other = "a" * 20, "b" * 20
    assert ca.usable_archive(tmp_path / "missing", key) is None
    (tmp_path / ca.archive_name(key, 10)).write_bytes(b"x" * 9)  # truncated
    (tmp_path / ca.archive_name(other, 5)).write_bytes(b"x" * 5)  # another key
    (tmp_path / f"{key}.123.tmp").write_bytes(b"x" * 7)  # a dump not finished
    assert ca.usable_archive(tmp_path, key) is None
    good = tmp_path / ca.archive_name(key, 4)
    good.write_bytes(b"x" * 4)
    assert ca.usable_archive(tmp_path, key) == good


def test_an_archive_is_mapped_verified_and_silent_and_a_dump_silent():
    use = ca.jvm_options(Path("/c/k-1.jsa"), None).split()
    assert use[:2] == ["-XX:SharedArchiveFile=/c/k-1.jsa", "-XX:+VerifySharedSpaces"]
    assert "-Xlog:cds=off" in use and "-Xlog:cds+dynamic=off" in use
    dump = ca.jvm_options(None, Path("/c/k.1.tmp")).split()
    assert dump[0] == "-XX:ArchiveClassesAtExit=/c/k.1.tmp"
    assert "-Xlog:cds=off" in dump and "-Xlog:cds+dynamic=off" in dump


def test_the_cache_is_the_users_never_the_package(tmp_path):
    home = os.path.expanduser("~")
    assert ca.cache_dir({}) == Path(home, ".cache", "kafka-pg-pipeline", "jvm-class-archives")
    assert ca.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path(
        "/x/kafka-pg-pipeline/jvm-class-archives")
    assert ca.cache_dir({"XDG_CACHE_HOME": "/x", "PIPELINE_CLASS_ARCHIVE_DIR": "/y"}) == Path("/y")


def test_a_run_without_an_archive_writes_one_and_the_next_uses_it(tmp_path):
    env = {"JAVA_HOME": str(fake_jdk(tmp_path / "jdk")),
           "PIPELINE_CLASS_ARCHIVE_DIR": str(tmp_path / "cache")}
    first = ca.plan(env, "-Xms32m", sql=False)
    assert first.dump is not None and first.dump.parent == tmp_path / "cache"
    assert first.options.startswith(f"-XX:ArchiveClassesAtExit={first.dump}")
    # the JVM writes the dump as it exits on its stdin's end: a process that does the same
    proc = subprocess.Popen(["sh", "-c", f"cat >/dev/null; printf 12345 > {first.dump}"],
                            stdin=subprocess.PIPE)
    final = ca.finish_dump(first, proc)
    assert final == tmp_path / "cache" / ca.archive_name(first.key, 5)
    assert final.read_bytes() == b"12345" and not first.dump.exists()
    second = ca.plan(env, "-Xms32m", sql=False)
    assert second.dump is None and f"-XX:SharedArchiveFile={final}" in second.options
    # a SQL run's classes are another archive
    assert ca.plan(env, "-Xms32m", sql=True).dump is not None


def test_a_dump_of_a_jvm_that_failed_is_dropped_and_not_retried_within_the_hour(tmp_path):
    env = {"JAVA_HOME": str(fake_jdk(tmp_path / "jdk")),
           "PIPELINE_CLASS_ARCHIVE_DIR": str(tmp_path / "cache")}
    plan = ca.plan(env, "-Xms32m", sql=False, now=1_000_000.0)
    proc = subprocess.Popen(["sh", "-c", f"cat >/dev/null; printf 12 > {plan.dump}; exit 134"],
                            stdin=subprocess.PIPE)
    assert ca.finish_dump(plan, proc) is None
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{plan.key}.dumping"]
    marker = tmp_path / "cache" / f"{plan.key}.dumping"
    os.utime(marker, (1_000_000.0,) * 2)
    # each dump costs its run ~20-25 CPU-s: the runs of the next hour start without one
    assert ca.plan(env, "-Xms32m", sql=False, now=1_000_000.0 + ca.STALE_SECONDS) is None
    again = ca.plan(env, "-Xms32m", sql=False, now=1_000_001.0 + ca.STALE_SECONDS)
    assert again is not None and again.dump is not None


def test_one_run_at_a_time_writes_an_archive(tmp_path):
    env = {"JAVA_HOME": str(fake_jdk(tmp_path / "jdk")),
           "PIPELINE_CLASS_ARCHIVE_DIR": str(tmp_path / "cache")}
    assert ca.plan(env, "-Xms32m", sql=False).dump is not None
    assert ca.plan(env, "-Xms32m", sql=False) is None  # the first is still writing it


@pytest.mark.parametrize("name", ["John Doe", "it's", 'a"b', "a\\b"])
def test_no_archive_in_a_directory_whose_name_spark_would_split_or_unquote(tmp_path, name):
    env = {"JAVA_HOME": str(fake_jdk(tmp_path / "jdk")),
           "PIPELINE_CLASS_ARCHIVE_DIR": str(tmp_path / name / "cache")}
    assert ca.plan(env, "-Xms32m", sql=False) is None
    env["PIPELINE_CLASS_ARCHIVE_DIR"] = str(tmp_path / "plain" / "cache")
    assert ca.plan(env, "-Xms32m", sql=False) is not None


def test_no_archive_before_jdk_17_or_without_a_jdk(tmp_path):
    env = {"JAVA_HOME": str(fake_jdk(tmp_path / "jdk", "11.0.2")),
           "PIPELINE_CLASS_ARCHIVE_DIR": str(tmp_path / "cache")}
    assert ca.plan(env, "-Xms32m", sql=False) is None
    assert ca.plan({"JAVA_HOME": str(tmp_path / "none"), "PATH": ""}, "", sql=False) is None


def test_prune_drops_stale_dumps_and_all_but_the_newest_archives(tmp_path):
    now = 1_000_000.0
    for i in range(ca.KEEP + 2):
        path = tmp_path / ca.archive_name(f"{i:020d}", 1)
        path.write_bytes(b"x")
        os.utime(path, (now - 100 + i, now - 100 + i))
    stale, fresh = tmp_path / "k.1.tmp", tmp_path / "k.2.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (now - ca.STALE_SECONDS - 1,) * 2)
    os.utime(fresh, (now - 10,) * 2)
    ca.prune(tmp_path, now)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([ca.archive_name(f"{i:020d}", 1) for i in range(2, ca.KEEP + 2)]
                          + ["k.2.tmp"])


def settings(spark: dict | None = None):
    return parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "database": {"url": "postgresql://h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"}},
        **({"spark": spark} if spark is not None else {})}, environ={})


@pytest.fixture
def jdk_env(tmp_path, monkeypatch):
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_active_spark_context", None)  # no JVM up yet
    monkeypatch.delenv("PIPELINE_SPARK_MASTER", raising=False)
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(tmp_path / "jdk")))
    monkeypatch.setenv("PIPELINE_CLASS_ARCHIVE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("spark, used", [
    (None, True), ({"master": "local[4]"}, True),
    ({"class_archive": False}, False),
    ({"master": "spark://h:7077"}, False),
    ({"conf": {"spark.driver.extraJavaOptions": "-Xmx1g"}}, False)])
def test_only_a_local_driver_jvm_with_our_flags_gets_an_archive(jdk_env, spark, used):
    assert (launch.driver_archive(settings(spark), sql=False) is not None) is used


def test_the_switch_is_also_an_environment_variable(jdk_env):
    off = parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "database": {"url": "postgresql://h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"}}},
        environ={"PIPELINE__SPARK__CLASS_ARCHIVE": "false"})
    assert launch.driver_archive(off, sql=False) is None


def test_no_archive_for_a_jvm_that_is_up_already(jdk_env, monkeypatch):
    from pipeline.spark import session

    monkeypatch.setattr(session, "spark_active", lambda: True)
    assert launch.driver_archive(settings(), sql=False) is None


def test_a_first_run_starts_without_dump_options_and_leaves_the_dump_to_after_its_exit(
        jdk_env, monkeypatch, tmp_path):
    # Writing an archive costs its JVM ~20-25 CPU-s and up to minutes at exit: never the
    # run's; the run's exit only starts the detached process that writes it (spawn_dump).
    from pipeline.spark import session
    from pipeline.spark.session import JVM_FLAGS

    started, at_exit = [], []
    monkeypatch.setattr(session, "get_context", lambda master, conf, jvm, schema_registry,
                        arrow: started.append(conf.get("spark.driver.extraJavaOptions"))
                        or object())
    monkeypatch.setattr(launch.atexit, "register", lambda f, *args: at_exit.append(
        (f.__name__, args)))
    base = settings()
    transform = parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"]},
        "database": {"url": "postgresql://h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"},
                 "transform": "m:f"}}, environ={})
    launch.start_spark(transform)
    launch.start_spark(base)
    assert started == [None, None]  # the pipeline's own flags (spark_conf), nothing to dump
    dumps = [args for name, args in at_exit if name == "spawn_dump"]
    assert [(a[3], a[4], a[0].dump is not None) for a in dumps] == [
        ("transform", True, True), ("light", False, True)]
    # once written (by the dumping process), the next run of the kind maps it
    plan = dumps[1][0]
    (plan.directory / ca.archive_name(plan.key, 4)).write_bytes(b"x" * 4)
    launch.start_spark(base)
    assert started[2].startswith(JVM_FLAGS["light"] + " -XX:SharedArchiveFile=")


def test_a_dump_that_fails_drops_its_temporary_file_and_keeps_the_claim(tmp_path, monkeypatch):
    from pipeline.spark import session

    env = {"JAVA_HOME": str(fake_jdk(tmp_path / "jdk")),
           "PIPELINE_CLASS_ARCHIVE_DIR": str(tmp_path / "cache")}
    plan = ca.plan(env, "-Xms32m", sql=False)
    plan.dump.write_bytes(b"part")

    def no_jvm(*args, **kwargs):
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(session, "get_context", no_jvm)
    spec = {"master": "local[1]", "conf": {}, "jvm": "light", "sql": False,
            "parent": -1,  # gone already: no wait
            "directory": str(plan.directory), "key": plan.key, "dump": str(plan.dump)}
    assert ca.dump_main(spec) is None
    # the next try is STALE_SECONDS later (plan's claim), not at every run
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{plan.key}.dumping"]
