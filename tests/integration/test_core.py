"""The core run against the real stack: exact ranges in, exact rows and offsets out, one
transaction, never twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from decimal import Decimal

import psycopg
import pytest
from confluent_kafka import Producer
from sqlalchemy.engine import make_url

from pipeline.driver.job import execute_ranges, run_ingest
from pipeline.driver.kafka_meta import KafkaMeta
from pipeline.driver.report import Timer
from pipeline.driver.routing import resolve_routes
from pipeline.errors import ConflictError, DataError
from pipeline.plan.offsets import plan_ranges
from pipeline.store import Store
from pipeline.store.run import staging_table
from tests.helpers import (
    BOOTSTRAP,
    ROOT,
    TEST_DB_NAME,
    TEST_DB_URL,
    cli_here,
    create_topic,
    init_cli,
    init_db,
    make_settings,
    produce,
    produce_orders,
    query,
    result_keys,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)


def cli_pipeline(tmp_path, prefix: str, records: int, partitions: int = 2) -> tuple[str, str, str]:
    """A topic with `records` orders and an initialised pipeline config for the real CLI."""
    topic = create_topic(unique(prefix), partitions)
    if records:
        produce_orders(topic, range(records))
    name = unique(prefix)
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic]))
    init_cli(config)
    return topic, name, str(config)


def spark_submit(config: str, *args: str, master: str = "local[2]") -> tuple[list, dict]:
    """The spark-submit command line and environment for pipeline/submit.py."""
    venv_bin = os.path.dirname(sys.executable)
    command = [os.path.join(venv_bin, "spark-submit"), "--master", master,
               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
               str(ROOT / "pipeline" / "submit.py"), "run", "--config", config, *args]
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}",
           "PYSPARK_PYTHON": sys.executable}
    return command, env


def wait_until_gone(pid: int, why: str, seconds: float = 60) -> None:
    """Until process ``pid`` has exited; ``why`` fails the test after ``seconds``."""
    deadline = time.time() + seconds
    while os.path.exists(f"/proc/{pid}"):
        assert time.time() < deadline, why
        time.sleep(0.2)


def expected_keys(topics):
    keys = []
    for topic in topics:
        for p, (low, high) in watermarks(topic).items():
            keys += [(topic, p, o) for o in range(low, high)]
    return sorted(keys)


@pytest.mark.spark_line
def test_two_topics_several_partitions_then_only_new_records(spark):
    a, b = create_topic(unique("ta"), 3), create_topic(unique("tb"), 2)
    produce_orders(a, range(0, 90))
    produce_orders(b, range(1000, 1040))
    s = init_db(make_settings(unique("core"), [a, b]))

    first = run_ingest(s)

    assert first.status == "succeeded" and first.rows_written == 130
    assert result_keys(s.sink.table) == expected_keys([a, b])
    assert stored_offsets(s.name) == {(t, p): high for t in (a, b)
                                      for p, (_, high) in watermarks(t).items()}

    produce_orders(a, range(90, 120))
    second = run_ingest(s)

    assert second.records_read == 30 and second.rows_written == 30
    assert all(item["from"] == first_item["until"]
               for item, first_item in zip(second.plan, first.plan, strict=True))
    assert result_keys(s.sink.table) == expected_keys([a, b])
    assert stored_offsets(s.name) == {(t, p): high for t in (a, b)
                                      for p, (_, high) in watermarks(t).items()}
    order_ids = [r[0] for r in query(f"SELECT order_id FROM {s.sink.table} ORDER BY 1")]
    assert order_ids == list(range(0, 120)) + list(range(1000, 1040))
    amount, placed = query(f"SELECT amount, placed_at FROM {s.sink.table} WHERE order_id = 7")[0]
    assert amount == Decimal("8.75") and placed.isoformat() == "2026-01-01T00:07:00+00:00"


def test_a_backlog_ten_times_the_run_cap_drains_exactly_in_bounded_runs(spark):
    topic = create_topic(unique("backlog"), 3)
    produce_orders(topic, range(1000))
    s = init_db(make_settings(unique("backlog"), [topic],
                              kafka={"max_records_per_run": 100}))

    results = []
    while (result := run_ingest(s)).status == "succeeded":
        assert result.records_read <= 100  # every run one bounded transaction
        results.append(result)
        assert len(results) <= 12

    assert result.status == "noop" and len(results) == 10
    assert sum(r.records_read for r in results) == 1000
    assert result_keys(s.sink.table) == expected_keys([topic])
    order_ids = [r[0] for r in query(f"SELECT order_id FROM {s.sink.table} ORDER BY 1")]
    assert order_ids == list(range(1000))
    assert stored_offsets(s.name) == {(topic, p): high
                                      for p, (_, high) in watermarks(topic).items()}


def test_partition_added_after_the_first_run_is_read_from_earliest_under_latest(spark):
    """starting_offsets = "latest" is where a topic's first run starts; records written to a
    partition added later, before the next run, must not be skipped."""
    from confluent_kafka.admin import NewPartitions

    from tests.helpers import admin

    topic = create_topic(unique("grow"), 1)
    produce_orders(topic, range(10), partition=0)  # before the first run: skipped by design
    s = init_db(make_settings(unique("grow"), [topic], kafka={"starting_offsets": "latest"}))
    assert run_ingest(s).records_read == 0
    assert stored_offsets(s.name) == {(topic, 0): 10}

    client = admin()
    client.create_partitions([NewPartitions(topic, 2)])[topic].result()
    for _ in range(50):
        if len(watermarks(topic)) == 2:
            break
        time.sleep(0.1)
    produce_orders(topic, range(10, 15), partition=0)
    produce_orders(topic, range(15, 22), partition=1)  # the new partition, before any run

    result = run_ingest(s)

    assert result.records_read == 12
    assert stored_offsets(s.name) == {(topic, 0): 15, (topic, 1): 7}
    assert [r[0] for r in query(f"SELECT order_id FROM {s.sink.table} ORDER BY 1")] == list(
        range(10, 22))


def test_stale_plan_published_twice_is_rolled_back_by_the_offsets_compare_and_set(spark):
    topic = create_topic(unique("cas"), 2)
    produce_orders(topic, range(50))
    s = init_db(make_settings(unique("cas"), [topic]))
    store = Store(s)
    meta = KafkaMeta(s.kafka)
    stale = plan_ranges(store.offsets.load(), meta.topic_offsets([topic]))
    run_ingest(s)  # publishes the same ranges first
    rows_before = result_keys(s.sink.table)

    store.locks.lock_or_fail()
    run = store.runs.start("ingest", stale.partitions)
    run_id = run.id
    with pytest.raises(ConflictError, match=r"another run already published \[0, \d+\)"):
        execute_ranges(s, store, resolve_routes(s, [topic]), meta, run, stale.ranges,
                       stale.offset_updates, Timer(), None)
    store.close()

    assert result_keys(s.sink.table) == rows_before
    status, error = query("SELECT status, error FROM pipeline_runs WHERE run_id = %s",
                          (run_id,))[0]
    assert status == "failed" and "stored next offset is" in error
    assert query("SELECT count(*) FROM pg_tables WHERE tablename = %s",
                 (staging_table(s.name, run_id),))[0][0] == 0


def test_two_runs_started_together_publish_each_range_once(stack, tmp_path):
    topic, name, config = cli_pipeline(tmp_path, "conc", 200, partitions=2)
    # The first run holds the pipeline for a while after planning.
    slow = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", "--config", config], cwd=ROOT,
        env={**os.environ, "PIPELINE_FAULT": "after_stage:sleep=6"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not query("SELECT 1 FROM pipeline_runs WHERE pipeline = %s", (name,)):
        assert time.time() < deadline and slow.poll() is None, slow.communicate()
        time.sleep(0.2)
    second = run_cli("run", "--config", config)
    out, err = slow.communicate(timeout=300)

    assert slow.returncode == 0, err
    assert second.returncode == 75, second.stderr
    assert f"pipeline '{name}' is busy" in second.stderr
    assert result_keys(name) == expected_keys([topic])
    assert query("SELECT count(*) FROM pipeline_runs WHERE pipeline = %s AND status = "
                 "'succeeded'", (name,))[0][0] == 1


def test_malformed_records_become_dead_letters_and_the_rest_lands(spark):
    topic = create_topic(unique("bad"), 1)
    produce_orders(topic, range(3))
    produce(topic, [(b"k3", b"{oops"), (b"k4", b'{"order_id": "x", "customer": "c"}'),
                    (b"k5", b'{"customer": "c"}'), (b"k6", b"\xff\xfe"), (b"k7", None),
                    (b"k8", b"[1, 2]"), (b"k9", b'{"order_id": 9, "customer": 12}')],
            headers=[("trace", b"\x00\x01")])
    produce_orders(topic, range(10, 12))
    s = init_db(make_settings(unique("bad"), [topic]))

    result = run_ingest(s)

    assert result.rows_written == 5 and result.dead_letters == 7
    dead = query("SELECT \"offset\", error_type, error_message, key, value, headers, run_id "
                 "FROM pipeline_dead_letters WHERE pipeline = %s ORDER BY 1", (s.name,))
    assert [(o, t) for o, t, *_ in dead] == [
        (3, "malformed_json"), (4, "wrong_type"), (5, "missing_field"), (6, "invalid_utf8"),
        (7, "null_value"), (8, "not_an_object"), (9, "wrong_type")]
    assert dead[1][2] == "field 'order_id': expected long, got string"
    assert dead[6][2] == "field 'customer': expected string, got bigint"
    assert bytes(dead[0][3]) == b"k3" and bytes(dead[0][4]) == b"{oops"
    assert dead[0][5] == [{"key": "trace", "value_b64": "AAE="}]
    assert {d[6] for d in dead} == {result.run_id}
    assert [k[2] for k in result_keys(s.sink.table)] == [0, 1, 2, 10, 11]
    assert stored_offsets(s.name) == {(topic, 0): 12}


def test_too_many_bad_records_abort_the_run_and_commit_nothing(spark):
    topic = create_topic(unique("tol"), 1)
    produce(topic, [(b"k", b"nope")] * 5)
    produce_orders(topic, range(5))
    s = init_db(make_settings(unique("tol"), [topic], sink={"max_bad_records": 4}))

    with pytest.raises(DataError, match=r"5 bad records .* exceed sink.max_bad_records = 4"):
        run_ingest(s)

    assert result_keys(s.sink.table) == []
    assert stored_offsets(s.name) == {}
    assert query("SELECT count(*) FROM pipeline_dead_letters WHERE pipeline = %s",
                 (s.name,))[0][0] == 0
    assert query("SELECT status FROM pipeline_runs WHERE pipeline = %s", (s.name,)) == [
        ("failed",)]


def test_aborted_transactions_never_land_and_offsets_pass_the_markers(spark):
    topic = create_topic(unique("txn"), 1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": unique("tx")})
    p.init_transactions(30)
    from pipeline.sample import order

    for ids, commit in ((range(0, 4), True), (range(100, 103), False), (range(4, 6), True)):
        p.begin_transaction()
        for i in ids:
            p.produce(topic, key=b"k", value=order(i))
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    s = init_db(make_settings(unique("txn"), [topic], fmt="json",
                           kafka={"isolation_level": "read_committed"}))

    result = run_ingest(s)

    ids = [r[0] for r in query(f"SELECT order_id FROM {s.sink.table} ORDER BY 1")]
    assert ids == [0, 1, 2, 3, 4, 5]
    # 6 committed + 3 aborted records + 3 markers: the stored offset is the LSO, 12,
    # not the last record's offset + 1 (10).
    assert stored_offsets(s.name) == {(topic, 0): 12}
    assert result.records_read == 6
    assert run_ingest(s).status == "noop"


@pytest.mark.spark_line
def test_user_transform_hook_changes_rows(spark):
    topic = create_topic(unique("tr"), 1)
    produce_orders(topic, range(1, 21))
    s = init_db(make_settings(unique("tr"), [topic],
                           sink={"transform": "tests.integration.transforms.orders:double_amount"}))

    run_ingest(s)

    rows = query(f"SELECT order_id, amount FROM {s.sink.table} ORDER BY 1")
    assert [r[0] for r in rows] == [i for i in range(1, 21) if i % 10]
    assert rows[0][1] == Decimal("2.50")
    # Filtered records are consumed: the offsets still cover them.
    assert stored_offsets(s.name) == {(topic, 0): 20}


def test_empty_run_starts_no_spark_and_records_a_noop(stack, tmp_path):
    topic, name, config = cli_pipeline(tmp_path, "empty", 0, partitions=2)
    probe = (
        "import sys, json\n"
        "from pipeline.cli import main\n"
        f"rc = main(['run', '--config', {config!r}, '--json'])\n"
        "print(json.dumps({'rc': rc, 'pyspark_loaded': 'pyspark' in sys.modules}))\n")

    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)

    lines = r.stdout.strip().splitlines()
    summary, probe_out = json.loads(lines[0]), json.loads(lines[-1])
    assert probe_out == {"rc": 0, "pyspark_loaded": False}, r.stderr
    assert summary["status"] == "noop"
    assert query("SELECT status, records_read FROM pipeline_runs WHERE pipeline = %s",
                 (name,)) == [("noop", 0)]
    assert stored_offsets(name) == {}


def test_dry_run_prints_the_plan_and_changes_nothing(stack, tmp_path):
    topic = create_topic(unique("dry"), 2)
    produce_orders(topic, range(10), partition=1)
    name = unique("dry")
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic]))
    init_cli(config)

    r = cli_here("run", "--config", config, "--dry-run")

    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["topic", "partition", "stored", "from", "until", "offsets"]
    assert lines[2].split() == [topic, "1", "-", "0", "10", "10"]
    assert "2 partitions, 10 offsets to read" in r.stdout
    assert query("SELECT count(*) FROM pipeline_runs WHERE pipeline = %s", (name,)) == [(0,)]


def test_bad_config_fails_before_anything_runs_with_exit_2(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(toml_config("x", ["t"]).replace("[spark]", "[spark]\nmastr = 'x'"))
    r = cli_here("run", "--config", config)
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: unknown key 'spark.mastr' in config; allowed: "
                                "class_archive, conf, master, min_partitions")


@pytest.mark.parametrize("setting,where,message", [
    ('[spark.conf]\n"spark.executor.memory" = "lots"', "spark",
     "error: Spark did not start with master 'local[2]' and [spark.conf] "
     "spark.executor.memory: "),
], ids=["spark.conf"])
def test_a_value_spark_refuses_is_exit_2_naming_the_key(
        stack, tmp_path, setting, where, message):
    topic, name, _ = cli_pipeline(tmp_path, "refused", 20)
    config = tmp_path / "refused.toml"
    # A transform's run starts Spark with its Spark SQL flags.
    text = toml_config(name, [topic], extra_sink='transform = '
                       '"tests.integration.transforms.orders:identity"')
    if where == "spark":
        text += f"\n{setting}\n"
    else:
        text = text.replace("[database]", f"{setting}\n[database]")
    config.write_text(text)

    r = run_cli("run", "--config", config)

    assert r.returncode == 2, r.stderr[-2000:]
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith(message)
    [(status, exit_code)] = query("SELECT status, exit_code FROM pipeline_runs WHERE "
                                  "pipeline = %s", (name,))
    assert (status, exit_code) == ("failed", 2)
    assert query(f"SELECT count(*) FROM {name}") == [(0,)]


@pytest.mark.spark_line
def test_spark_submit_runs_the_same_job(stack, tmp_path):
    topic, name, config = cli_pipeline(tmp_path, "submit", 40)
    command, env = spark_submit(config, "--json")

    r = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": str(ROOT)})

    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["status"] == "succeeded" and summary["rows_written"] == 40
    assert result_keys(name) == expected_keys([topic])


def test_the_lock_holding_session_ends_within_minutes_when_its_driver_vanishes(stack):
    """The server's keepalives (and tcp_user_timeout) on the session that holds the run
    lock: a driver host that vanished releases it in ~1.5 min, not the kernel's 2 hours."""
    s = init_db(make_settings(unique("alive"), ["t"]))
    store = Store(s)
    try:
        store.locks.lock_or_fail()
        settings = {name: store.execute(f"SHOW {name}").fetchone()[0] for name in (
            "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
            "tcp_user_timeout")}
        assert settings == {"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "10",
                            "tcp_keepalives_count": "5", "tcp_user_timeout": "60000"}
        assert store.conn.info.get_parameters()["keepalives_idle"] == "30"  # client side
    finally:
        store.close()


