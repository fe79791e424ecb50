"""Operator commands against the real stack: backfill, reprocess, lag, offsets show/set/reset,
runs, and the consumer-group mirror.

Spark runs are the expensive part: the module fixture ingests once, and only four tests run
Spark at all (ingest, backfill, reprocess, re-read after a reset). Everything else
exercises paths that never start Spark.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer

from pipeline.cli import main
from pipeline.commands.backfill import BackfillBounds, resolve_backfill
from pipeline.config import load_settings
from pipeline.driver.kafka_meta import KafkaMeta
from pipeline.sample import order
from pipeline.store import LOCK_CLASS
from tests.helpers import (
    BOOTSTRAP,
    ROOT,
    TEST_DB_URL,
    admin,
    cli_here,
    create_topic,
    init_cli,
    job_db_url,
    produce_orders,
    query,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)


def execute(statement: str, params=None) -> None:
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(statement, params)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The real CLI, in process (the test session's SparkSession is reused)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def cli_json(capsys, *argv: str) -> dict:
    rc, out, err = cli(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out.strip().splitlines()[-1])


@dataclass
class Pipeline:
    name: str
    topic: str
    config: str
    group: str | None = None
    base: datetime | None = None  # timestamp of partition 0's offset 0 (module fixture)

    def rows(self, partition: int) -> dict[int, tuple[int, datetime]]:
        """offset -> (run_id, ingested_at) of the partition's result rows."""
        return {o: (r, t) for o, r, t in query(
            f'SELECT "offset", run_id, ingested_at FROM {self.name} WHERE "partition" = %s',
            (partition,))}

    def count(self) -> int:
        return query(f"SELECT count(*) FROM {self.name}")[0][0]

    def runs(self, kind: str | None = None) -> list[tuple]:
        return query("SELECT run_id, kind, status, planned, details FROM pipeline_runs "
                     "WHERE pipeline = %s AND (%s::text IS NULL OR kind = %s) ORDER BY run_id",
                     (self.name, kind, kind))


def new_pipeline(tmp_path: Path, partitions: int = 1, extra_kafka: str = "",
                 group: str | None = None) -> Pipeline:
    name, topic = unique("ops"), create_topic(unique("ops_t"), partitions)
    if group:
        extra_kafka += f'\nmirror_group = "{group}"'
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], extra_kafka=extra_kafka))
    init_cli(config)  # as the owner; the commands below run as the job role
    return Pipeline(name, topic, str(config), group)


def group_offsets(group: str) -> dict[tuple[str, int], int]:
    client = admin()  # keep a reference: a collected client never completes its futures
    futures = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                 request_timeout=10)
    result = next(iter(futures.values())).result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions
            if tp.offset >= 0}


@pytest.fixture(scope="module")
def ingested(spark, tmp_path_factory) -> Pipeline:
    """Two partitions x 10 orders, ingested once, with the offsets mirrored to a group.
    Partition 0's records carry timestamps base + i minutes (for time-range backfills)."""
    group = unique("mirror")
    p = new_pipeline(tmp_path_factory.mktemp("ops"), partitions=2, group=group)
    p.base = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(10):
        ts = int((p.base + timedelta(minutes=i)).timestamp() * 1000)
        producer.produce(p.topic, key=f"order-{i}".encode(), value=order(i), partition=0,
                         timestamp=ts)
    assert producer.flush(30) == 0
    produce_orders(p.topic, range(10, 20), partition=1)
    assert main(["run", "--config", p.config]) == 0
    assert stored_offsets(p.name) == {(p.topic, 0): 10, (p.topic, 1): 10}
    assert p.count() == 20
    return p


# ---- backfill ------------------------------------------------------------------------------

