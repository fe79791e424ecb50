"""Crashes, signals and unavailable services against the real CLI: whatever happens and
whenever, a rerun ends with every record exactly once and the offsets at the planned ends.

Each CLI run costs a JVM start (~15-25 s), so a failed run is always the real CLI (exit
codes, the one error line, SIGKILL of the whole process tree), and the rerun that must
repair everything is in-process on the shared SparkSession.

Services are only ever taken down in a private second stack (scripts/stack with its own
STACK_DIR and ports), never the shared one.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipeline import faults
from pipeline.driver.job import run_ingest
from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    create_topic,
    make_settings,
    produce,
    produce_orders,
    query,
    run_cli,
    toml_config,
    unique,
)
from tests.integration._reliability import (
    PrivateStack,
    assert_exactly_once,
    assert_nothing_committed,
    end_offsets,
    finish,
    held_publish_backend,
    init_db,
    one_error_line,
    processes_of_run,
    runs,
    staging_copy_active,
    staging_tables,
    start_cli,
    stored,
    wait_for,
    wait_for_processes_gone,
)

BAD = [b"{not json", b'{"order_id": "seven", "customer": "c1"}', b'{"amount": 3.5}', None]


def is_good(record: tuple) -> bool:
    key = record[0]
    return not (key or b"").startswith(b"bad")


def new_pipeline(tmp_path, prefix: str, *, bootstrap: str = BOOTSTRAP,
                 db_url: str = TEST_DB_URL, orders: int = 900, partitions: int = 3,
                 extra_kafka: str = "", extra_toml: str = "", kafka_timeout: int = 10):
    """A topic with orders (> 100 per partition, so the during_read point fires in every
    task) and a few bad records, an initialised pipeline, and its config file."""
    name = unique(prefix)
    topic = create_topic(name, partitions, bootstrap=bootstrap)
    produce_orders(topic, range(orders), bootstrap=bootstrap)
    produce(topic, [(f"bad-{i}".encode(), v) for i, v in enumerate(BAD)], bootstrap=bootstrap)
    settings = init_db(make_settings(name, [topic], bootstrap=bootstrap, db_url=db_url))
    config = tmp_path / f"{name}.toml"
    text = toml_config(name, [topic], bootstrap=bootstrap, db_url=db_url,
                       extra_kafka=extra_kafka) + extra_toml
    config.write_text(text.replace("timeout_seconds = 10", f"timeout_seconds = {kafka_timeout}"))
    return settings, topic, str(config)


def cli_env(settings, fault: str | None = None) -> dict:
    """The environment overrides win over the config: pin them to this test's services."""
    env = {"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
           "PIPELINE__DATABASE__URL": settings.database_url}
    if fault:
        env["PIPELINE_FAULT"] = fault
    return env


def rerun_is_exact(settings, topic: str) -> None:
    result = run_ingest(settings)
    assert result.status == "succeeded", result
    assert_exactly_once(settings, topic, good=is_good, bad=True)


# ---- 1. SIGKILL of the whole process tree at every named point -------------------------------
# Right after the kill: what is committed, whether the run's staging tables are left behind
# (evidence of where it died); and the run statuses after the rerun.
AFTER_KILL = {
    "after_plan": ("nothing", False, ["succeeded"]),  # killed before its run row existed
    "during_read": ("nothing", True, ["abandoned", "succeeded"]),
    "after_task_commit": ("nothing", True, ["abandoned", "succeeded"]),
    "after_stage": ("nothing", True, ["abandoned", "succeeded"]),
    "before_commit": ("nothing", True, ["abandoned", "succeeded"]),  # the DROP rolled back
    "after_commit": ("everything", False, ["succeeded", "succeeded"]),
}