def test_init_db_is_idempotent(stack):
    s = make_settings(unique("idem"), ["t"])
    init_db(s)
    init_db(s)
    assert query("SELECT count(*) FROM information_schema.tables WHERE table_name = %s",
                 (s.sink.table,)) == [(1,)]
    # The test database, never the product's: pipeline_test, or a copy of it that one
    # pytest process owns (pipeline_test_gw0, ...: tests/helpers.py own_database).
    assert re.fullmatch(r"pipeline_test(_\w+)?", TEST_DB_NAME), TEST_DB_URL


def test_driver_rolls_back_when_spark_submit_is_killed(stack, tmp_path):
    """spark-submit does not forward signals to its Python driver; the driver notices it
    was orphaned and stops like on SIGTERM instead of running on holding the lock."""
    topic, name, config = cli_pipeline(tmp_path, "orphan", 30, partitions=1)
    command, env = spark_submit(config, master="local[1]")
    submit = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**env, "PIPELINE_FAULT": "after_stage:sleep=60"})
    deadline = time.time() + 180
    while not (rows := query("SELECT pid FROM pipeline_runs WHERE pipeline = %s", (name,))):
        assert time.time() < deadline and submit.poll() is None
        time.sleep(0.5)
    driver_pid = rows[0][0]
    time.sleep(3)  # let it reach the injected pause after staging

    submit.kill()
    submit.wait(30)
    wait_until_gone(driver_pid, "the orphaned driver kept running")

    assert query("SELECT status, exit_code FROM pipeline_runs WHERE pipeline = %s",
                 (name,)) == [("failed", 143)]
    assert result_keys(name) == [] and stored_offsets(name) == {}


