"""The driver's Spark scratch in a directory of the run's own (spark/scratch.py): which
directories a start of Spark removes (runs that are gone) and which it leaves (a live run's,
another host's, anything not ours), and where no directory is handed to Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pipeline.spark import scratch


def gone_pid() -> int:
    """The pid of a process that has exited."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def run_dir(root, host: str, pid: int, start: str, holding: bool = True):
    path = root / f"{host}-{pid}-{start}"
    path.mkdir()
    if holding:
        (path / "blockmgr-1").mkdir()
        (path / "liblz4-java-1.so").write_bytes(b"x")
    return path


def test_the_scratch_of_runs_that_are_gone_is_removed_and_a_live_runs_kept(tmp_path):
    root = scratch.root(str(tmp_path))
    host, me = "h1", os.getpid()
    killed = run_dir(root, host, gone_pid(), "123")
    finished = run_dir(root, host, gone_pid(), "124", holding=False)
    live = run_dir(root, host, me, scratch.process_start(me))
    reused = run_dir(root, host, me, "1")  # our pid, but another process's start time
    elsewhere = run_dir(root, "h2", gone_pid(), "125")  # a /tmp shared with another host
    foreign = root / "notes"
    foreign.mkdir()

    left = scratch.sweep(root, host=host)

    # Only what held anything is named (a finished run's directory is empty).
    assert sorted(left) == sorted([killed.name, reused.name])
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [live.name, elsewhere.name, foreign.name])
    assert finished.exists() is False and (live / "blockmgr-1").is_dir()


def test_a_run_makes_its_directory_after_removing_what_killed_runs_left(tmp_path):
    root = scratch.root(str(tmp_path))
    killed = run_dir(root, scratch._host(), gone_pid(), "7")

    mine = scratch.run_scratch(str(tmp_path))

    assert mine.parent == root and mine.is_dir() and not killed.exists()
    assert mine.name == f"{scratch._host()}-{os.getpid()}-{scratch.process_start(os.getpid())}"
    assert root.name == f"kafka-offset-pipeline-spark-{os.getuid()}"
    assert oct(root.stat().st_mode & 0o777) == "0o700"


def test_spark_is_pointed_at_it_unless_the_user_chose_a_local_dir(tmp_path):
    flags = "-XX:+UseSerialGC"
    assert scratch.spark_settings({}, flags, tmp_path) == (
        {"spark.local.dir": str(tmp_path)}, f"-Djava.io.tmpdir={tmp_path} {flags}")
    # A user's own -Djava.io.tmpdir comes after ours: the JVM takes the last.
    assert scratch.spark_settings({"spark.local.dir": "/data/spark"},
                                  "-Djava.io.tmpdir=/data/tmp", tmp_path) == (
        {}, f"-Djava.io.tmpdir={tmp_path} -Djava.io.tmpdir=/data/tmp")
    assert scratch.spark_settings({}, flags, None) == ({}, flags)
    # A cluster's executors keep their workers' directories; the driver's JVM is ours.
    assert scratch.spark_settings({}, flags, tmp_path, local=False) == (
        {}, f"-Djava.io.tmpdir={tmp_path} {flags}")


def test_no_directory_where_spark_would_split_its_path_or_the_root_is_not_ours(tmp_path):
    spaced = tmp_path / "a b"
    spaced.mkdir()
    assert scratch.root(str(spaced)) is None
    assert scratch.run_scratch(str(spaced)) is None
    # Someone else's file (or a symlink) where our root would be: not used.
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / f"kafka-offset-pipeline-spark-{os.getuid()}").symlink_to(tmp_path)
    assert scratch.root(str(linked)) is None


def test_process_start_tells_a_live_process_from_a_gone_one():
    assert scratch.process_start(os.getpid()) not in (None, "")
    assert scratch.process_start(gone_pid()) is None


def test_a_gone_runs_directory_its_jvm_still_uses_is_left_to_the_jvm(tmp_path):
    # The JVM exits a moment after its run's process and removes its files meanwhile.
    root = scratch.root(str(tmp_path))
    exiting = run_dir(root, "h1", gone_pid(), "9")
    alias, other = tmp_path / "alias", tmp_path / "other"  # TMPDIR spelled other ways
    alias.symlink_to(tmp_path)
    other.symlink_to(tmp_path)
    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                            f"-Djava.io.tmpdir={alias / root.name / exiting.name}"])
    try:
        deadline = time.monotonic() + 10  # until it has exec'd
        while str(exiting) not in scratch.in_use() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str(exiting) in scratch.in_use()
        assert scratch.sweep(other / root.name, host="h1") == [] and exiting.exists()
    finally:
        jvm.kill()
        jvm.wait()
    assert scratch.sweep(root, host="h1") == [exiting.name] and not exiting.exists()