def run_killed_at(point: str, settings, topic: str, config: str) -> tuple:
    """A CLI run SIGKILLed at fault ``point``: what it leaves must be AFTER_KILL[point]
    (nothing, or everything up to the planned ends, exactly once). Returns the run
    statuses expected after the rerun."""
    planned_ends = end_offsets(topic, BOOTSTRAP)
    proc = start_cli("run", "--config", config, env=cli_env(settings, f"{point}:kill"))
    code, _, err = finish(proc)

    assert code == -signal.SIGKILL, err[-3000:]
    # The JVM, Spark's Python daemon and its workers died with the driver.
    wait_for_processes_gone(proc.pid)
    held, staging_left, statuses = AFTER_KILL[point]
    assert bool(staging_tables(settings.name, settings.database_url)) == staging_left
    if held == "nothing":
        assert_nothing_committed(settings)
    else:
        assert stored(settings.name, settings.database_url) == planned_ends
        assert_exactly_once(settings, topic, good=is_good, bad=True)
    return statuses


def test_every_fault_point_is_covered():
    assert set(AFTER_KILL) == set(faults.POINTS)


@pytest.mark.parametrize("point", faults.POINTS)
def test_sigkill_at_each_point_then_rerun_loses_and_duplicates_nothing(spark, tmp_path, point):
    settings, topic, config = new_pipeline(tmp_path, f"kill_{point}")
    statuses = run_killed_at(point, settings, topic, config)

    produce_orders(topic, range(900, 960))  # new records between the crash and the rerun
    rerun_is_exact(settings, topic)
    assert [r[1] for r in runs(settings.name, settings.database_url)] == statuses


def test_a_killed_runs_spark_scratch_is_removed_by_the_next_run(spark, tmp_path):
    # A scheduler's timeout or the OOM killer leaves no JVM to remove its scratch: each run
    # keeps it in a directory of its own, and the next start of Spark removes it
    # (spark/scratch.py), instead of /tmp gaining four entries a killed run.
    settings, topic, config = new_pipeline(tmp_path, "kill_scratch")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start_cli("run", "--config", config,
                     env={**cli_env(settings, "during_read:kill"), "TMPDIR": str(tmp)})
    code, _, err = finish(proc)
    assert code == -signal.SIGKILL, err[-3000:]
    wait_for_processes_gone(proc.pid)
    [root] = tmp.iterdir()
    [killed] = root.iterdir()
    assert killed.name.split("-")[-2] == str(proc.pid)
    assert {p.name.split("-")[0] for p in killed.iterdir()} >= {"blockmgr", "spark"}

    rerun = run_cli("run", "--config", config, env={**cli_env(settings), "TMPDIR": str(tmp)})

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (f"removed the Spark scratch 1 killed run(s) left in {root}: {killed.name}"
            in rerun.stderr)
    assert not killed.exists()
    # The rerun's own directory is all that is left, emptied by Spark as its JVM exited
    # (the run after it removes the directory itself).
    wait_for(lambda: [list(p.iterdir()) for p in root.iterdir()] == [[]], 60,
             "the rerun's JVM to empty its scratch")
    assert [p for p in tmp.iterdir()] == [root]
    assert_exactly_once(settings, topic, good=is_good, bad=True)


# ---- 3. SIGTERM ----------------------------------------------------------------------------------
@pytest.mark.spark_line
def test_sigterm_while_spark_stages_cancels_the_jobs_rolls_back_and_exits_143(spark, tmp_path):
    settings, topic, config = new_pipeline(tmp_path, "term_read")
    # Every task sleeps a minute after 100 rows, inside its COPY into the staging table.
    proc = start_cli("run", "--config", config, env=cli_env(settings, "during_read:sleep=60"))
    wait_for(lambda: staging_copy_active(settings), 120, "the staging COPY", proc)

    os.kill(proc.pid, signal.SIGTERM)  # the driver only, as a scheduler's stop would
    sent = time.monotonic()
    code, _, err = finish(proc, timeout=60)

    assert code == 143, err[-3000:]
    assert one_error_line(err) == (
        "error: stopped by SIGTERM; nothing committed by this run, safe to rerun")
    assert "SIGTERM received: cancelling Spark jobs and rolling back" in err
    # Dropping the staging tables waits for the executors' COPY transactions: had the Spark
    # jobs not been cancelled, the run could not end before the tasks' 60 s sleep.
    assert time.monotonic() - sent < 30
    # The JVM and Spark's Python daemon wind down after the driver exits: on a slow machine
    # with the suite beside it (the 3.5 pass in CI), 60 s were once not enough.
    wait_for_processes_gone(proc.pid, timeout=120)
    assert_nothing_committed(settings)
    [(_, status, exit_code, error)] = runs(settings.name, settings.database_url)
    assert (status, exit_code) == ("failed", 143), error
    assert staging_tables(settings.name, settings.database_url) == []

    rerun_is_exact(settings, topic)


