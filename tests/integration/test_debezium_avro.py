"""Debezium change events in Avro through the real stack and its Schema Registry ([sink]
envelope = "debezium", format = "avro", an upsert sink): values and keys written by
confluent-kafka's AvroSerializer as Debezium's AvroConverter writes them (the Envelope
under ``<topic>-value``, the Key record under ``<topic>-key``, each with its own schema
id; Debezium's MicroTimestamp and Date as plain long and int named by connect.name,
Connect's Decimal as Avro's decimal). A generated stream of snapshot reads, creates,
updates and deletes over 150 keys (half the deletes followed by their tombstone), read in
two runs with events produced in between: the table equals the source table's final
state; a replay of every range from offset 0 changes nothing."""

from __future__ import annotations

import json
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pipeline.config import parse_settings
from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.plan.offsets import OffsetRange
from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    create_topic,
    produce,
    query,
    stored_offsets,
    unique,
    watermarks,
)
from tests.integration._registry import registry_client
from tests.integration._reliability import init_db
from tests.unit.test_debezium_avro import SOURCE, envelope_schema, key_schema

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, tzinfo=UTC)
COLUMNS = {"id": "long not null", "name": "string", "updated_at": "timestamp",
           "day": "date", "price": "decimal(10,2)"}


class Serializers:
    """Debezium's AvroConverter as confluent-kafka's serializers: value and key, each
    registered under its subject on first use."""

    def __init__(self, url: str, topic: str, ns: str):
        client = registry_client(url)
        self.value = AvroSerializer(client, json.dumps(envelope_schema(ns)))
        self.key = AvroSerializer(client, json.dumps(key_schema(ns)))
        self.value_ctx = SerializationContext(topic, MessageField.VALUE)
        self.key_ctx = SerializationContext(topic, MessageField.KEY)

    def record(self, k: int, op: str | None, before: dict | None, after: dict | None
               ) -> tuple[bytes, bytes | None]:
        key = self.key({"id": k}, self.key_ctx)
        if op is None:  # the tombstone after a delete
            return key, None
        return key, self.value({"before": before, "after": after, "source": SOURCE,
                                "transaction": None, "op": op, "ts_ms": 0}, self.value_ctx)


def image(row: dict) -> dict:
    """A source row as Debezium's Avro converter writes it (microseconds, days)."""
    at = row["updated_at"] - T0
    return {"id": row["id"], "name": row["name"],
            "updated_at": int(T0.timestamp()) * 1_000_000 + at // timedelta(microseconds=1),
            "day": (row["day"] - date(1970, 1, 1)).days, "price": row["price"],
            "seen": None}


def stream(ser: Serializers, rng: random.Random, state: dict[int, dict], n: int,
           start: int) -> list:
    """n change events against ``state`` (the source table), which they update."""
    out = []
    for step in range(start, start + n):
        k = rng.randrange(150)
        row = {"id": k, "name": f"n{k}-{step}\t\"x\"" if step % 5 else None,
               "updated_at": T0 + timedelta(microseconds=7_001 * step),
               "day": date(2026, 1, 1) + timedelta(days=step % 400),
               "price": Decimal(rng.randrange(-10**6, 10**6)).scaleb(-2)}
        old = state.get(k)
        if old is None:
            op = "r" if start == 0 and step < 50 else "c"
            out.append(ser.record(k, op, None, image(row)))
            state[k] = row
        elif rng.random() < 0.75:
            out.append(ser.record(k, "u", image(old), image(row)))
            state[k] = row
        else:
            out.append(ser.record(k, "d", image(old), None))
            if rng.random() < 0.5:  # its tombstone (unless tombstones.on.delete = false)
                out.append(ser.record(k, None, None, None))
            del state[k]
    return out


def expected(state: dict[int, dict]) -> list[tuple]:
    return sorted((k, r["name"], r["updated_at"], r["day"], r["price"])
                  for k, r in state.items())


def test_an_avro_debezium_stream_lands_as_the_source_tables_final_state_and_a_replay_is_a_noop(
        registry, spark):
    rng = random.Random(2626)
    name = unique("dbzavro")
    topic = create_topic(name, 2)
    ser = Serializers(registry, topic, f"dbz.{name}")
    settings = init_db(parse_settings({
        "pipeline": {"name": name},
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topics": [topic], "timeout_seconds": 10},
        "database": {"url": TEST_DB_URL},
        "sink": {"format": "avro", "envelope": "debezium", "table": name, "mode": "upsert",
                 "key": ["id"], "columns": COLUMNS},
        "schema_registry": {"url": registry, "timeout_seconds": 5},
        "spark": {"master": "local[2]"}}, source=f"<test {name}>", environ={}))
    state: dict[int, dict] = {}
    select = f"SELECT id, name, updated_at, day, price FROM {name} ORDER BY id"

    produce(topic, stream(ser, rng, state, 400, 0))
    first = run_ingest(settings)
    assert first.dead_letters == 0
    assert query(select) == expected(state)

    produce(topic, stream(ser, rng, state, 400, 400))
    second = run_ingest(settings)
    assert second.dead_letters == 0 and second.rows_deleted > 0
    assert query(select) == expected(state)
    ends = {p: hi for p, (_, hi) in watermarks(topic).items()}
    assert stored_offsets(name) == {(topic, p): hi for p, hi in ends.items()}

    # A replay of every range from offset 0 (a backfill): not one row or deletion written.
    def snapshot() -> tuple:
        return (query(f"SELECT *, xmin::text FROM {name} ORDER BY id"),
                query(f"SELECT *, xmin::text FROM {name}_deleted ORDER BY id"))

    before = snapshot()
    replay = run_backfill(settings, [OffsetRange(topic, p, 0, hi) for p, hi in ends.items()])
    assert replay.records_read == sum(ends.values())
    assert (replay.rows_written, replay.rows_deleted, replay.dead_letters) == (0, 0, 0)
    assert snapshot() == before
    assert query(select) == expected(state)