def test_backfill_of_ingested_range_writes_only_missing_rows_and_keeps_offsets(
        ingested, capsys):
    p = ingested
    execute(f'DELETE FROM {p.name} WHERE "partition" = 0 AND "offset" IN (2, 3)')
    before, offsets_before = p.rows(0), stored_offsets(p.name)

    result = cli_json(capsys, "backfill", "--config", p.config, "--topic", p.topic,
                      "--partition", "0", "--from-offset", "2", "--to-offset", "6")

    assert (result["kind"], result["status"]) == ("backfill", "succeeded")
    assert result["records_read"] == 4  # it did read [2, 6)...
    assert result["rows_written"] == 2  # ...and added only the two missing rows
    after = p.rows(0)
    assert p.count() == 20
    assert {o: after[o] for o in before} == before  # the 8 present rows: untouched
    assert after[2][0] == after[3][0] == result["run_id"]
    assert stored_offsets(p.name) == offsets_before  # a backfill never moves offsets
    run = p.runs("backfill")[-1]
    assert run[0] == result["run_id"] and run[2] == "succeeded"
    assert run[3] == [{"topic": p.topic, "partition": 0, "from": 2, "until": 6}]


def test_reprocess_by_time_overwrites_rows_in_place(ingested, capsys):
    p = ingested
    before, offsets_before, p1_before = p.rows(0), stored_offsets(p.name), p.rows(1)
    start, end = p.base + timedelta(minutes=2), p.base + timedelta(minutes=6)

    result = cli_json(capsys, "backfill", "--config", p.config, "--topic", p.topic,
                      "--partition", "0", "--from-time", start.isoformat(),
                      "--to-time", end.isoformat().replace("+00:00", "Z"), "--reprocess")

    # [base+2min, base+6min) resolves to offsets [2, 6): --to-time is exclusive.
    assert result["plan"] == [{"topic": p.topic, "partition": 0, "from": 2, "until": 6,
                               "offsets": 4}]
    assert (result["kind"], result["rows_written"]) == ("reprocess", 4)
    after = p.rows(0)
    assert p.count() == 20 and set(after) == set(before)
    for o in range(10):
        if 2 <= o < 6:
            assert after[o][0] == result["run_id"] != before[o][0]
            assert after[o][1] > before[o][1]
        else:
            assert after[o] == before[o]
    assert p.rows(1) == p1_before
    assert stored_offsets(p.name) == offsets_before
    assert p.runs("reprocess")[-1][2] == "succeeded"
    # The run row keeps what was asked, not only the offsets it resolved to.
    [(details,)] = query("SELECT details FROM pipeline_runs WHERE run_id = %s",
                         (result["run_id"],))
    assert details["requested"] == {"from_time": start.isoformat().replace("+00:00", "Z"),
                                    "to_time": end.isoformat().replace("+00:00", "Z")}


def test_a_time_backfill_past_the_newest_record_of_a_live_topic_resolves(stack, tmp_path):
    """Both ends resolve against one snapshot of the latest offsets: records written
    meanwhile never push the end past the latest offset the check uses (exit 3 before)."""
    p = new_pipeline(tmp_path, partitions=2)
    settings = load_settings(p.config)
    stop = threading.Event()

    def keep_producing() -> None:
        producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 1})
        i = 0
        while not stop.is_set():
            producer.produce(p.topic, value=order(i), partition=i % 2)
            i += 1
            if i % 200 == 0:
                producer.poll(0)
                time.sleep(0.001)
        producer.flush(10)

    producing = threading.Thread(target=keep_producing, daemon=True)
    producing.start()
    try:
        deadline = time.monotonic() + 30
        while not all(high > 0 for _, high in watermarks(p.topic).values()):
            assert time.monotonic() < deadline, "no records arrived"
            time.sleep(0.2)
        bounds = BackfillBounds(from_ms=0, to_ms=int(time.time() * 1000) + 3_600_000)
        for _ in range(25):
            ranges = resolve_backfill(settings, KafkaMeta(settings.kafka), p.topic, None,
                                      bounds)
            assert [r.partition for r in ranges] == [0, 1]
            assert all(r.from_offset == 0 and r.until_offset > 0 for r in ranges)
    finally:
        stop.set()
        producing.join(30)


def test_backfill_outside_what_kafka_holds_exits_3_before_any_work(ingested, capsys):
    p = ingested
    runs_before, count_before = len(p.runs()), p.count()

    proc = cli_here("backfill", "--config", p.config, "--topic", p.topic, "--partition", "1",
                   "--from-offset", "5", "--to-offset", "50")

    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {p.topic}[1] [5, 50) is outside what Kafka holds [0, 10); "
                      "choose a range inside it"]
    assert proc.stdout == ""
    # A topic the pipeline does not own is refused too (exit 2), in process this time.
    rc, _, err = cli(capsys, "backfill", "--config", p.config, "--topic", "not_ours",
                     "--from-offset", "0", "--to-offset", "1")
    assert rc == 2 and "not one of pipeline" in err
    assert len(p.runs()) == runs_before and p.count() == count_before


