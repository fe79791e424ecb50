"""Helpers for the reliability tests (faults, bad input, soak, secrets): what Kafka holds
versus what Postgres holds, held transactions, leftover processes, a second stack."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from pipeline.config import Settings
from pipeline.store.run import staging_table
from tests.helpers import ROOT, cli_environ, init_db, query, unique  # noqa: F401 - init_db re-exported


# ---- what Kafka holds --------------------------------------------------------------------
def kafka_records(topic: str, bootstrap: str,
                  isolation: str = "read_committed") -> dict[tuple[int, int], tuple]:
    """Every readable record: {(partition, offset): (key, value, headers, timestamp ms)},
    read from the beginning to the end (the last stable offset under read_committed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("verify"),
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": isolation, "auto.offset.reset": "earliest",
                  "fetch.message.max.bytes": 4 * 1024 * 1024})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: dict[tuple[int, int], tuple] = {}
        eof: set[int] = set()
        deadline = time.monotonic() + 120
        while len(eof) < len(parts):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for m in c.consume(10000, timeout=1):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise AssertionError(f"reading {topic}: {m.error()}")
                eof.discard(m.partition())
                out[(m.partition(), m.offset())] = (m.key(), m.value(), m.headers(),
                                                    m.timestamp()[1])
        return out
    finally:
        c.close()


def end_offsets(topic: str, bootstrap: str,
                isolation: str = "read_committed") -> dict[int, int]:
    """Per partition the planned end of a full run: the last stable offset (read_committed)
    or the high watermark."""
    from pipeline.config import KafkaSettings
    from pipeline.driver.kafka_meta import KafkaMeta

    meta = KafkaMeta(KafkaSettings(bootstrap_servers=bootstrap, topics=(topic,),
                                   isolation_level=isolation, timeout_seconds=10))
    return {k.partition: k.latest for k in meta.topic_offsets([topic])}


# ---- what Postgres holds -----------------------------------------------------------------
def pg_coordinates(table: str, db_url: str) -> list[tuple[int, int]]:
    return [(p, o) for p, o in query(f'SELECT "partition", "offset" FROM "{table}"',
                                     db_url=db_url)]


def pg_dead_coordinates(pipeline: str, db_url: str) -> list[tuple[int, int]]:
    return [(p, o) for p, o in query(
        'SELECT "partition", "offset" FROM pipeline_dead_letters WHERE pipeline = %s',
        (pipeline,), db_url=db_url)]


def stored(pipeline: str, db_url: str) -> dict[int, int]:
    return {p: o for p, o in query(
        'SELECT "partition", next_offset FROM pipeline_offsets WHERE pipeline = %s',
        (pipeline,), db_url=db_url)}


def runs(pipeline: str, db_url: str) -> list[tuple]:
    """(run_id, status, exit_code, error) of every run, oldest first."""
    return query("SELECT run_id, status, exit_code, error FROM pipeline_runs "
                 "WHERE pipeline = %s ORDER BY run_id", (pipeline,), db_url=db_url)


def staging_tables(pipeline: str, db_url: str) -> list[str]:
    """Tables that look like this pipeline's staging (broader than the cleanup's pattern:
    what it misses is found here)."""
    return [r[0] for r in query(
        "SELECT tablename FROM pg_tables WHERE starts_with(tablename, %s)",
        (f"_stage_{pipeline[:24]}",), db_url=db_url)]


@dataclass
class Comparison:
    kafka: int
    lost: list
    duplicated: int
    phantom: list

    def __str__(self) -> str:
        return (f"kafka={self.kafka} lost={len(self.lost)} duplicated={self.duplicated} "
                f"phantom={len(self.phantom)} (first lost {self.lost[:5]}, first phantom "
                f"{self.phantom[:5]})")

    @property
    def exact(self) -> bool:
        return not self.lost and not self.duplicated and not self.phantom


def compare(expected: set[tuple[int, int]], actual: list[tuple[int, int]]) -> Comparison:
    counts = Counter(actual)
    return Comparison(kafka=len(expected),
                      lost=sorted(expected - set(counts)),
                      duplicated=sum(n - 1 for n in counts.values() if n > 1),
                      phantom=sorted(set(counts) - expected))