def test_sigterm_during_the_publishing_transaction_lets_the_commit_finish(spark, tmp_path):
    settings, topic, config = new_pipeline(tmp_path, "term_pub")
    planned_ends = end_offsets(topic, BOOTSTRAP)
    proc = start_cli("run", "--config", config, env=cli_env(settings, "before_commit:sleep=5"))
    wait_for(lambda: held_publish_backend(settings), 120, "the held publishing transaction",
             proc)

    os.kill(proc.pid, signal.SIGTERM)
    code, _, err = finish(proc, timeout=60)

    assert code == 143, err[-3000:]
    assert "SIGTERM received during the publishing transaction: letting it finish" in err
    assert one_error_line(err) == (
        "error: stopped by SIGTERM after the publishing transaction finished")
    # Committed, exactly once; a rerun has nothing to do.
    assert stored(settings.name, settings.database_url) == planned_ends
    assert_exactly_once(settings, topic, good=is_good, bad=True)
    [(_, status, exit_code, _)] = runs(settings.name, settings.database_url)
    assert (status, exit_code) == ("succeeded", 0)
    assert run_ingest(settings).status == "noop"
    assert_exactly_once(settings, topic, good=is_good, bad=True)


def test_the_driver_jvm_killed_while_spark_reads_exits_75_and_commits_nothing(spark, tmp_path):
    # The kernel's OOM killer (or an operator) kills the driver's JVM, not the driver: py4j's
    # call fails with the connection, which was exit 1 "internal error (Py4JNetworkError)".
    settings, topic, config = new_pipeline(tmp_path, "jvm_kill")
    proc = start_cli("run", "--config", config, env=cli_env(settings, "during_read:sleep=60"))
    wait_for(lambda: staging_copy_active(settings), 120, "the staging COPY", proc)
    [jvm] = [int(p.split()[0]) for p in processes_of_run(proc.pid) if "java" in p]

    os.kill(jvm, signal.SIGKILL)
    code, _, err = finish(proc, timeout=120)

    line = assert_transient(code, err, "the driver's JVM died while the run read")
    assert f"{topic}[" in line and "spark.driver.memory" in line, line
    assert_nothing_committed(settings)
    [(_, status, exit_code, _)] = runs(settings.name, settings.database_url)
    assert (status, exit_code) == ("failed", 75)
    rerun_is_exact(settings, topic)


# ---- 4. services down, on a private second stack ---------------------------------------------
@pytest.fixture(scope="module")
def stack2(stack):
    s2 = PrivateStack()
    try:
        yield s2.up()
    finally:
        s2.destroy()


@pytest.fixture
def service_down(stack2):
    """Stops a service of the private stack; always brings it back after the test."""
    stopped = []

    def down(service: str) -> None:
        stack2.stack(f"{service}-down")
        stopped.append(service)

    yield down
    for service in stopped:
        stack2.stack(f"{service}-up")


def assert_transient(code: int, err: str, names: str) -> str:
    assert code == 75, err[-3000:]
    line = one_error_line(err)
    assert names in line, line
    return line


def test_broker_down_at_start_exits_75_and_the_next_run_succeeds(spark, stack2, service_down,
                                                                tmp_path):
    settings, topic, config = new_pipeline(tmp_path, "s2_kdown", bootstrap=stack2.bootstrap,
                                           db_url=stack2.db_url,
                                           kafka_timeout=5)
    service_down("kafka")

    r = run_cli("run", "--config", config, env=cli_env(settings), timeout=120)

    line = assert_transient(r.returncode, r.stderr, f"Kafka unreachable at {stack2.bootstrap}")
    assert "retry" in line
    assert_nothing_committed(settings)
    assert runs(settings.name, settings.database_url) == []  # failed while planning

    stack2.stack("kafka-up")
    rerun_is_exact(settings, topic)