# ---- offsets reset + re-read, and the mirror -------------------------------------------

def test_offsets_reset_then_run_rereads_and_mirrors(ingested, capsys):
    p = ingested
    rows_before = p.rows(0)

    change = cli_json(capsys, "offsets", "reset", "--config", p.config, "--topic", p.topic,
                      "--partition", "0", "--to", "4", "--yes")

    assert [(c["partition"], c["old"], c["new"]) for c in change["changes"]] == [(0, 10, 4)]
    assert stored_offsets(p.name) == {(p.topic, 0): 4, (p.topic, 1): 10}
    run = p.runs("offsets")[-1]
    assert (run[0], run[2]) == (change["run_id"], "succeeded")
    assert run[4]["changes"] == [{"topic": p.topic, "partition": 0, "old": 10, "new": 4}]
    assert group_offsets(p.group)[(p.topic, 0)] == 4  # the mirror follows a manual change

    result = cli_json(capsys, "run", "--config", p.config)

    assert [(x["partition"], x["from"], x["until"]) for x in result["plan"]] == [
        (0, 4, 10), (1, 10, 10)]
    assert (result["records_read"], result["rows_written"]) == (6, 0)  # re-read, idempotent
    assert p.rows(0) == rows_before
    assert stored_offsets(p.name) == {(p.topic, 0): 10, (p.topic, 1): 10}


def test_mirror_group_offsets_equal_stored_offsets(ingested):
    p = ingested
    assert group_offsets(p.group) == stored_offsets(p.name) == {(p.topic, 0): 10,
                                                                 (p.topic, 1): 10}


def test_mirror_failure_is_logged_not_fatal(stack, tmp_path, capsys, caplog):
    """A real failure: the group has an active member, so the broker refuses the commit."""
    group = unique("mirror")
    # An empty topic read from "latest": the run pins the position None -> 0, no Spark.
    p = new_pipeline(tmp_path, group=group, extra_kafka='starting_offsets = "latest"')
    member = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group,
                       "enable.auto.commit": False})
    try:
        member.subscribe([p.topic])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        assert member.assignment(), "the group member never got its partition"
        caplog.set_level(logging.INFO, logger="pipeline")

        rc, _, err = cli(capsys, "run", "--config", p.config)

        assert rc == 0, err  # not fatal: Postgres is the truth and it committed
        assert stored_offsets(p.name) == {(p.topic, 0): 0}
        assert group_offsets(group) == {}  # the broker refused the mirror
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"could not mirror offsets to consumer group {group}" in w
                   for w in warnings), caplog.text
    finally:
        member.close()


# ---- lag ---------------------------------------------------------------------------------

def test_lag_json_equals_kafka_watermarks_and_stored_offsets(stack, tmp_path, capsys):
    p = new_pipeline(tmp_path, partitions=3)
    produce_orders(p.topic, range(0, 5), partition=0)
    produce_orders(p.topic, range(5, 12), partition=1)
    change = cli_json(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic,
                      "--partition", "0", "--to", "2", "--yes")
    produce_orders(p.topic, range(100, 104), partition=0)  # more records after the change
    produce_orders(p.topic, range(200, 203), partition=2)

    lag = cli_json(capsys, "lag", "--config", p.config)

    wm, stored = watermarks(p.topic), stored_offsets(p.name)
    rows = {r["partition"]: r for r in lag["partitions"]}
    assert set(rows) == {0, 1, 2}
    for part, (low, high) in wm.items():
        r = rows[part]
        assert (r["earliest"], r["latest"]) == (low, high)
        assert r["stored"] == stored.get((p.topic, part))
        assert r["lag"] == high - (r["stored"] if r["stored"] is not None else low)
    assert [rows[i]["lag"] for i in range(3)] == [9 - 2, 7, 3]  # 1 and 2: never read
    assert rows[0]["last_run_id"] == change["run_id"] and rows[0]["last_run_finished_at"]
    assert lag["topics"] == {p.topic: {"partitions": 3, "lag": 17, "max_lag": 7}}
    assert lag["total_lag"] == 17 and lag["last_success"] is None

    rc, out, _ = cli(capsys, "lag", "--config", p.config)
    assert rc == 0 and f"{p.topic}: lag 17 over 3 partitions (max 7)" in out


