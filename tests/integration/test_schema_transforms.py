"""A user transform over Avro and Protobuf records through the real stack and its Schema
Registry (the transform path: the records read and decoded by the built-in sinks' reader
and Encoder, executor/transform/feed.py), held to what the built-in
path does with the same records:

- Avro: v1, a compatible v2 and an incompatible v3 (quantity long -> string), a wrong magic
  byte and an unknown schema id, under a transform that doubles the amount and drops every
  tenth order: the table holds exactly the transformed rows at their offsets; the bad
  records are dead letters with the built-in path's reasons (the v3 ones naming the field
  and schema id).
- Protobuf: v1 and a compatible v2, a wrong magic byte, an unknown id and a truncated
  payload, under the identity transform: exact rows (a timestamp and an enum among them) and
  the three dead letters with their reasons.
- Avro with the registry unreachable: exit 75, nothing committed, as on the built-in path.
"""

from __future__ import annotations

import json
import struct

import pytest
from confluent_kafka.schema_registry import Schema

from pipeline.config import parse_settings
from pipeline.driver.job import run_ingest
from pipeline.errors import EXIT_TRANSIENT, TransientError
from tests.helpers import BOOTSTRAP, TEST_DB_URL, create_topic, produce, stored_offsets, unique
from tests.integration import test_avro_registry as a
from tests.integration import test_protobuf_registry as p
from tests.integration._registry import registry_client
from tests.integration._reliability import init_db

pytestmark = pytest.mark.integration

TRANSFORMS = "tests.integration.transforms.orders"


def settings(name: str, topic: str, url: str, fmt: str, columns: dict, transform: str):
    return init_db(parse_settings({
        "pipeline": {"name": name},
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topics": [topic], "timeout_seconds": 10},
        "database": {"url": TEST_DB_URL},
        "sink": {"format": fmt, "table": name, "max_bad_records": -1, "columns": columns,
                 "transform": f"{TRANSFORMS}:{transform}"},
        "schema_registry": {"url": url, "timeout_seconds": 5},
        "spark": {"master": "local[2]"},
    }, source=f"<test {name}>", environ={}))


def test_a_transform_gets_avro_records_decoded_with_the_built_in_paths_dead_letters(
        registry, spark):
    name = unique("avrotx")
    topic = create_topic(name, partitions=2)
    w = a.Writer(registry, topic)
    ns = f"test.{name}"
    id1, id2 = w.register(a.v1(ns)), w.register(a.v2(ns))
    w.client.set_compatibility(w.subject, "NONE")
    id3 = w.register(a.v3(ns))
    made = [a.order(i, 1 + i % 3) for i in range(300)]  # v1, v2, v3 in turn
    by_version = {v: [(i, m) for i, m in enumerate(made) if i % 3 == v - 1] for v in (1, 2, 3)}
    values: dict[int, bytes] = {}
    for version, doc in ((1, a.v1(ns)), (2, a.v2(ns)), (3, a.v3(ns))):
        encoded = w.serialize(doc, [v for _, (v, _) in by_version[version]])
        values.update(zip([i for i, _ in by_version[version]], encoded, strict=True))
    unknown_id = max(id1, id2, id3) + 100_000
    bad = {b"\x01" + values[0][1:]: "bad_magic_byte",
           values[1][:1] + struct.pack(">I", unknown_id) + values[1][5:]: "unknown_schema"}
    records = [(str(i).encode(), values[i]) for i in range(300)]
    records[150:150] = [(b"bad", v) for v in bad]
    produce(topic, records)

    result = run_ingest(settings(name, topic, registry, "avro", a.COLUMNS, "double_amount"))

    # double_amount: amount * 2, orders whose id is a multiple of 10 left out.
    rows_of = {values[i]: (r[0], r[1], r[2], r[3] * 2, r[4], r[5])
               for i, (_, r) in enumerate(made) if i % 3 != 2 and i % 10 != 0}
    v3_values = {values[i] for i in range(300) if i % 3 == 2}
    assert (result.status, result.records_read, result.dead_letters) == (
        "succeeded", 302, 2 + len(v3_values))
    want = a.by_offset(topic, rows_of)
    assert a.table_rows(name, a.SELECT) == {po: r for po, r in want.items() if type(r) is tuple}
    dead = a.dead_letters(name)
    assert {v: t for t, _, v in dead.values()} == {**bad, **{v: "wrong_type" for v in v3_values}}
    reasons = {t: m for t, m, _ in dead.values()}
    assert "first byte is 0x01" in reasons["bad_magic_byte"], reasons
    assert f"has no schema id {unknown_id}" in reasons["unknown_schema"], reasons
    assert reasons["wrong_type"] == (f"field 'quantity' (writer schema id {id3}): expected "
                                     "long, got string")
    assert stored_offsets(name) == a.log_ends(topic)


