"""Debezium change events in Avro ([sink] envelope = "debezium", format = "avro"): the
Envelope, Value and Key schemas as Debezium's Postgres connector writes them through
Confluent's AvroConverter (connect.name on Debezium's semantic types, Connect's Decimal as
Avro's decimal), encoded here with fastavro in the Confluent wire format and decoded by the
Encoder as an executor does, schemas from a schemas_dir; no Kafka, no Spark."""

import io
import json
import struct
from datetime import UTC, datetime
from decimal import Decimal

import fastavro
import pytest

from pipeline.config import parse_settings
from pipeline.errors import ConfigError
from pipeline.formats.encode import Encoder
from pipeline.formats.schema_source import SchemaSource
from tests.unit.test_encode import Record

NS = "shop.public.orders"


def semantic(avro_type: str, name: str, **extra) -> dict:
    return {"type": avro_type, "connect.version": 1, "connect.name": name, **extra}


PRICE = semantic("bytes", "org.apache.kafka.connect.data.Decimal", scale=2, precision=10,
                 logicalType="decimal",
                 **{"connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}})


def value_schema(ns: str = NS) -> dict:
    """A source row's Value record: a key, a nullable string, Debezium's MicroTimestamp and
    Date (plain long and int), Connect's Decimal (Avro's decimal) and a ZonedTimestamp."""
    return {"type": "record", "name": "Value", "namespace": ns, "connect.name": f"{ns}.Value",
            "fields": [
                {"name": "id", "type": "long"},
                {"name": "name", "type": ["null", "string"], "default": None},
                {"name": "updated_at", "type": ["null", semantic(
                    "long", "io.debezium.time.MicroTimestamp")], "default": None},
                {"name": "day", "type": semantic("int", "io.debezium.time.Date")},
                {"name": "price", "type": ["null", PRICE], "default": None},
                {"name": "seen", "type": ["null", semantic(
                    "string", "io.debezium.time.ZonedTimestamp")], "default": None}]}


def envelope_schema(ns: str = NS, value: dict | None = None) -> dict:
    """Debezium's Envelope: before (the Value record, written out once) and after (a
    reference to it), source, transaction, op, ts_ms."""
    source = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
              "fields": [{"name": "version", "type": "string"},
                         {"name": "connector", "type": "string"},
                         {"name": "name", "type": "string"},
                         {"name": "ts_ms", "type": "long"},
                         {"name": "db", "type": "string"},
                         {"name": "table", "type": "string"},
                         {"name": "lsn", "type": ["null", "long"], "default": None}],
              "connect.name": "io.debezium.connector.postgresql.Source"}
    block = {"type": "record", "name": "block", "namespace": "event", "connect.version": 1,
             "connect.name": "event.block",
             "fields": [{"name": "id", "type": "string"},
                        {"name": "total_order", "type": "long"},
                        {"name": "data_collection_order", "type": "long"}]}
    return {"type": "record", "name": "Envelope", "namespace": ns, "connect.version": 2,
            "connect.name": f"{ns}.Envelope", "fields": [
                {"name": "before", "type": ["null", value or value_schema(ns)], "default": None},
                {"name": "after", "type": ["null", f"{ns}.Value"], "default": None},
                {"name": "source", "type": source},
                {"name": "transaction", "type": ["null", block], "default": None},
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def key_schema(ns: str = NS) -> dict:
    return {"type": "record", "name": "Key", "namespace": ns, "connect.name": f"{ns}.Key",
            "fields": [{"name": "id", "type": "long"}]}


SOURCE = {"version": "3.1.0.Final", "connector": "postgresql", "name": "shop", "ts_ms": 1,
          "db": "shop", "table": "orders", "lsn": None}


def change(op: str, before: dict | None, after: dict | None) -> dict:
    return {"before": before, "after": after, "source": SOURCE, "transaction": None,
            "op": op, "ts_ms": 2}


def wire(schema_id: int, schema: dict, value) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema, named_schemas={}), value)
    return out.getvalue()


ENVELOPE, KEY, OTHER = 11, 12, 13
COLUMNS = (("id", "long", True), ("name", "string", False), ("updated_at", "timestamp", False),
           ("day", "date", False), ("price", "decimal(10,2)", False),
           ("seen", "timestamp", False))


@pytest.fixture
def schemas(tmp_path):
    other = {"type": "record", "name": "Plain", "fields": [{"name": "id", "type": "long"}]}
    for schema_id, schema in ((ENVELOPE, envelope_schema()), (KEY, key_schema()),
                              (OTHER, other)):
        (tmp_path / f"{schema_id}.avsc").write_text(json.dumps(schema))
    return SchemaSource(schemas_dir=str(tmp_path))


def row(i: int, name: str | None = "a") -> dict:
    return {"id": i, "name": name, "updated_at": 1_700_000_000_123_456 + i, "day": 19_000 + i,
            "price": Decimal("12.34") + i, "seen": "2026-03-01T10:00:00Z"}


def key(i: int) -> bytes:
    return wire(KEY, key_schema(), {"id": i})


def encode(schemas, records):
    return Encoder("debezium_avro", COLUMNS, 1, tombstone_key=("id",),
                   schemas=schemas).encode("t", 0, records)


def dead(out) -> dict[int, tuple[str, str]]:
    return {int(f[2]): (f[7], f[8].rstrip("\n")) for f in (d.split("\t") for d in out.dead)}


def test_creates_reads_and_updates_upsert_the_after_image_deletes_and_tombstones_delete(
        schemas):
    env = envelope_schema()
    out = encode(schemas, [
        Record(0, wire(ENVELOPE, env, change("r", None, row(1))), k=key(1)),
        Record(1, wire(ENVELOPE, env, change("c", None, row(2, None))), k=key(2)),
        Record(2, wire(ENVELOPE, env, change("u", row(1), row(1, "b"))), k=key(1)),
        Record(3, wire(ENVELOPE, env, change("d", row(2), None)), k=key(2)),
        Record(4, None, k=key(2)),  # the tombstone after the delete: by the Avro key
        Record(5, wire(ENVELOPE, env, change("d", None, None)), k=key(7)),  # no before
        Record(6, wire(ENVELOPE, env, change("d", row(8), None)), k=None),  # no key
    ])
    assert out.dead == []
    assert {line.split("\t")[-3] for line in out.rows} == {"\\N"}  # no column left out
    assert [line.split("\t")[4:-3] for line in out.rows] == [
        ["1", "a", "2023-11-14 22:13:20.123457+00:00", "2022-01-09", "13.34",
         "2026-03-01 10:00:00+00:00"],
        ["2", "\\N", "2023-11-14 22:13:20.123458+00:00", "2022-01-10", "14.34",
         "2026-03-01 10:00:00+00:00"],
        ["1", "b", "2023-11-14 22:13:20.123457+00:00", "2022-01-09", "13.34",
         "2026-03-01 10:00:00+00:00"]]
    assert [(t.split("\t")[2], t.split("\t")[4]) for t in out.tombstones] == [
        ("3", "2"), ("4", "2"), ("5", "7"), ("6", "8")]


def test_a_key_of_debeziums_semantic_types_names_the_row_its_create_wrote(tmp_path):
    # A table keyed by a MicroTimestamp and a Date: the Avro key is decoded by its schema's
    # connect.name as the images are, so its tombstone deletes the created row's key.
    fields = [{"name": "at", "type": semantic("long", "io.debezium.time.MicroTimestamp")},
              {"name": "day", "type": semantic("int", "io.debezium.time.Date")}]
    k_schema = {"type": "record", "name": "Key", "namespace": "k", "fields": fields}
    v_schema = {"type": "record", "name": "Value", "namespace": "k",
                "fields": [*fields, {"name": "n", "type": "string"}]}
    env = envelope_schema("k", v_schema)
    for schema_id, schema in ((1, env), (2, k_schema)):
        (tmp_path / f"{schema_id}.avsc").write_text(json.dumps(schema))
    image = {"at": 1_700_000_000_000_001, "day": 19_000, "n": "x"}
    k = wire(2, k_schema, {"at": image["at"], "day": image["day"]})
    out = Encoder("debezium_avro", (("at", "timestamp", True), ("day", "date", True),
                                    ("n", "string", False)), 1, tombstone_key=("at", "day"),
                  schemas=SchemaSource(schemas_dir=str(tmp_path))).encode("t", 0, [
        Record(0, wire(1, env, change("c", None, image)), k=k),
        Record(1, wire(1, env, change("d", {**image, "n": "y"}, None)), k=k),
        Record(2, None, k=k)])
    assert out.dead == []
    created = out.rows[0].split("\t")[4:6]
    assert created == ["2023-11-14 22:13:20.000001+00:00", "2022-01-08"]
    for t in out.tombstones:  # the same instant and day, as key_fields writes them
        at, day = t.split("\t")[4:6]
        assert (datetime.fromisoformat(at), day) == (datetime(2023, 11, 14, 22, 13, 20, 1,
                                                              tzinfo=UTC), "2022-01-08")
    assert len(out.tombstones) == 2


def test_bad_change_events_are_dead_letters_naming_why_and_the_schema_id(schemas):
    env = envelope_schema()
    wrong = {**row(3), "name": None}
    out = encode(schemas, [
        Record(0, b"\x01" + wire(ENVELOPE, env, change("c", None, row(1)))[1:]),
        Record(1, wire(999, env, change("c", None, row(1)))[:5] + b"\x00"),
        Record(2, wire(ENVELOPE, env, change("t", None, None))),
        Record(3, wire(OTHER, {"type": "record", "name": "Plain",
                               "fields": [{"name": "id", "type": "long"}]}, {"id": 1})),
        Record(4, wire(ENVELOPE, env, change("c", None, row(1)))[:-3]),
        Record(5, wire(ENVELOPE, env, change("u", row(1), None))),
        Record(6, wire(ENVELOPE, env, change("d", None, None)), k=b"\x00\x00\x00\x03\xe7zz"),
        Record(7, None, k=None),
        Record(8, wire(ENVELOPE, env, change("c", None, {**wrong, "day": 10**9}))),
    ])
    reasons = dead(out)
    assert {o: t for o, (t, _) in reasons.items()} == {
        0: "bad_magic_byte", 1: "unknown_schema", 2: "unsupported_op", 3: "not_a_change_event",
        4: "corrupt_avro", 5: "not_a_change_event", 6: "bad_tombstone", 7: "bad_tombstone",
        8: "wrong_type"}
    assert reasons[3][1] == (f"value is a record without an 'op' field (writer schema id "
                             f"{OTHER}), not a Debezium change event")
    assert reasons[5][1] == f"op 'u' without an 'after' image (writer schema id {ENVELOPE})"
    assert reasons[6][1].startswith("delete has a Kafka key that is not Avro (")
    assert "999" in reasons[6][1]
    assert reasons[8][1].startswith(f"field 'day' (writer schema id {ENVELOPE}): expected "
                                    "date, got long")
    assert out.rows == [] and out.tombstones == []


def settings(**sink):
    return parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "b:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "schema_registry": {"url": "http://r:8081"},
        "sink": {"table": "t", "columns": {"id": "long"}, "envelope": "debezium",
                 "mode": "upsert", "key": ["id"], **sink}}, environ={})


