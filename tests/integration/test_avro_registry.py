"""The avro format end to end through the stack's real Schema Registry (Apicurio, speaking
the Confluent API; scripts/registry): records written by confluent-kafka's AvroSerializer
under subject ``<topic>-value``, read by the pipeline with ``[schema_registry] url``.

- v1, then a BACKWARD-compatible v2 (an optional field added, an optional field removed),
  plus a wrong magic byte and an id the registry never issued: one run lands every good
  record exactly at its offset, the two bad ones are dead letters with their reasons.
- an incompatible v3 (a declared column's field turned from long to string), registered
  once the subject's compatibility is NONE: its records are dead letters naming the field
  and schema id (README's Avro table), the v2 records around them land.
- the registry stopped before a run whose schema ids no executor has fetched: exit 75,
  nothing committed; restarted: the rerun is exact.
- an upsert sink keyed by a column: the newest record per key across runs and versions.
"""

from __future__ import annotations

import json
import struct
import subprocess

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pipeline.driver.job import run_ingest
from pipeline.errors import EXIT_TRANSIENT, TransientError
from tests.helpers import (
    ROOT,
    create_topic,
    produce,
    query,
    stored_offsets,
    unique,
)
from tests.integration._registry import (
    assert_rows_and_dead_letters,
    by_offset,
    dead_letters,
    log_ends,
    registry_client,
    registry_settings,
    table_rows,
)

pytestmark = pytest.mark.integration


def schema(namespace: str, fields: list[dict]) -> dict:
    return {"type": "record", "name": "Order", "namespace": namespace, "fields": fields}