# ---- offsets set/reset: lock, confirmation, gone partitions ------------------------------

def test_offsets_set_refuses_while_the_run_lock_is_held(stack, tmp_path, capsys):
    p = new_pipeline(tmp_path)
    produce_orders(p.topic, range(3))
    cli_json(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic, "--to",
             "latest", "--yes")
    runs_before = p.runs("offsets")
    with psycopg.connect(TEST_DB_URL, autocommit=True) as other:
        assert other.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                             (LOCK_CLASS, p.name)).fetchone()[0]

        rc, out, err = cli(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic,
                           "--to", "earliest", "--yes")

        assert rc == 75, err
        assert f"pipeline '{p.name}' is busy" in err and "offsets set did nothing" in err
        assert stored_offsets(p.name) == {(p.topic, 0): 3}
        assert p.runs("offsets") == runs_before
        # Read-only commands still work while a run holds the lock.
        assert cli_json(capsys, "lag", "--config", p.config)["total_lag"] == 0
        # Unlock explicitly: closing a connection does not wait for the server to end
        # the session, so the lock could outlive the close by a moment.
        other.execute("SELECT pg_advisory_unlock_all()")
    # Lock released: the same command goes through.
    rc, _, err = cli(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic,
                     "--to", "earliest", "--yes")
    assert rc == 0, err
    assert stored_offsets(p.name) == {(p.topic, 0): 0}


def test_offsets_set_validates_and_needs_confirmation(stack, tmp_path, capsys, monkeypatch):
    p = new_pipeline(tmp_path, partitions=2)
    produce_orders(p.topic, range(4), partition=1)

    rc, _, err = cli(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic,
                     "--partition", "1", "--to", "5", "--yes")
    assert rc == 3 and f"{p.topic}[1]: --to 5 is outside what Kafka holds [0, 4]" in err
    rc, _, err = cli(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic,
                     "--partition", "7", "--to", "0", "--yes")
    assert rc == 3 and f"{p.topic}[7]: no such partition in Kafka" in err

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # not a terminal
    rc, out, err = cli(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic,
                       "--to", "latest")
    assert rc == 2 and "stdin is not a terminal" in err and "--yes" in err
    assert "new row" in out  # the change was shown, not made
    assert stored_offsets(p.name) == {} and p.runs("offsets") == []