def test_postgres_down_at_start_exits_75_and_the_next_run_succeeds(spark, stack2, service_down,
                                                                  tmp_path):
    settings, topic, config = new_pipeline(tmp_path, "s2_pdown", bootstrap=stack2.bootstrap,
                                           db_url=stack2.db_url)
    service_down("pg")

    r = run_cli("run", "--config", config, env=cli_env(settings), timeout=120)

    assert_transient(r.returncode, r.stderr,
                     f"Postgres unreachable at {stack2.db_url}")
    stack2.stack("pg-up")
    assert_nothing_committed(settings)
    rerun_is_exact(settings, topic)


def test_broker_down_while_spark_reads_exits_75_and_commits_nothing(spark, stack2, service_down,
                                                                   tmp_path):
    # Small fetches and almost no prefetch (2 KB at a time), so that most of the range is
    # still in Kafka when the broker stops; the reader gives up after timeout_seconds.
    settings, topic, config = new_pipeline(
        tmp_path, "s2_kmid", bootstrap=stack2.bootstrap, db_url=stack2.db_url, orders=15000,
        extra_kafka='[kafka.admin_client]\n"max.partition.fetch.bytes" = "2048"\n'
                    '"queued.min.messages" = "1"\n"queued.max.messages.kbytes" = "1"\n'
                    # ...and no refetch for a second (the reader's default is 10 ms): with
                    # it, librdkafka prefetched whole partitions during the task's sleep, the
                    # read ended before the broker stopped and the run failed later, at the
                    # topic-ID check (exit 75 too, but not the error this test is about).
                    '"fetch.queue.backoff.ms" = "1000"\n',
        extra_toml='[spark.conf]\n"spark.network.timeout" = "10s"\n'
                   '"spark.network.timeoutInterval" = "5s"\n'
                   '"spark.executor.heartbeatInterval" = "2s"\n')
    proc = start_cli("run", "--config", config, env=cli_env(settings, "during_read:sleep=6"))
    wait_for(lambda: staging_copy_active(settings), 120, "the staging COPY", proc)
    # The broker dies (SIGKILL) while every task sleeps after its first 100 rows. A clean
    # stop waits up to 30 s for the broker's shutdown, and under CI load the tasks woke and
    # read on meanwhile: the run then failed later, at the post-read metadata check (exit 75
    # too, but not the error this test is about).
    os.kill(int((stack2.dir / "kafka" / "kafka.pid").read_text()), signal.SIGKILL)
    service_down("kafka")  # it is gone already: forgets its pid, restarts it after the test

    code, _, err = finish(proc, timeout=240)

    line = assert_transient(code, err, f"Kafka unreachable at {stack2.bootstrap} while Spark read")
    # Which range, and where the broker's absence showed: a task reading when it stopped
    # (no progress at an offset), or one that started after it (its group lookup, before
    # it takes any record); which one comes first depends on the tasks' timing.
    assert f"{topic}[" in line, line
    assert ("no progress at offset" in line
            or "no answer looking up the consumer group" in line), line
    assert_nothing_committed(settings)
    [(_, status, exit_code, _)] = runs(settings.name, settings.database_url)
    assert (status, exit_code) == ("failed", 75)

    stack2.stack("kafka-up")
    rerun_is_exact(settings, topic)