BASE = [{"name": "order_id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "quantity", "type": "long"},
        {"name": "amount", "type": "double"}]
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
CHANNEL = {"name": "channel", "type": ["null", "string"], "default": None}
QTY_TEXT = {"name": "quantity", "type": "string"}


def v1(ns: str) -> dict:
    return schema(ns, BASE + [NOTE])


def v2(ns: str) -> dict:  # BACKWARD-compatible with v1: note removed, channel added
    return schema(ns, BASE + [CHANNEL])


def v3(ns: str) -> dict:  # incompatible: quantity long -> string
    return schema(ns, [f if f["name"] != "quantity" else QTY_TEXT for f in BASE] + [CHANNEL])


COLUMNS = {"order_id": "long not null", "customer": "string not null", "quantity": "long",
           "amount": "double", "note": "string", "channel": "string"}
SELECT = "order_id, customer, quantity, amount, note, channel"


def order(i: int, version: int, status: str = "") -> tuple[dict, tuple]:
    """(the record for writer schema ``version``, the row it must become)."""
    value = {"order_id": i, "customer": f"c{i % 13}{status}", "quantity": i % 7,
             "amount": i + 0.5}
    if version == 1:
        value["note"] = f"n{i}" if i % 3 == 0 else None
        return value, (i, value["customer"], i % 7, i + 0.5, value["note"], None)
    value["channel"] = "app" if i % 2 else None
    if version == 3:
        value["quantity"] = str(i % 7)
    return value, (i, value["customer"], i % 7, i + 0.5, None, value["channel"])


class Writer:
    """confluent-kafka's AvroSerializer for one topic's ``<topic>-value`` subject."""

    def __init__(self, url: str, topic: str):
        self.client = registry_client(url)
        self.topic, self.subject = topic, f"{topic}-value"
        self.ctx = SerializationContext(topic, MessageField.VALUE)

    def register(self, doc: dict) -> int:
        return self.client.register_schema(self.subject, Schema(json.dumps(doc), "AVRO"))

    def serialize(self, doc: dict, values: list[dict]) -> list[bytes]:
        # auto.register off: the schema must be the registered one (the test registers each
        # version itself, so compatibility is the registry's call, not the serializer's).
        ser = AvroSerializer(self.client, json.dumps(doc),
                             conf={"auto.register.schemas": False, "use.latest.version": False})
        return [ser(v, self.ctx) for v in values]


def settings(name: str, topic: str, url: str, **sink):
    return registry_settings("avro", name, topic, url, COLUMNS, **sink)


def test_evolution_through_the_registry_lands_exactly_and_bad_records_are_dead_letters(
        registry, spark):
    name = unique("avroreg")
    topic = create_topic(name, partitions=2)
    w = Writer(registry, topic)
    ns = f"test.{name}"
    id1 = w.register(v1(ns))
    id2 = w.register(v2(ns))  # the registry's BACKWARD check passes it
    assert id2 != id1 and w.client.get_versions(w.subject) == [1, 2]

    first = [order(i, 1) for i in range(300)]
    second = [order(i, 2) for i in range(300, 600)]
    values = (w.serialize(v1(ns), [v for v, _ in first])
              + w.serialize(v2(ns), [v for v, _ in second]))
    assert {v[1:5] for v in values} == {struct.pack(">I", id1), struct.pack(">I", id2)}
    rows_of = dict(zip(values, [r for _, r in first + second], strict=True))
    unknown_id = max(id1, id2) + 100_000
    bad = {b"\x01" + values[0][1:]: "bad_magic_byte",
           values[1][:1] + struct.pack(">I", unknown_id) + values[1][5:]: "unknown_schema"}
    records = [(str(i).encode(), v) for i, v in enumerate(values)]
    records[300:300] = [(b"bad", v) for v in bad]  # between the versions
    produce(topic, records)
    s = settings(name, topic, registry)

    result = run_ingest(s)

    assert (result.status, result.records_read, result.rows_written, result.dead_letters) == (
        "succeeded", 602, 600, 2)
    dead, _ = assert_rows_and_dead_letters(name, topic, SELECT, rows_of, bad, unknown_id)

    # An incompatible v3: the registry refuses it under BACKWARD; the subject set to NONE,
    # it is registered, and its records (among v2 ones) become dead letters.
    assert w.client.test_compatibility(w.subject, Schema(json.dumps(v3(ns)), "AVRO")) is False
    w.client.set_compatibility(w.subject, "NONE")
    id3 = w.register(v3(ns))
    assert id3 not in (id1, id2)
    more = [order(i, 2 + i % 2) for i in range(600, 700)]  # odd ids v3
    third = (w.serialize(v2(ns), [v for v, _ in more[0::2]])
             + w.serialize(v3(ns), [v for v, _ in more[1::2]]))
    produce(topic, [(str(i).encode(), v) for i, v in enumerate(third)])

    result = run_ingest(s)

    assert (result.records_read, result.rows_written, result.dead_letters) == (100, 50, 50)
    rows_of.update(zip(third[:50], [r for _, r in more[0::2]], strict=True))
    want = by_offset(topic, rows_of)
    assert table_rows(name, SELECT) == {po: r for po, r in want.items() if type(r) is tuple}
    v3_dead = {po: d for po, d in dead_letters(name).items() if po not in dead}
    assert sorted(v for _, _, v in v3_dead.values()) == sorted(third[50:])
    assert {(t, m) for t, m, _ in v3_dead.values()} == {(
        "wrong_type", f"field 'quantity' (writer schema id {id3}): expected long, got string")}
    assert stored_offsets(name) == log_ends(topic)


def test_a_stopped_registry_is_exit_75_and_the_rerun_after_its_restart_is_exact(
        registry, spark):
    name = unique("avroreg_down")
    topic = create_topic(name, partitions=2)
    w = Writer(registry, topic)
    ns = f"test.{name}"  # schemas of their own: ids no executor has fetched yet
    w.register(v1(ns))
    w.register(v2(ns))
    produced = [order(i, 1 + i % 2) for i in range(200)]
    values = (w.serialize(v1(ns), [v for v, _ in produced[0::2]])
              + w.serialize(v2(ns), [v for v, _ in produced[1::2]]))
    rows = [r for _, r in produced[0::2]] + [r for _, r in produced[1::2]]
    produce(topic, [(str(i).encode(), v) for i, v in enumerate(values)])
    s = settings(name, topic, registry)
    script = str(ROOT / "scripts" / "registry")

    subprocess.run([script, "down"], check=True)
    try:
        with pytest.raises(TransientError) as e:
            run_ingest(s)
    finally:
        subprocess.run([script, "up"], check=True)

    assert e.value.exit_code == EXIT_TRANSIENT
    assert "unreachable fetching schema id" in str(e.value), str(e.value)
    assert stored_offsets(name) == {} and query(f"SELECT count(*) FROM {name}") == [(0,)]
    assert dead_letters(name) == {}

    result = run_ingest(s)

    assert (result.status, result.rows_written, result.dead_letters) == ("succeeded", 200, 0)
    want = by_offset(topic, dict(zip(values, rows, strict=True)))
    assert table_rows(name, SELECT) == want
    assert stored_offsets(name) == log_ends(topic)


def test_an_avro_upsert_keeps_the_newest_record_per_key_across_runs(registry, spark):
    name = unique("avroreg_ups")
    topic = create_topic(name, partitions=3)
    w = Writer(registry, topic)
    ns = f"test.{name}"
    w.register(v1(ns))
    w.register(v2(ns))
    s = settings(name, topic, registry, mode="upsert", key=["order_id"])
    keys = range(150)

    # Run 1: every key in v1; run 2: every other key again, in v2, with a new customer.
    first = [order(k, 1) for k in keys]
    produce(topic, [(str(k).encode(), v) for k, v in zip(
        keys, w.serialize(v1(ns), [v for v, _ in first]), strict=True)])
    assert run_ingest(s).rows_written == 150
    second = [order(k, 2, status="'") for k in keys if k % 2 == 0]
    produce(topic, [(str(v["order_id"]).encode(), b) for (v, _), b in zip(
        second, w.serialize(v2(ns), [v for v, _ in second]), strict=True)])
    assert run_ingest(s).rows_written == 75

    newest = {r[0]: r for _, r in first} | {r[0]: r for _, r in second}
    got = {r[0]: r for r in query(f"SELECT {SELECT} FROM {name}")}
    assert got == newest
    assert stored_offsets(name) == log_ends(topic)