def run_cli_on_terminal(answer: str, *args: str, timeout: float = 60,
                        on_prompt=lambda: None) -> tuple[int, str, str]:
    """The real CLI with a pseudo-terminal on stdin/stderr: it asks, ``on_prompt`` runs
    while it waits, we answer."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT,
                            env=dict(os.environ), stdin=slave, stderr=slave,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + timeout
    try:
        while b"[y/N]" not in seen and time.monotonic() < deadline and proc.poll() is None:
            if select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 4096)
        assert b"[y/N]" in seen, seen.decode(errors="replace")
        on_prompt()
        os.write(master, answer.encode() + b"\n")
        out, _ = proc.communicate(timeout=timeout)
        while select.select([master], [], [], 0.1)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child has closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return proc.returncode, out, seen.decode(errors="replace")


def test_offsets_set_asks_on_a_terminal(stack, tmp_path):
    p = new_pipeline(tmp_path)
    produce_orders(p.topic, range(5))
    args = ("offsets", "set", "--config", p.config, "--topic", p.topic, "--to", "3")

    rc, out, term = run_cli_on_terminal("n", *args)
    assert rc == 0 and "cancelled: nothing changed" in out, term
    assert f"change 1 stored offsets of pipeline '{p.name}'? [y/N]" in term
    assert stored_offsets(p.name) == {} and p.runs("offsets") == []

    rc, out, term = run_cli_on_terminal("y", *args)
    assert rc == 0 and "1 offsets changed" in out, term
    assert stored_offsets(p.name) == {(p.topic, 0): 3}


def test_offsets_set_holds_no_run_lock_while_it_asks(stack, tmp_path):
    # An operator thinking at the prompt must not keep the scheduled runs out.
    p = new_pipeline(tmp_path)
    produce_orders(p.topic, range(5))

    def a_run_takes_the_lock():
        with psycopg.connect(TEST_DB_URL, autocommit=True) as run:
            assert run.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                               (LOCK_CLASS, p.name)).fetchone()[0]
            run.execute("SELECT pg_advisory_unlock_all()")

    rc, out, term = run_cli_on_terminal("y", "offsets", "set", "--config", p.config,
                                        "--topic", p.topic, "--to", "3",
                                        on_prompt=a_run_takes_the_lock)
    assert rc == 0 and "1 offsets changed" in out, term
    assert stored_offsets(p.name) == {(p.topic, 0): 3}


def test_offsets_that_moved_while_asked_are_not_overwritten(stack, tmp_path):
    p = new_pipeline(tmp_path)
    produce_orders(p.topic, range(5))

    def offsets_move():  # as a run that publishes meanwhile would move them
        r = cli_here("offsets", "set", "--config", p.config, "--topic", p.topic, "--to", "5",
                    "--yes")
        assert r.returncode == 0, r.stderr

    rc, out, term = run_cli_on_terminal("y", "offsets", "set", "--config", p.config,
                                        "--topic", p.topic, "--to", "3",
                                        on_prompt=offsets_move)
    assert rc == 75 and "changed while the change was being confirmed" in term, term
    assert stored_offsets(p.name) == {(p.topic, 0): 5}
    assert len(p.runs("offsets")) == 1  # the one that moved them


def with_a_gone_partition(tmp_path, capsys):
    """A pipeline at the end of its 1-partition topic (offset 3) that also stores offset 42
    for a partition 5 Kafka does not have, as if the topic had been recreated smaller."""
    p = new_pipeline(tmp_path)
    produce_orders(p.topic, range(3))
    cli_json(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic, "--to",
             "latest", "--yes")
    execute("INSERT INTO pipeline_offsets (pipeline, topic, \"partition\", next_offset) "
            "VALUES (%s, %s, 5, 42)", (p.name, p.topic))
    return p


def test_reset_forgets_partitions_kafka_no_longer_has(stack, tmp_path, capsys):
    """The fix the planner's 'no partition N now' error points at actually works."""
    p = with_a_gone_partition(tmp_path, capsys)
    rc, _, err = cli(capsys, "run", "--config", p.config, "--dry-run")
    assert rc == 3 and "has no partition 5 now" in err

    change = cli_json(capsys, "offsets", "reset", "--config", p.config, "--topic", p.topic,
                      "--yes")  # no --to: kafka.starting_offsets (earliest)

    assert [(c["partition"], c["old"], c["new"]) for c in change["changes"]] == [
        (0, 3, 0), (5, 42, None)]
    shown = cli_json(capsys, "offsets", "show", "--config", p.config)
    assert [(r["partition"], r["next_offset"], r["run_id"], r["run_kind"])
            for r in shown["offsets"]] == [(0, 0, change["run_id"], "offsets")]
    plan = cli_json(capsys, "run", "--config", p.config, "--dry-run")["plan"]
    assert [(x["partition"], x["stored"], x["from"], x["until"]) for x in plan] == [(0, 0, 0, 3)]


def test_a_failed_offsets_change_changes_nothing(stack, tmp_path, capsys):
    """Forgetting and setting are one transaction: a failure while setting (here a real
    error raised by the database) leaves the forgotten partition's offset in place too."""
    p = with_a_gone_partition(tmp_path, capsys)
    trigger = f"fail_{p.name}"
    execute(f"CREATE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.pipeline = '{p.name}' THEN RAISE EXCEPTION 'injected: disk full'; "
            f"END IF; RETURN NEW; END $$")
    execute(f"CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE ON pipeline_offsets "
            f"FOR EACH ROW EXECUTE FUNCTION {trigger}()")
    try:
        rc, _, err = cli(capsys, "offsets", "reset", "--config", p.config, "--topic", p.topic,
                         "--yes")
    finally:
        execute(f"DROP TRIGGER {trigger} ON pipeline_offsets")
        execute(f"DROP FUNCTION {trigger}()")

    assert rc != 0 and "injected: disk full" in err
    assert stored_offsets(p.name) == {(p.topic, 0): 3, (p.topic, 5): 42}
    assert [r["status"] for r in cli_json(capsys, "runs", "--config", p.config,
                                          "--kind", "offsets")["runs"]][:1] == ["failed"]


