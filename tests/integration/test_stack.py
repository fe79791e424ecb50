"""The local stack is real: Postgres takes COPY, the benchmark's peers find their Kafka
connector, and nothing listens beyond loopback."""

from __future__ import annotations

import os
import socket
import subprocess

import psycopg

from bench.peers.common import connector_jars
from tests.helpers import ROOT, TEST_DB_URL, unique


def test_the_stack_fetched_the_kafka_connector_the_benchmarks_peers_need():
    # Spark's Kafka source is read by the Structured Streaming peers alone (bench/peers/),
    # never by a run: the connector of exactly this pyspark, where the peers look for it.
    assert any(os.path.basename(j).startswith("spark-sql-kafka-0-10_")
               for j in connector_jars())


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