@pytest.mark.parametrize("stop", ["sigterm", "spark-submit killed"])
def test_a_stop_while_spark_starts_is_exit_143_not_a_spark_config_error(stack, tmp_path, stop):
    """A stop that lands while Spark starts, the driver waiting inside py4j for the JVM to
    build the SparkContext, breaks the start-up: that is the stop (exit 143, rolled back,
    nothing left behind), not "Spark did not start" (exit 2: fix the config). Spark's start
    is held there for real: spark.metrics.conf names a FIFO, which the JVM opens and reads
    while it builds the SparkContext; the test holds the FIFO's writing end meanwhile."""
    topic, name, config = cli_pipeline(tmp_path, "starting", 30, partitions=1)
    fifo = tmp_path / "metrics.properties"
    os.mkfifo(fifo)
    command, env = spark_submit(config, master="local[1]")
    command[1:1] = ["--conf", f"spark.metrics.conf={fifo}"]
    log = tmp_path / "submit.log"
    with open(log, "w") as out:
        submit = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out, env=env)
    writer = None
    try:
        deadline = time.time() + 180
        while writer is None:  # opens once the JVM reads the FIFO: Spark is starting
            assert time.time() < deadline and submit.poll() is None, log.read_text()[-3000:]
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.2)
        [(driver_pid,)] = query("SELECT pid FROM pipeline_runs WHERE pipeline = %s", (name,))
        if stop == "sigterm":
            os.kill(driver_pid, signal.SIGTERM)  # the driver only, as a scheduler's stop would
        else:
            submit.kill()
        submit.wait(120)
        wait_until_gone(driver_pid, "the stopped driver kept running")
    finally:
        if writer is not None:
            os.close(writer)
        if submit.poll() is None:
            submit.kill()
            submit.wait(30)

    if stop == "sigterm":  # (a killed spark-submit takes the driver's output with it)
        assert submit.returncode == 143
        assert [x for x in log.read_text().splitlines() if x.startswith("error: ")] == [
            "error: stopped by SIGTERM; nothing committed by this run, safe to rerun"]
    [(run_id, status, exit_code, error)] = query(
        "SELECT run_id, status, exit_code, error FROM pipeline_runs WHERE pipeline = %s",
        (name,))
    assert (status, exit_code) == ("failed", 143), error
    assert error.endswith("nothing committed by this run, safe to rerun"), error
    assert query("SELECT count(*) FROM pg_tables WHERE tablename = %s",
                 (staging_table(name, run_id),)) == [(0,)]
    assert result_keys(name) == [] and stored_offsets(name) == {}


def test_the_tests_run_the_job_as_the_least_privilege_role_over_tls(stack):
    """init_db hands back settings for the stack's 'pipeline' role, as deployed: not a
    superuser, SCRAM over TLS with the server's name verified (tests/security checks its
    grants and refusals)."""
    s = init_db(make_settings(unique("role"), ["t"]))
    assert make_url(s.database_url).username == "pipeline"
    assert make_url(s.database_url).query["sslmode"] == "verify-full"
    with psycopg.connect(s.database_url) as conn:
        assert conn.execute("SELECT current_user, rolsuper FROM pg_roles "
                            "WHERE rolname = current_user").fetchone() == ("pipeline", False)
        assert conn.execute("SELECT ssl FROM pg_stat_ssl "
                            "WHERE pid = pg_backend_pid()").fetchone() == (True,)