# ---- runs --------------------------------------------------------------------------------

def test_runs_json_filters(stack, tmp_path, capsys):
    p = new_pipeline(tmp_path, extra_kafka='starting_offsets = "latest"')
    assert main(["run", "--config", p.config]) == 0  # empty topic: pinned None -> 0, no Spark
    assert main(["run", "--config", p.config]) == 0  # nothing new: noop
    produce_orders(p.topic, range(3))
    cli_json(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic, "--to",
             "latest", "--yes")
    assert main(["run", "--config", p.config]) == 0  # stored = latest: noop
    capsys.readouterr()

    def runs(*filters: str) -> list[tuple]:
        out = cli_json(capsys, "runs", "--config", p.config, *filters)
        assert out["pipeline"] == p.name
        return [(r["kind"], r["status"]) for r in out["runs"]]

    assert runs() == [("ingest", "noop"), ("offsets", "succeeded"), ("ingest", "noop"),
                      ("ingest", "succeeded")]  # newest first
    assert runs("--last", "2") == [("ingest", "noop"), ("offsets", "succeeded")]
    assert runs("--status", "noop") == [("ingest", "noop")] * 2
    assert runs("--kind", "ingest", "--status", "succeeded") == [("ingest", "succeeded")]
    assert runs("--status", "failed") == []
    offsets_run = cli_json(capsys, "runs", "--config", p.config, "--kind", "offsets")["runs"]
    assert offsets_run[0]["details"]["changes"] == [
        {"topic": p.topic, "partition": 0, "old": 0, "new": 3}]
    assert offsets_run[0]["exit_code"] == 0 and offsets_run[0]["finished_at"]

    rc, out, _ = cli(capsys, "runs", "--config", p.config, "--kind", "offsets")
    assert rc == 0 and f"{p.topic}[0] 0->3" in out


# ---- unlock ------------------------------------------------------------------------------
def hold_lock_as_run(p: Pipeline, host: str, pid: int) -> tuple[psycopg.Connection, int]:
    """A real session holding the pipeline's lock, with a 'running' run row naming the
    host and pid of its driver (the one thing faked: which process the run says it is).
    It logs in as the job's role, as a run does: that role may end its own sessions."""
    holder = psycopg.connect(job_db_url(), autocommit=True)
    assert holder.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                          (LOCK_CLASS, p.name)).fetchone()[0]
    run_id = holder.execute(
        "INSERT INTO pipeline_runs (pipeline, kind, status, host, pid) VALUES "
        "(%s, 'ingest', 'running', %s, %s) RETURNING run_id", (p.name, host, pid)).fetchone()[0]
    return holder, run_id


def _reaped_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_unlock_ends_the_session_of_a_run_whose_process_is_gone(stack, tmp_path, capsys):
    import socket

    p = new_pipeline(tmp_path)
    produce_orders(p.topic, range(5))
    holder, run_id = hold_lock_as_run(p, socket.gethostname(), _reaped_pid())
    rc, _, err = cli(capsys, "run", "--config", p.config)
    assert rc == 75 and "'pipeline unlock' shows the holder" in err, err

    result = cli_json(capsys, "unlock", "--config", p.config)

    [ended] = result["ended"]
    assert (ended["run_id"], ended["family"], result["abandoned"]) == (run_id, "ingest",
                                                                       [run_id])
    assert "no longer exists on this host" in ended["why"]
    with pytest.raises(psycopg.OperationalError):
        holder.execute("SELECT 1")
    assert query("SELECT status FROM pipeline_runs WHERE run_id = %s", (run_id,)) == [
        ("abandoned",)]
    assert cli_json(capsys, "run", "--config", p.config)["rows_written"] == 5