def assert_exactly_once(settings: Settings, topic: str, *, good=None, bad=None) -> None:
    """Results (and dead letters) hold each record Kafka holds exactly once, each row made
    of its own record (typed columns or raw bytes, and the record's timestamp; a dead
    letter its original value), and the stored offsets are the planned ends. `good`/`bad`
    split Kafka's records for a json sink."""
    bootstrap, db = settings.kafka.bootstrap_servers, settings.database_url
    held = kafka_records(topic, bootstrap, settings.kafka.isolation_level)
    good = set(held) if good is None else {k for k, v in held.items() if good(v)}
    rows = compare(good, pg_coordinates(settings.sink.table, db))
    assert rows.exact, f"results: {rows}"
    wrong = wrong_content(settings, {c: held[c] for c in good})
    assert not wrong, f"results: {len(wrong)} rows differ from their records, first {wrong[:3]}"
    if bad is not None:
        dead = compare({k for k in held if k not in good},
                       pg_dead_coordinates(settings.name, db))
        assert dead.exact, f"dead letters: {dead}"
        wrong = [(p, o) for p, o, value in query(
            'SELECT "partition", "offset", value FROM pipeline_dead_letters WHERE pipeline = '
            "%s", (settings.name,), db_url=db) if value != held[(p, o)][1]]
        assert not wrong, f"dead letters whose value is not their record's: {wrong[:5]}"
    offsets = stored(settings.name, db)
    ends = end_offsets(topic, bootstrap, settings.kafka.isolation_level)
    assert offsets == ends, f"stored offsets {offsets} != planned ends {ends}"
    left = staging_tables(settings.name, db)
    assert left == [], f"staging tables left: {left}"
    running = [r for r in runs(settings.name, db) if r[1] == "running"]
    assert running == [], f"runs left running: {running}"


def wrong_content(settings: Settings, records: dict[tuple[int, int], tuple]) -> list:
    """Rows that are not what their own Kafka record says: [(coordinates, row, expected)].
    json: each declared column as the record's field, typed; raw: key and value bytes;
    both: kafka_timestamp = the record's timestamp, in UTC."""
    if settings.sink.format == "raw":
        names = ["key", "value"]
    else:
        names = [c.name for c in settings.sink.columns]
    cols = ", ".join(f'"{n}"' for n in names)
    out = []
    for p, o, *row in query(f'SELECT "partition", "offset", {cols}, kafka_timestamp FROM '
                            f'"{settings.sink.table}"', db_url=settings.database_url):
        key, value, _headers, ts = records[(p, o)]
        when = datetime.fromtimestamp(ts / 1000, UTC)
        if settings.sink.format == "raw":
            expected = [key, value, when]
        else:
            doc = json.loads(value)
            expected = [typed(doc.get(c.name), c.type) for c in settings.sink.columns] + [when]
        if list(row) != expected:
            out.append(((p, o), row, expected))
    return out


def typed(value, declared: str):
    """A JSON field as Postgres returns its declared column (the types the tests use)."""
    if value is None:
        return None
    if declared.startswith("decimal"):
        scale = int(declared.rstrip(")").split(",")[1]) if "," in declared else 0
        # Half-up, as Spark and the pipeline round (1.005 -> 1.01).
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-scale), ROUND_HALF_UP)
    if declared.startswith("timestamp"):
        return datetime.fromisoformat(value).astimezone(UTC)
    return value


def assert_nothing_committed(settings: Settings) -> None:
    db = settings.database_url
    offsets = stored(settings.name, db)
    rows = len(pg_coordinates(settings.sink.table, db))
    dead = len(pg_dead_coordinates(settings.name, db))
    succeeded = [r for r in runs(settings.name, db) if r[1] == "succeeded"]
    assert (offsets, rows, dead, succeeded) == ({}, 0, 0, []), (
        f"committed: stored offsets {offsets}, {rows} result rows, {dead} dead letters, "
        f"succeeded runs {succeeded}")