@pytest.mark.parametrize("how", ["postgres stopped", "pg_terminate_backend"])
def test_connection_lost_inside_the_publishing_transaction_commits_nothing(
        spark, stack2, service_down, tmp_path, how):
    settings, topic, config = new_pipeline(tmp_path, "s2_pub", bootstrap=stack2.bootstrap,
                                           db_url=stack2.db_url)
    proc = start_cli("run", "--config", config, env=cli_env(settings, "before_commit:sleep=6"))
    backend = wait_for(lambda: held_publish_backend(settings), 120,
                       "the held publishing transaction", proc)

    if how == "postgres stopped":
        service_down("pg")
    else:
        [(killed,)] = query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = 'kafka-offset-pipeline' AND pid = %s",
                            (backend,), db_url=stack2.db_url)
        assert killed
    code, _, err = finish(proc, timeout=120)

    assert_transient(code, err, f"Postgres unreachable at {stack2.db_url}")
    if how == "postgres stopped":
        stack2.stack("pg-up")
    assert_nothing_committed(settings)
    # The run could not record its own failure: the connection was gone. The next run marks
    # it abandoned and drops its staging tables.
    assert [r[1] for r in runs(settings.name, settings.database_url)] == ["running"]
    rerun_is_exact(settings, topic)
    assert [r[1] for r in runs(settings.name, settings.database_url)] == [
        "abandoned", "succeeded"]


# ---- 5. a Python worker that dies --------------------------------------------------------------
def test_a_crashed_python_worker_is_one_trimmed_error_and_commits_nothing(spark, tmp_path):
    settings, topic, config = new_pipeline(tmp_path, "crash", orders=300, partitions=1)

    r = run_cli("run", "--config", config, env=cli_env(settings, "during_read:crash"))

    assert r.returncode == 1, r.stderr[-3000:]
    line = one_error_line(r.stderr)
    assert line.startswith(f"error: a Spark Python worker died while the run read {topic}[0] "
                           "[0, 304) (crashed: Fatal Python error: Segmentation fault)"), line
    assert "internal error" not in line and "Py4J" not in line
    [(_, status, code, error)] = runs(settings.name, settings.database_url)
    assert (status, code) == ("failed", 1)
    assert error == line.removeprefix("error: ") and len(error) < 700
    assert_nothing_committed(settings)
    rerun_is_exact(settings, topic)


# ---- 6. a table lock held by someone else ------------------------------------------------------
def test_a_table_lock_held_elsewhere_fails_the_publish_after_lock_timeout(spark, tmp_path):
    from dataclasses import replace

    import psycopg

    from pipeline.errors import TransientError

    settings, topic, _ = new_pipeline(tmp_path, "locked", orders=200, partitions=1)
    settings = replace(settings, lock_timeout_seconds=1)
    with psycopg.connect(settings.database_url) as dba:  # e.g. a long ALTER TABLE
        dba.execute(f"LOCK TABLE {settings.sink.table} IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(TransientError) as e:
            run_ingest(settings)  # without lock_timeout: waits as long as the DBA does
        dba.rollback()

    assert e.value.exit_code == 75
    assert "canceling statement due to lock timeout" in e.value.message
    assert "database.lock_timeout_seconds" in e.value.message
    assert_nothing_committed(settings)
    rerun_is_exact(settings, topic)


def test_a_deadlock_postgres_reports_is_named_a_deadlock_and_transient(stack):
    """Two sessions waiting for each other: Postgres ends one (SQLSTATE 40P01). That is no
    run publishing the same offsets first: it is named as what it is, exit 75."""
    import threading

    import psycopg

    from pipeline.errors import EXIT_TRANSIENT, ConflictError
    from pipeline.store.database import sort_error

    caught: list[BaseException] = []
    first, second = (psycopg.connect(TEST_DB_URL) for _ in range(2))
    try:
        first.execute("SELECT pg_advisory_xact_lock(7400099, 1)")
        second.execute("SELECT pg_advisory_xact_lock(7400099, 2)")

        def cross(conn, key: int) -> None:
            try:
                conn.execute("SELECT pg_advisory_xact_lock(7400099, %s)", (key,))
            except psycopg.errors.DeadlockDetected as e:
                caught.append(e)
                conn.rollback()  # frees the other

        threads = [threading.Thread(target=cross, args=a) for a in ((first, 2), (second, 1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        first.close()
        second.close()

    [deadlock] = caught
    error = sort_error(TEST_DB_URL, deadlock)
    assert error.exit_code == EXIT_TRANSIENT and not isinstance(error, ConflictError)
    assert "deadlock" in error.message and "published rows" not in error.message
