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


def test_avro_unavailable_values_keep_the_stored_ones_and_variable_scale_decimals_land(
        registry, spark, tmp_path):
    """Through the CLI and the registry: key 1's update leaves its 8,000-character note out
    (Debezium's placeholder string, as the AvroConverter writes it) and keeps it, in a later
    run and within one; its NUMERIC without precision (the VariableScaleDecimal record
    {scale, value}) lands in a decimal(20,4) column. Before: the note was replaced by the
    placeholder, and every record with an amount was a dead letter."""
    from tests.helpers import init_cli, toml_config
    from tests.integration.test_debezium import UNAVAILABLE, cli_ok

    name = unique("dbzavrotoast")
    topic = create_topic(name, 1)
    ns = f"dbz.{name}"
    vsd = {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
           "connect.name": "io.debezium.data.VariableScaleDecimal",
           "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}]}
    value = {"type": "record", "name": "Value", "namespace": ns, "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"]},
        {"name": "amount", "type": ["null", vsd]}]}
    client = registry_client(registry)
    ser = AvroSerializer(client, json.dumps(envelope_schema(ns, value)))
    keys = AvroSerializer(client, json.dumps(key_schema(ns)))
    ctx = SerializationContext(topic, MessageField.VALUE)
    key_ctx = SerializationContext(topic, MessageField.KEY)

    def change(k: int, op: str, note: str, unscaled: int, scale: int) -> tuple[bytes, bytes]:
        after = {"id": k, "note": note, "amount": {
            "scale": scale, "value": unscaled.to_bytes(8, "big", signed=True)}}
        return keys({"id": k}, key_ctx), ser({
            "before": None, "after": after, "source": SOURCE, "transaction": None, "op": op,
            "ts_ms": 0}, ctx)

    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], fmt="raw", extra_sink=(
        'envelope = "debezium"\nmode = "upsert"\nkey = ["id"]\n')).replace(
        'format = "raw"', 'format = "avro"') + (
        '[sink.columns]\nid = "long not null"\nnote = "string"\namount = "decimal(20,4)"\n'
        f'[schema_registry]\nurl = "{registry}"\n'))
    init_cli(config)
    big = "toasted:" + "x" * 8000
    produce(topic, [change(1, "c", big, 12345, 2), change(2, "c", "two", -7, 0),
                    change(2, "u", UNAVAILABLE, 1234567, 6)])
    cli_ok("run", "--config", str(config))
    produce(topic, [change(1, "u", UNAVAILABLE, 5, 1)])
    cli_ok("run", "--config", str(config))
    assert query(f"SELECT id, note, amount FROM {name} ORDER BY id") == [
        (1, big, Decimal("0.5000")), (2, "two", Decimal("1.2346"))]
    assert query("SELECT count(*) FROM pipeline_dead_letters WHERE pipeline = %s",
                 (name,)) == [(0,)]
    assert "verified:" in cli_ok("verify", "--config", str(config))