def test_a_transform_gets_protobuf_records_decoded_exactly_with_dead_letters(registry, spark):
    name = unique("prototx")
    topic = create_topic(name, partitions=2)
    client = registry_client(registry)
    subject, pkg = f"{topic}-value", f"test.{name}"
    text1, text2 = p.V1.format(pkg=pkg, extra=""), p.V1.format(pkg=pkg, extra=p.CHANNEL)
    id1 = client.register_schema(subject, Schema(text1, "PROTOBUF"))
    id2 = client.register_schema(subject, Schema(text2, "PROTOBUF"))
    made = ([p.order(p.order_class(text1, pkg), i, False) for i in range(100)]
            + [p.order(p.order_class(text2, pkg), i, True) for i in range(100, 200)])
    values = [struct.pack(">bI", 0, id1 if i < 100 else id2) + p.ORDER_INDEXES
              + m.SerializeToString() for i, (m, _) in enumerate(made)]
    unknown_id = max(id1, id2) + 100_000
    bad = {b"\x01" + values[0][1:]: "bad_magic_byte",
           values[1][:1] + struct.pack(">I", unknown_id) + values[1][5:]: "unknown_schema",
           values[101][:-3]: "corrupt_protobuf"}
    records = [(str(i).encode(), v) for i, v in enumerate(values)]
    records[100:100] = [(b"bad", v) for v in bad]
    produce(topic, records)

    result = run_ingest(settings(name, topic, registry, "protobuf", p.COLUMNS, "identity"))

    assert (result.status, result.records_read, result.rows_written, result.dead_letters) == (
        "succeeded", 203, 200, 3)
    want = a.by_offset(topic, dict(zip(values, [r for _, r in made], strict=True)))
    assert p.table_rows(name, p.SELECT) == {po: r for po, r in want.items() if type(r) is tuple}
    dead = a.dead_letters(name)
    assert {v: t for t, _, v in dead.values()} == bad
    reasons = {t: m for t, m, _ in dead.values()}
    assert (f"does not decode as {pkg}.Order of writer schema id {id2}"
            in reasons["corrupt_protobuf"]), reasons
    assert json.dumps(sorted(reasons)) == json.dumps(sorted(bad.values()))
    assert stored_offsets(name) == a.log_ends(topic)


def test_a_transform_over_avro_with_the_registry_unreachable_is_exit_75_nothing_committed(
        registry, spark):
    name = unique("avrotx_down")
    topic = create_topic(name, partitions=2)
    w = a.Writer(registry, topic)
    ns = f"test.{name}"
    w.register(a.v1(ns))
    made = [a.order(i, 1) for i in range(50)]
    produce(topic, [(str(i).encode(), v) for i, v in enumerate(
        w.serialize(a.v1(ns), [v for v, _ in made]))])
    down = settings(name, topic, f"http://127.0.0.1:{p.closed_port()}/apis/ccompat/v7", "avro",
                    a.COLUMNS, "identity")

    with pytest.raises(TransientError) as e:
        run_ingest(down)

    assert e.value.exit_code == EXIT_TRANSIENT
    assert "unreachable fetching schema id" in str(e.value), str(e.value)
    assert stored_offsets(name) == {} and a.table_rows(name, a.SELECT) == {}
    assert a.dead_letters(name) == {}