def test_the_envelope_takes_avro_and_refuses_protobuf():
    s = settings(format="avro").sink
    assert (s.format, s.envelope, s.record_format) == ("avro", "debezium", "debezium_avro")
    with pytest.raises(ConfigError, match="needs sink.format = 'json' or 'avro'"):
        settings(format="protobuf")


def test_unavailable_values_variable_scale_decimals_and_truncates(tmp_path):
    """An unchanged TOASTed value's placeholder (a string; a bytea column's bytes) is NULL
    and named in ``_unavailable``; Debezium's VariableScaleDecimal record {scale, value} is
    decoded into a decimal column; a truncate deletes every key with [sink] truncate =
    "apply" (a tombstone line with NULL key fields)."""
    vsd = {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
           "connect.name": "io.debezium.data.VariableScaleDecimal",
           "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}]}
    v_schema = {"type": "record", "name": "Value", "namespace": "v", "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"]},
        {"name": "blob", "type": ["null", "bytes"]}, {"name": "amount", "type": ["null", vsd]}]}
    env = envelope_schema("v", v_schema)
    (tmp_path / "1.avsc").write_text(json.dumps(env))
    placeholder = "__debezium_unavailable_value"
    out = Encoder("debezium_avro", (("id", "long", True), ("note", "string", True),
                                    ("blob", "string", False),
                                    ("amount", "decimal(20,4)", False)), 1,
                  tombstone_key=("id",), schemas=SchemaSource(schemas_dir=str(tmp_path)),
                  truncate=True).encode("t", 0, [
        Record(0, wire(1, env, change("u", None, {
            "id": 1, "note": placeholder, "blob": placeholder.encode(),
            "amount": {"scale": 3, "value": (-1234567).to_bytes(4, "big", signed=True)}}))),
        Record(1, wire(1, env, change("t", None, None)), k=None)])
    assert out.dead == []
    assert [line.split("\t")[4:-2] for line in out.rows] == [
        ["1", "\\N", "\\N", "-1234.5670", "{note,blob}"]]
    assert [line.split("\t")[2:] for line in out.tombstones] == [
        ["1", "2023-11-14 22:13:20.123000+00", "\\N", "1", "t\n"]]


