"""Debezium change events through the real stack ([sink] envelope = "debezium", an upsert
sink): a generated stream of snapshot reads, creates, updates and deletes (half of the
deletes followed by their tombstone, as Debezium writes them by default) over 150 keys,
half the keys' events in Kafka Connect's schema envelope (timestamps as epoch
milliseconds, decimals as base64 bytes) and half without (ISO strings, decimal strings),
read in two runs with events produced in between: the table equals the source table's
final state; a replay of every range from offset 0 changes nothing (not one row
rewritten). And a table keyed by a date, a timestamp and a decimal: its deletes and
tombstones, keys in the schema envelope, delete the rows their creates wrote."""

from __future__ import annotations

import base64
import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.plan.offsets import OffsetRange
from tests.helpers import (
    create_topic,
    init_db,
    make_settings,
    produce,
    query,
    stored_offsets,
    unique,
    watermarks,
)

pytestmark = pytest.mark.integration

COLUMNS = {"id": "long not null", "name": "string", "updated_at": "timestamp",
           "price": "decimal(10,2)", "city": {"type": "string", "from": "address.city"}}
T0 = datetime(2026, 3, 1, tzinfo=UTC)
FIELDS = [{"field": "id", "type": "int64"}, {"field": "name", "type": "string"},
          {"field": "updated_at", "type": "int64", "name": "io.debezium.time.Timestamp"},
          {"field": "price", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
           "parameters": {"scale": "2"}},
          {"field": "address", "type": "struct", "fields": [{"field": "city",
                                                              "type": "string"}]}]
SCHEMA = {"type": "struct", "name": "shop.orders.Envelope", "fields": [
    {"field": "before", "type": "struct", "fields": FIELDS},
    {"field": "after", "type": "struct", "fields": FIELDS},
    {"field": "op", "type": "string"}]}
KEY_SCHEMA = {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}


def image(row: dict, envelope: bool) -> dict:
    """A source row as Debezium's JSON converter writes it."""
    if not envelope:
        return {**row, "updated_at": row["updated_at"].isoformat(), "price": str(row["price"])}
    cents = int(row["price"] * 100)
    return {**row, "updated_at": int(row["updated_at"].timestamp() * 1000),
            "price": base64.b64encode(cents.to_bytes(8, "big", signed=True)).decode()}


def record(k: int, op: str, before: dict | None, after: dict | None,
           envelope: bool) -> tuple[bytes, bytes]:
    payload = {"before": before and image(before, envelope),
               "after": after and image(after, envelope), "op": op,
               "source": {"connector": "postgresql", "table": "orders"}, "ts_ms": 0}
    key = {"id": k}
    if envelope:
        payload = {"schema": SCHEMA, "payload": payload}
        key = {"schema": KEY_SCHEMA, "payload": key}
    return json.dumps(key).encode(), json.dumps(payload).encode()


def stream(rng: random.Random, state: dict[int, dict], n: int, start: int) -> list:
    """n change events against ``state`` (the source table), which they update."""
    out = []
    for step in range(start, start + n):
        k = rng.randrange(150)
        # One converter setting per key: its Kafka key's bytes, so its partition, stay the
        # same (a connector writes a topic with one setting; both kinds share one here).
        envelope = k % 2 == 0
        row = {"id": k, "name": f"n{k}-{step}\t\"x\"",
               "updated_at": T0 + timedelta(milliseconds=7 * step),
               "price": Decimal(rng.randrange(-10**6, 10**6)).scaleb(-2),
               "address": {"city": f"c{step % 9}"} if step % 4 else None}
        old = state.get(k)
        if old is None:
            op = "r" if start == 0 and step < 50 else "c"
            out.append((k, record(k, op, None, row, envelope)))
            state[k] = row
        elif rng.random() < 0.75:
            out.append((k, record(k, "u", old, row, envelope)))
            state[k] = row
        else:
            out.append((k, record(k, "d", old, None, envelope)))
            if rng.random() < 0.5:  # its tombstone (unless tombstones.on.delete = false)
                out.append((k, (record(k, "d", old, None, envelope)[0], None)))
            del state[k]
    return [r for _, r in out]


def expected(state: dict[int, dict]) -> list[tuple]:
    return sorted((k, r["name"], r["updated_at"], r["price"],
                   (r["address"] or {}).get("city")) for k, r in state.items())


def test_a_debezium_stream_lands_as_the_source_tables_final_state_and_a_replay_is_a_noop(
        spark):
    rng = random.Random(26)
    name = unique("dbz")
    topic = create_topic(name, 2)
    settings = init_db(make_settings(name, [topic], sink={
        "envelope": "debezium", "mode": "upsert", "key": ["id"], "columns": COLUMNS}))
    state: dict[int, dict] = {}
    select = f"SELECT id, name, updated_at, price, city FROM {name} ORDER BY id"

    produce(topic, stream(rng, state, 400, 0))
    first = run_ingest(settings)
    assert first.dead_letters == 0
    assert query(select) == expected(state)

    produce(topic, stream(rng, state, 400, 400))
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


def test_deletes_of_rows_keyed_by_a_date_a_timestamp_and_a_decimal_delete_them(spark):
    # Key and value in the schema envelope: the key is decoded by its own schema as the
    # images are (before: still days, microseconds, base64, so every delete a dead letter).
    key_fields = [{"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
                  {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
                  {"field": "ref", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": "2"}}]
    fields = key_fields + [{"field": "n", "type": "string"}]
    schema = {"type": "struct", "fields": [{"field": i, "type": "struct", "fields": fields}
                                           for i in ("before", "after")]}

    def key_of(k: int) -> dict:
        return {"day": 19_000 + k, "at": 1_700_000_000_000_000 + k,
                "ref": base64.b64encode((1234 + k).to_bytes(4, "big", signed=True)).decode()}

    def enveloped(fields_or_schema, payload) -> bytes:
        return json.dumps({"schema": fields_or_schema, "payload": payload}).encode()

    def change(k: int, op: str, before: dict | None, after: dict | None) -> bytes:
        return enveloped(schema, {"before": before, "after": after, "op": op})

    creates, deletes = [], []
    for k in range(6):
        key = enveloped({"type": "struct", "fields": key_fields}, key_of(k))
        row = {**key_of(k), "n": f"n{k}"}
        creates.append((key, change(k, "c", None, row)))
        if k < 4:  # deleted: by its before image (0, 1, 2, and 0, 1 tombstoned), by its key (3)
            deletes.append((key, change(k, "d", row if k < 3 else None, None)))
            if k < 2:
                deletes.append((key, None))
    name = unique("dbzkeys")
    topic = create_topic(name, 1)
    settings = init_db(make_settings(name, [topic], sink={
        "envelope": "debezium", "mode": "upsert", "key": ["day", "at", "ref"],
        "columns": {"day": "date not null", "at": "timestamp not null",
                    "ref": "decimal(8,2) not null", "n": "string"}}))
    select = f"SELECT day::text, at, ref, n FROM {name} ORDER BY n"

    def rows(ks) -> list[tuple]:
        return [(f"2022-01-{8 + k:02d}", datetime(2023, 11, 14, 22, 13, 20, k, tzinfo=UTC),
                 Decimal(1234 + k).scaleb(-2), f"n{k}") for k in ks]

    produce(topic, creates)
    assert run_ingest(settings).rows_written == 6 and query(select) == rows(range(6))
    produce(topic, deletes)  # in a later run: the rows are in the table to delete
    result = run_ingest(settings)
    assert (result.dead_letters, result.rows_deleted) == (0, 4)
    assert query(select) == rows((4, 5))
