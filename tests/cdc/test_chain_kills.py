"""The whole chain under faults: the shop's workload runs against the source (inserts,
updates, deletes, a primary-key change, updates leaving the TOASTed profile unchanged,
NUMERIC without precision, TRUNCATEs, a column added mid-stream) while this pipeline
replicates every table of it, one transaction per run, its runs started one after the other
as a scheduler would and SIGKILLed (the whole process group) at random moments; the Connect
worker is killed once mid-workload and restarted (Kafka Connect then writes some events
again). A reader polls the replica the whole time: it must never see a source transaction
in part. At the end the replica equals the source row by row, every column.

CI runs a short form; ``scripts/soak --cdc`` the issue's (CDC_CHAIN_TRANSACTIONS=10000);
CDC_CHAIN_SEED picks another sequence of kills."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pipeline.sample_shop import run_workload, watch
from pipeline.sample_shop_compare import compare
from pipeline.sample_shop_replica import Runs, config, delivered
from tests.cdc.conftest import SOURCE_URL
from tests.helpers import BOOTSTRAP, ROOT, TEST_DB_URL, cli_environ, unique

pytestmark = pytest.mark.integration

TRANSACTIONS = int(os.environ.get("CDC_CHAIN_TRANSACTIONS", "400"))
SEED = int(os.environ.get("CDC_CHAIN_SEED", "5"))
# Spread over the pipeline's runs: the workload at this many transactions a second.
RATE = float(os.environ.get("CDC_CHAIN_RATE", "8" if TRANSACTIONS < 2000 else "60"))
STACK = Path(os.environ.get("STACK_DIR", ROOT / ".stack"))


def kill_connect() -> None:
    """SIGKILL of the Connect worker (no shutdown: its last second of source offsets is not
    committed, so Debezium writes those changes again once it restarts)."""
    pid = int((STACK / "connect" / "connect.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the Connect worker {pid} survived SIGKILL")


def avro_values(registry: str):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    de = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    return lambda m: de(m.value(), SerializationContext(m.topic(), MessageField.VALUE))


def test_replica_stays_whole_and_equal_under_kills(cdc_chain, shop_run, tmp_path):
    # shop_run: the session's shop workload and its events come first, whatever the order
    # the tests run in; they expect the fresh chain's topics to begin with their events.
    schema, name = unique("chain"), unique("chain")
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    path = tmp_path / "cdc.toml"
    # A small budget per partition and run: many commits, each a chance to cut a source
    # transaction, each run a chance to be killed mid-publish.
    path.write_text(config(name, BOOTSTRAP, TEST_DB_URL, schema,
                           transactions=True,
                           records_per_partition=max(50, TRANSACTIONS // 8)))
    env = cli_environ()
    subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "pipeline", "init-db",
                    "--config", str(path)], env=env, cwd=ROOT, check=True,
                   capture_output=True)

    stop, seen = threading.Event(), {}
    reader = threading.Thread(target=lambda: seen.update(
        watch(TEST_DB_URL, schema, 0.2, stop).summary()), daemon=True)
    reader.start()
    workload: dict = {}
    writer = threading.Thread(target=lambda: workload.update(
        run_workload(SOURCE_URL, TRANSACTIONS, SEED, rate=RATE)), daemon=True)
    writer.start()
    runs = Runs(str(path), TEST_DB_URL, schema, name, env, kill_chance=0.5,
                kill_within=12.0, seed=SEED, kill_one=True)
    connect_killed_at = None
    t0 = time.monotonic()
    while writer.is_alive():  # runs during the workload; Connect killed once, half way
        if connect_killed_at is None and time.monotonic() - t0 > TRANSACTIONS / RATE / 2:
            kill_connect()
            connect_killed_at = time.monotonic() - t0
            up = subprocess.run([str(ROOT / "scripts" / "cdc"), "up"], timeout=600,
                                capture_output=True, text=True)
            assert up.returncode == 0, f"scripts/cdc up after the kill failed:\n{up.stderr}"
        runs.log.append(runs.run_once(runs.kill_at()))
    writer.join()
    assert workload["transactions"] == TRANSACTIONS and connect_killed_at is not None
    ends = delivered(BOOTSTRAP, "shop_json", workload["last_txid"], timeout=600)
    # The session's other tests read the Avro connector's topics too: it has caught up
    # after its restart before this test ends.
    delivered(BOOTSTRAP, "shop_avro", workload["last_txid"], timeout=600,
              decode=avro_values(cdc_chain))
    runs.until_caught_up(ends, timeout=900 + TRANSACTIONS / 5)
    stop.set()
    reader.join(timeout=60)

    killed = sum(r["killed"] for r in runs.log)
    assert killed >= 1 and seen["polls"] > 0, (
        f"{killed} of {len(runs.log)} runs killed (at least one must be), {seen.get('polls')} "
        f"polls of the replica; runs: {runs.log}")
    # Both outcomes in one report: a replica that differs says more with its torn polls.
    problems = [line for d in compare(SOURCE_URL, TEST_DB_URL, schema) for line in d.first]
    if seen["broken_polls"]:
        problems.append(f"{seen['broken_polls']} of {seen['polls']} polls saw a torn source "
                        f"transaction: {seen['checks']}")
    assert problems == [], (f"{len(runs.log)} runs, {killed} killed, Connect killed at "
                            f"{connect_killed_at:.0f} s: " + "; ".join(problems))