def test_unlock_leaves_a_live_or_unverifiable_holder_alone_unless_forced(stack, tmp_path,
                                                                        capsys):
    import socket

    p = new_pipeline(tmp_path)
    assert cli_json(capsys, "unlock", "--config", p.config)["locked"] is False
    holder, run_id = hold_lock_as_run(p, socket.gethostname(), os.getpid())  # alive: us

    rc, out, err = cli(capsys, "unlock", "--config", p.config)
    assert rc == 75, err
    assert f"run {run_id} (ingest, {socket.gethostname()} pid {os.getpid()}" in out
    assert f"its ingest lock stays: pid {os.getpid()} is still alive on this host" in err
    assert holder.execute("SELECT 1").fetchone() == (1,)

    holder.execute("UPDATE pipeline_runs SET host = 'gone-host' WHERE run_id = %s", (run_id,))
    rc, _, err = cli(capsys, "unlock", "--config", p.config)
    assert rc == 75 and "on host gone-host, which cannot be checked from here" in err, err
    assert holder.execute("SELECT 1").fetchone() == (1,)

    result = cli_json(capsys, "unlock", "--config", p.config, "--force")
    assert [(e["run_id"], e["why"]) for e in result["ended"]] == [(run_id, "--force given")]
    assert result["abandoned"] == [run_id]
    with pytest.raises(psycopg.OperationalError):
        holder.execute("SELECT 1")


# ---- a backfill beside the scheduled ingest --------------------------------------------------
def paused_backfill(p: Pipeline, *range_args: str) -> subprocess.Popen:
    """`pipeline backfill` in its own process, paused after its read (staged, not
    published) until the test has done what it wants beside it."""
    from tests.integration._reliability import start_paused

    return start_paused("backfill", "--config", p.config, "--topic", p.topic, *range_args,
                        "--json", point="after_stage", seconds=10)


def test_a_backfill_runs_beside_the_scheduled_ingest(stack, tmp_path, capsys):
    from tests.integration._reliability import assert_exactly_once

    p = new_pipeline(tmp_path, partitions=2)
    produce_orders(p.topic, range(100))
    assert cli_json(capsys, "run", "--config", p.config)["rows_written"] == 100
    produce_orders(p.topic, range(100, 160))
    backfill = paused_backfill(p, "--partition", "0", "--from-offset", "0", "--to-offset",
                               "20")

    # While the backfill holds its lock: the scheduled run goes ahead (it used to exit 75
    # for as long as the backfill took); a second backfill, or an offsets change, waits.
    assert cli_json(capsys, "run", "--config", p.config)["rows_written"] == 60
    rc, _, err = cli(capsys, "backfill", "--config", p.config, "--topic", p.topic,
                     "--from-offset", "0", "--to-offset", "1", "--partition", "1")
    assert rc == 75 and "holds its backfill lock" in err, err
    rc, _, err = cli(capsys, "offsets", "set", "--config", p.config, "--topic", p.topic,
                     "--to", "earliest", "--yes")
    assert rc == 75 and "holds its backfill lock" in err, err
    out, err = backfill.communicate(timeout=120)

    assert backfill.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["rows_written"] == 0  # all present
    assert [r[2] for r in p.runs()] == ["succeeded"] * 3
    assert_exactly_once(load_settings(p.config, environ={}), p.topic)


def test_a_backfill_and_an_ingest_of_the_same_new_offsets_publish_them_once(stack, tmp_path,
                                                                            capsys):
    from tests.integration._reliability import assert_exactly_once

    p = new_pipeline(tmp_path)
    produce_orders(p.topic, range(50))
    # The backfill reads offsets no ingest has published yet, and pauses before publishing.
    backfill = paused_backfill(p, "--from-offset", "10", "--to-offset", "50")
    assert cli_json(capsys, "run", "--config", p.config)["rows_written"] == 50
    out, err = backfill.communicate(timeout=120)

    # Its COPY meets the ingest's committed rows under the results table's key: nothing
    # written twice, the backfill rolls back with a retryable error...
    assert backfill.returncode == 75, err[-3000:]
    assert "another run (a backfill beside the ingest) published rows of the same offsets" \
        in err
    # ...and its retry keeps those rows.
    assert cli_json(capsys, "backfill", "--config", p.config, "--topic", p.topic,
                    "--from-offset", "10", "--to-offset", "50")["rows_written"] == 0
    assert_exactly_once(load_settings(p.config, environ={}), p.topic)