def test_transactions_names_each_changes_source_transaction_as_in_json(schemas):
    def at(op, before, after, tx=None, table_order=1):
        return {**change(op, before, after), "transaction": None if tx is None else {
            "id": f"{tx}:{100 + table_order}", "total_order": table_order,
            "data_collection_order": table_order}}

    env = envelope_schema()
    encoder = Encoder("debezium_avro", COLUMNS, 1, tombstone_key=("id",), schemas=schemas)
    encoded, sources = encoder.transactions("t", 0, [
        Record(0, wire(ENVELOPE, env, at("r", None, row(1))), k=key(1)),
        Record(1, wire(ENVELOPE, env, at("d", row(1), None, 9, 1)), k=key(1)),
        Record(2, None, k=key(1)),
        Record(3, wire(ENVELOPE, env, at("c", None, row(2), 9, 2)), k=key(2)),
        Record(4, wire(OTHER, {"type": "record", "name": "Plain", "fields": [
            {"name": "id", "type": "long"}]}, {"id": 1}), k=key(3))])
    assert sources == [None, ("9", 1), None, ("9", 2), None]
    assert len(encoded.rows) == 2 and len(encoded.tombstones) == 2 and len(encoded.dead) == 1
    assert encoder.format.sources is None


def test_a_primary_key_changes_create_carries_its_old_avro_key(tmp_path):
    """The create of a primary-key change that left a column out: its ``__debezium.oldkey``
    header (the old key, Avro in the wire format) is staged after ``_unavailable``."""
    (tmp_path / f"{ENVELOPE}.avsc").write_text(json.dumps(envelope_schema()))
    (tmp_path / f"{KEY}.avsc").write_text(json.dumps(key_schema()))
    after = {"id": 1021, "name": "__debezium_unavailable_value", "day": 19_000}
    out = Encoder("debezium_avro", COLUMNS, 1, tombstone_key=("id",),
                  schemas=SchemaSource(schemas_dir=str(tmp_path))).encode("t", 0, [
        Record(0, wire(ENVELOPE, envelope_schema(), change("c", None, after)),
               k=wire(KEY, key_schema(), {"id": 1021}),
               h=[("__debezium.oldkey", wire(KEY, key_schema(), {"id": 21}))]),
        Record(1, wire(ENVELOPE, envelope_schema(), change("c", None, {**after, "id": 7})),
               k=wire(KEY, key_schema(), {"id": 7}))])
    assert out.dead == []
    assert [line.rstrip("\n").split("\t")[-3:] for line in out.rows] == [
        ["{name}", "21", "1"], ["{name}", "\\N", "1"]]