# ---- the run's processes and its publishing transaction ----------------------------------
def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """The real CLI in its own process group, for tests that signal it while it runs."""
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT,
                            env=cli_environ(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def start_paused(*args: str, point: str, seconds: float) -> subprocess.Popen:
    """The real CLI with ``PIPELINE_FAULT=<point>:sleep=<seconds>``, returned once it is
    asleep at that point (faults.py says so on stderr), for a test to act at that moment."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT,
                            env=cli_environ({"PIPELINE_FAULT": f"{point}:sleep={seconds}"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if f"fault injection: sleeping at {point}" in line:
            return proc
    raise AssertionError(f"the run ended before {point}: {proc.communicate()}")


def start_waiting(*args: str, point: str, go: Path) -> subprocess.Popen:
    """The real CLI with ``PIPELINE_FAULT=<point>:wait=<go>``, returned once it waits at that
    point (faults.py says so on stderr) until the file ``go`` exists: a test acts at that
    moment, however slow the machine, then touches ``go``."""
    proc = start_cli(*args, env={"PIPELINE_FAULT": f"{point}:wait={go}"})
    for line in proc.stderr:
        if f"fault injection: waiting at {point}" in line:
            return proc
    raise AssertionError(f"the command ended before {point}: {finish(proc)}")


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the run did not end within {timeout} s:\n{err[-3000:]}") from None
    return proc.returncode, out, err


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def one_error_line(stderr: str) -> str:
    lines = error_lines(stderr)
    assert len(lines) == 1, f"expected one 'error:' line, got {lines}\n{stderr[-3000:]}"
    return lines[0]


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None,
             interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n"
                                 f"{proc.stderr.read()[-3000:]}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def held_publish_backend(settings: Settings) -> int | None:
    """The backend pid of the pipeline's open publishing transaction: our application name,
    idle in a transaction that has written into this pipeline's results table."""
    rows = query(
        "SELECT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
        "WHERE a.application_name = 'kafka-offset-pipeline' "
        "AND a.state = 'idle in transaction' AND l.locktype = 'relation' "
        "AND l.relation = to_regclass(%s) AND l.mode = 'RowExclusiveLock'",
        (f'"{settings.schema}"."{settings.sink.table}"',), db_url=settings.database_url)
    return rows[0][0] if rows else None


def staging_copy_active(settings: Settings) -> bool:
    """An executor is COPYing into this pipeline's staging table right now."""
    prefix = f'COPY "{settings.schema}"."{staging_table(settings.name, 0)[:-1]}%'
    return bool(query("SELECT 1 FROM pg_stat_activity WHERE state = 'active' "
                      "AND query LIKE %s", (prefix,), db_url=settings.database_url))


def wait_for_processes_gone(*driver_pids: int, timeout: float = 60) -> None:
    """Wait until nothing the runs of ``driver_pids`` started is alive; the timeout's error
    names what still is."""
    alive: list[str] = []

    def gone() -> bool:
        alive[:] = [p for pid in driver_pids for p in processes_of_run(pid)]
        return not alive

    try:
        wait_for(gone, timeout, "the run's processes to be gone")
    except AssertionError as e:
        raise AssertionError(f"{e}; still alive: {alive}") from None


def processes_of_run(driver_pid: int) -> list[str]:
    """Processes still alive that a faulted run started (its JVM, Spark's Python daemon and
    workers): faults.py puts the driver's process group into their environment."""
    marker = f"PIPELINE_FAULT_DRIVER_PGID={driver_pid}".encode()
    alive = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                stat = (proc / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(f"{proc.name} {(proc / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return alive


# ---- a second, private stack (for taking services down) ----------------------------------
def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class PrivateStack:
    """A second Kafka + Postgres, started with scripts/stack's per-service commands."""

    def __init__(self) -> None:
        # Not under pytest's tmp_path: that is private to root (0700) and initdb runs as the
        # postgres user.
        self.dir = Path(tempfile.mkdtemp(prefix="pipeline-s2-", dir="/tmp"))
        self.dir.chmod(0o755)
        kafka, controller, secure, pg = free_ports(4)
        self.env = {**os.environ, "STACK_DIR": str(self.dir), "KAFKA_PORT": str(kafka),
                    "KAFKA_CONTROLLER_PORT": str(controller), "KAFKA_SECURE_PORT": str(secure),
                    "PG_PORT": str(pg)}
        self.bootstrap = f"127.0.0.1:{kafka}"
        self.db_url = f"postgresql://postgres@127.0.0.1:{pg}/pipeline_test"

    def stack(self, command: str) -> None:
        r = subprocess.run([str(ROOT / "scripts" / "stack"), command], env=self.env,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, f"scripts/stack {command}: {r.stderr}"

    def up(self) -> PrivateStack:
        self.stack("pg-up")
        self.stack("kafka-up")
        return self

    def destroy(self) -> None:
        try:
            self.stack("down")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
