"""Change events captured from the real chain (tests/unit/debezium_events/) through the
Encoder, with the columns their own writer schema maps to (schema_columns.py): a NUMERIC
without precision lands with its scale, a jsonb column holds the document (not a string
holding it), a timestamp without time zone is taken as UTC, a TOASTed value left out is
named, a truncate deletes every key; JSON and Avro alike."""

from __future__ import annotations

import base64
import json

import pytest

from pipeline.formats.debezium.schema_columns import from_avro, from_connect
from pipeline.formats.encode import Encoder
from pipeline.formats.schema_source import SchemaSource
from pipeline.sample_shop_replica import KEYS
from tests.unit.test_encode import Record
from tests.unit.test_schema_columns import CAPTURED_AVRO, CAPTURED_JSON, avro_schema

PREFS = '{"lang":"de","tags":["b2b","vip"],"newsletter":false}'
# (topic's table, record index) -> the row's fields after the coordinates and Kafka
# timestamp, up to the columns a change left out (_unavailable); JSON's timestamps as
# Debezium wrote them, Avro's as datetimes write them: the same instants.
ROWS = {
    ("accounts", -1): (["9", "8", "156410.416", "2026-01-01"], "\\N"),
    ("customers", -1): (["26", "customer 26 v111", "c26@shop.example", "\\N", PREFS],
                        "{profile}"),
    ("order_lines", -1): (["5", "1", "SKU-0168", "8", "396.70", "3173.60"], "\\N"),
    ("orders", 0): (["1", "6", "placed", "5100.84", "2"], "\\N"),
}


def columns_of(w) -> list[tuple]:
    return [(c.name, c.type, c.required) for c in w.columns]


def json_encoded(table: str, i: int):
    r = CAPTURED_JSON[f"shop_json.public.{table}"][i]
    key = json.loads(r["key"]) if r["key"] else None
    w = from_connect(json.loads(r["value"])["schema"], key and key["schema"])
    enc = Encoder("debezium", columns_of(w), 1, tombstone_key=w.key or ("id",), truncate=True)
    return enc.encode("t", 0, [Record(r["offset"], r["value"].encode(),
                                      k=r["key"] and r["key"].encode())])


@pytest.fixture(scope="module")
def schemas(tmp_path_factory) -> SchemaSource:
    folder = tmp_path_factory.mktemp("schemas")
    for schema_id, text in CAPTURED_AVRO["schemas"].items():
        (folder / f"{schema_id}.avsc").write_text(text)
    return SchemaSource(schemas_dir=str(folder))


def avro_encoded(schemas: SchemaSource, table: str, i: int):
    r = CAPTURED_AVRO["records"][f"shop_avro.public.{table}"][i]
    value = base64.b64decode(r["value"])
    key = base64.b64decode(r["key"]) if r["key"] else None
    w = from_avro(avro_schema(value), avro_schema(key))
    enc = Encoder("debezium_avro", columns_of(w), 1, tombstone_key=w.key, schemas=schemas)
    return enc.encode("t", 0, [Record(r["offset"], value, k=key)])


@pytest.mark.parametrize("table, i", list(ROWS))
def test_a_captured_event_lands_by_its_schemas_columns_in_json_and_avro(schemas, table, i):
    fields, unavailable = ROWS[(table, i)]
    for out in (json_encoded(table, i), avro_encoded(schemas, table, i)):
        assert out.dead == [] and len(out.rows) == 1
        row = out.rows[0].rstrip("\n").split("\t")
        keys = len(KEYS.get(table, ("id",)))  # then the old key's fields: none (NULL)
        assert row[4:4 + len(fields)] == fields and row[-2 - keys:] == [
            unavailable, *["\\N"] * keys, "1"]


def test_timestamps_with_and_without_time_zone_are_the_same_instants_in_utc(schemas):
    json_row = json_encoded("orders", 0).rows[0].split("\t")
    avro_row = avro_encoded(schemas, "orders", 0).rows[0].split("\t")
    # placed_at (timestamptz, ZonedTimestamp) and updated_at (timestamp, MicroTimestamp).
    assert json_row[9:11] == ["2026-01-01T00:00:01.007764Z", "2026-01-01T00:00:01.007764+00:00"]
    assert avro_row[9:11] == ["2026-01-01 00:00:01.007764+00:00"] * 2


def test_the_column_the_source_added_is_read_from_the_later_events(schemas):
    json_row = json_encoded("orders", -1).rows[0].split("\t")
    avro_row = avro_encoded(schemas, "orders", -1).rows[0].split("\t")
    assert json_row[4:7] == ["5", "18", "shipped"] and json_row[11] == "\\N"  # channel null
    assert avro_row[4:7] == ["10", "6", "placed"] and avro_row[11] == "store"


def test_a_captured_truncate_deletes_every_key():
    out = json_encoded("carts", 1)
    assert out.rows == [] and out.dead == []
    assert [t.split("\t")[4] for t in out.tombstones] == ["\\N"]  # every key


def test_a_json_documents_text_stays_a_string_in_a_string_column(schemas):
    r = CAPTURED_JSON["shop_json.public.customers"][-1]
    enc = Encoder("debezium", (("id", "long", True), ("prefs", "string", False)), 1,
                  tombstone_key=("id",))
    out = enc.encode("t", 0, [Record(0, r["value"].encode(), k=r["key"].encode())])
    assert out.rows[0].split("\t")[5] == json.loads(r["value"])["payload"]["after"]["prefs"]
