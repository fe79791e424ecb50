"""The local stack is real: Spark reads exact Kafka ranges, read_committed hides aborted
transactions, Postgres takes COPY, and nothing listens beyond loopback."""

from __future__ import annotations

import os
import socket
import subprocess

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline.plan.offsets import OffsetRange
from pipeline.spark.read import read_ranges
from tests.helpers import BOOTSTRAP, ROOT, TEST_DB_URL, create_topic, make_settings, unique


def consume_range(topic: str, partition: int, start: int, until: int) -> list[tuple]:
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": unique("g"),
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, start)])
    out = []
    try:
        while len(out) < until - start:
            msg = c.poll(10)
            assert msg is not None and not msg.error(), "timed out reading the reference range"
            if msg.offset() < until:
                out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        c.close()
    return out


def test_spark_reads_exactly_the_assigned_offset_range(spark):
    topic = create_topic(unique("stack"), partitions=3)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    for i in range(1000):
        p.produce(topic, key=f"key-{i}".encode(), value=f"value-{i}".encode())
    assert p.flush(30) == 0
    settings = make_settings("stack", [topic], fmt="raw")

    df = read_ranges(spark, settings.kafka, [OffsetRange(topic, 1, 100, 300)])
    got = sorted((r.offset, bytes(r.key), bytes(r.value))
                 for r in df.select("offset", "key", "value").collect())

    assert {r.partition for r in df.select("partition").collect()} == {1}
    assert got == consume_range(topic, 1, 100, 300)
    assert [o for o, _, _ in got] == list(range(100, 300))


def test_read_committed_sees_only_committed_transactions(spark):
    topic = create_topic(unique("txn"), partitions=1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": unique("tx")})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, key=b"k", value=f"committed-{i}".encode())
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, key=b"k", value=f"aborted-{i}".encode())
    p.flush(30)
    p.abort_transaction(30)
    # 5 records + commit marker + 3 aborted + abort marker = offsets [0, 10).
    committed = make_settings("txn", [topic], fmt="raw",
                              kafka={"isolation_level": "read_committed"})
    uncommitted = make_settings("txn", [topic], fmt="raw",
                                kafka={"isolation_level": "read_uncommitted"})
    whole = [OffsetRange(topic, 0, 0, 10)]

    seen = sorted(bytes(r.value).decode() for r in
                  read_ranges(spark, committed.kafka, whole).select("value").collect())
    everything = sorted(bytes(r.value).decode() for r in
                        read_ranges(spark, uncommitted.kafka, whole).select("value").collect())

    assert seen == [f"committed-{i}" for i in range(5)]
    assert everything == sorted([f"committed-{i}" for i in range(5)] +
                                [f"aborted-{i}" for i in range(3)])


def test_postgres_copy_round_trip(stack):
    table = unique("copy")
    rows = [(i, f"name-{i}", bytes([i % 256, 0, 255])) for i in range(5000)]
    with psycopg.connect(TEST_DB_URL) as conn:
        conn.execute(f"CREATE TEMP TABLE {table} (id bigint, name text, payload bytea)")
        with conn.cursor().copy(f"COPY {table} (id, name, payload) FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)
        back = conn.execute(f"SELECT id, name, payload FROM {table} ORDER BY id").fetchall()
    assert back == rows


def free_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def test_stack_refuses_a_port_that_is_taken_and_names_it(tmp_path):
    for command, var in (("kafka-up", "KAFKA_PORT"), ("pg-up", "PG_PORT")):
        with free_port() as busy:
            port = busy.getsockname()[1]
            r = subprocess.run([str(ROOT / "scripts" / "stack"), command], capture_output=True,
                               text=True, env={**os.environ, "STACK_DIR": str(tmp_path / var),
                                               var: str(port)}, timeout=120)
        assert r.returncode != 0
        assert f"port {port} is already taken" in r.stderr


def test_stack_up_is_idempotent_and_listens_on_loopback_only(stack):
    r = subprocess.run([str(ROOT / "scripts" / "stack"), "up"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "already up" in r.stderr
    status = subprocess.run([str(ROOT / "scripts" / "stack"), "status"], capture_output=True,
                            text=True, check=True).stdout
    assert "kafka     up" in status and "postgres  up" in status
    listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    ours = [line for line in listening.splitlines() if '"java"' in line or '"postgres"' in line]
    assert ours, listening
    for line in ours:
        local = line.split()[3]
        assert local.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")), line
