"""A Debezium topic's columns from its writer's schema (formats/debezium/schema_columns.py):
on schemas captured from the real chain (tests/unit/debezium_events/: the sample shop
through Debezium 3.6.1, Kafka Connect's JSON envelope and Avro through the registry), and
on the Connect types the shop does not have, in both encodings alike."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import fastavro
import pytest

from pipeline.formats.debezium.schema_columns import (
    NotAnEnvelope,
    SchemaColumn,
    Unmapped,
    WriterColumns,
    from_avro,
    from_connect,
)

EVENTS = Path(__file__).parent / "debezium_events"
CAPTURED_JSON = json.loads((EVENTS / "shop_json.json").read_text())["records"]
CAPTURED_AVRO = json.loads((EVENTS / "shop_avro.json").read_text())


def C(name: str, type_: str, required: bool = True) -> SchemaColumn:
    return SchemaColumn(name, type_, required)


ORDERS = (C("id", "long"), C("customer_id", "long"), C("status", "string"),
          C("total", "decimal(14,2)"), C("line_count", "int"), C("placed_at", "timestamp"),
          C("updated_at", "timestamp"))
SHOP = {
    "orders": WriterColumns(ORDERS, ("id",)),
    "accounts": WriterColumns((C("id", "long"), C("customer_id", "long", False),
                               C("balance", "decimal"), C("opened_on", "date"),
                               C("updated_at", "timestamp")), ("id",)),
    "customers": WriterColumns((C("id", "long"), C("name", "string"), C("email", "string"),
                                C("profile", "string"), C("prefs", "jsonb"),
                                C("created_at", "timestamp"), C("updated_at", "timestamp")),
                               ("id",)),
    "order_lines": WriterColumns((C("order_id", "long"), C("line_no", "int"),
                                  C("sku", "string"), C("qty", "int"),
                                  C("unit_price", "decimal(10,2)"),
                                  C("amount", "decimal(12,2)")), ("order_id", "line_no")),
    "carts": WriterColumns((C("id", "long"), C("customer_id", "long"), C("sku", "string"),
                            C("qty", "int"), C("added_at", "timestamp")), ("id",)),
}
# The workload adds orders.channel (text, nullable) mid-stream: the later events have it.
WITH_CHANNEL = WriterColumns((*ORDERS, C("channel", "string", False)), ("id",))


def json_columns(record: dict) -> WriterColumns:
    value = json.loads(record["value"])
    key = json.loads(record["key"]) if record["key"] else None
    return from_connect(value["schema"], key and key["schema"])


def avro_schema(data: bytes | None):
    """The writer schema of a Confluent-framed value or key, parsed as the pipeline parses
    it (formats/avro/schemas.py), or None."""
    if data is None:
        return None
    text = CAPTURED_AVRO["schemas"][str(int.from_bytes(data[1:5], "big"))]
    return fastavro.parse_schema(json.loads(text), named_schemas={})


def avro_columns(record: dict) -> WriterColumns:
    key = base64.b64decode(record["key"]) if record["key"] else None
    return from_avro(avro_schema(base64.b64decode(record["value"])), avro_schema(key))


@pytest.mark.parametrize("table", list(SHOP))
def test_the_shops_tables_map_from_captured_json_and_avro_alike(table):
    json_records = CAPTURED_JSON[f"shop_json.public.{table}"]
    avro_records = CAPTURED_AVRO["records"][f"shop_avro.public.{table}"]
    want = WITH_CHANNEL if table == "orders" else SHOP[table]
    # The last captured record of each table: orders' has the added column.
    assert json_columns(json_records[-1 if table != "carts" else 0]) == want
    assert avro_columns(avro_records[-1]) == want


def test_the_column_added_mid_stream_is_in_the_later_writers_schema_only():
    first_json, *_, last_json = CAPTURED_JSON["shop_json.public.orders"]
    first_avro, *_, last_avro = CAPTURED_AVRO["records"]["shop_avro.public.orders"]
    assert json_columns(first_json) == avro_columns(first_avro) == SHOP["orders"]
    assert json_columns(last_json) == avro_columns(last_avro) == WITH_CHANNEL


def test_a_truncate_has_the_tables_schema_but_no_key():
    truncate = CAPTURED_JSON["shop_json.public.carts"][1]
    assert json.loads(truncate["value"])["payload"]["op"] == "t"
    assert json_columns(truncate) == WriterColumns(SHOP["carts"].columns, ())


def test_an_avro_schema_maps_the_same_parsed_or_as_its_json_text():
    record = CAPTURED_AVRO["records"]["shop_avro.public.accounts"][-1]
    value, key = (base64.b64decode(record[k]) for k in ("value", "key"))
    texts = [json.loads(CAPTURED_AVRO["schemas"][str(int.from_bytes(b[1:5], "big"))])
             for b in (value, key)]
    assert from_avro(*texts) == avro_columns(record) == SHOP["accounts"]


# ---- the Connect types the shop has not: each in both encodings -----------------------

def connect_envelope(*fields: dict) -> dict:
    return {"type": "struct", "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": list(fields)},
        {"field": "after", "type": "struct", "optional": True, "fields": list(fields)},
        {"field": "op", "type": "string", "optional": False}]}


def avro_envelope(*fields: dict) -> dict:
    value = {"type": "record", "name": "Value", "fields": list(fields)}
    return {"type": "record", "name": "Envelope", "namespace": "t", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"}]}


def decimal_bytes(scale: int, precision: int | None) -> tuple[dict, dict]:
    params = {"scale": str(scale)} | (
        {"connect.decimal.precision": str(precision)} if precision is not None else {})
    return ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
             "parameters": params},
            # What the AvroConverter writes without a precision parameter: its default 64.
            {"type": "bytes", "logicalType": "decimal", "scale": scale,
             "precision": precision or 64, "connect.parameters": params,
             "connect.name": "org.apache.kafka.connect.data.Decimal"})


def named(base: str, name: str) -> tuple[dict, dict]:
    avro_base = {"int32": "int", "int64": "long", "string": "string", "bytes": "bytes",
                 "int16": "int"}[base]
    return {"type": base, "name": name}, {"type": avro_base, "connect.name": name}


CASES = [
    # (connect field schema, avro type, column type)
    ({"type": "int8"}, {"type": "int", "connect.type": "int8"}, "int"),
    ({"type": "int16"}, {"type": "int", "connect.type": "int16"}, "int"),
    ({"type": "int32"}, "int", "int"),
    ({"type": "int64"}, "long", "long"),
    ({"type": "float32"}, "float", "double"),
    ({"type": "float64"}, "double", "double"),
    ({"type": "boolean"}, "boolean", "boolean"),
    ({"type": "string"}, "string", "string"),
    (*decimal_bytes(2, 14), "decimal(14,2)"),
    (*decimal_bytes(3, None), "decimal"),  # a Decimal without a precision: exact
    (*decimal_bytes(0, 120), "decimal"),  # wider than decimal(p,s) declares
    ({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": [
        {"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]},
     {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
      "connect.name": "io.debezium.data.VariableScaleDecimal",
      "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}]},
     "decimal"),
    (*named("int32", "io.debezium.time.Date"), "date"),
    ({"type": "int32", "name": "org.apache.kafka.connect.data.Date"},
     {"type": "int", "logicalType": "date",
      "connect.name": "org.apache.kafka.connect.data.Date"}, "date"),
    (*named("int64", "io.debezium.time.Timestamp"), "timestamp"),
    (*named("int64", "io.debezium.time.MicroTimestamp"), "timestamp"),
    (*named("int64", "io.debezium.time.NanoTimestamp"), "timestamp"),
    (*named("string", "io.debezium.time.ZonedTimestamp"), "timestamp"),
    ({"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"},
     {"type": "long", "logicalType": "timestamp-millis",
      "connect.name": "org.apache.kafka.connect.data.Timestamp"}, "timestamp"),
    (*named("string", "io.debezium.data.Json"), "jsonb"),
    (*named("string", "io.debezium.data.Uuid"), "string"),
    (*named("string", "io.debezium.data.Enum"), "string"),
    ({"type": "array", "items": {"type": "string"}},
     {"type": "array", "items": "string"}, "array<string>"),
    ({"type": "array", "items": {"type": "int32", "optional": True}},
     {"type": "array", "items": ["null", "int"]}, "array<int>"),
    ({"type": "array", "items": decimal_bytes(2, 10)[0]},
     {"type": "array", "items": decimal_bytes(2, 10)[1]}, "array<decimal(10,2)>"),
    ({"type": "array", "items": named("int64", "io.debezium.time.MicroTimestamp")[0]},
     {"type": "array", "items": named("int64", "io.debezium.time.MicroTimestamp")[1]},
     "array<timestamp>"),
]


@pytest.mark.parametrize("connect, avro, declared", CASES,
                         ids=[c[2] + f"-{i}" for i, c in enumerate(CASES)])
def test_each_connect_type_maps_to_its_column_type_in_json_and_avro(connect, avro, declared):
    by_json = from_connect(connect_envelope({"field": "a", "optional": False, **connect},
                                            {"field": "b", "optional": True, **connect}),
                           {"type": "struct", "fields": [{"field": "a", "type": "int64"}]})
    # A named type is defined once, then referred to by its name.
    again = (f"{avro['namespace']}.{avro['name']}" if type(avro) is dict and "name" in avro
             else avro)
    by_avro = from_avro(fastavro.parse_schema(avro_envelope(
        {"name": "a", "type": avro}, {"name": "b", "type": ["null", again], "default": None}),
        named_schemas={}), {"type": "record", "name": "Key", "fields": [
            {"name": "a", "type": "long"}]})
    want = WriterColumns((C("a", declared), C("b", declared, False)), ("a",))
    assert by_json == by_avro == want


UNMAPPED = [
    ({"type": "bytes"}, "bytes", "Connect type bytes", "Avro bytes"),
    (*named("int64", "io.debezium.time.MicroTime"), "io.debezium.time.MicroTime (int64)",
     "io.debezium.time.MicroTime (Avro long)"),
    (*named("bytes", "io.debezium.data.Bits"), "io.debezium.data.Bits (bytes)",
     "io.debezium.data.Bits (Avro bytes)"),
    ({"type": "struct", "name": "io.debezium.data.geometry.Point", "fields": [
        {"field": "x", "type": "float64"}]},
     {"type": "record", "name": "Point", "connect.name": "io.debezium.data.geometry.Point",
      "fields": [{"name": "x", "type": "double"}]},
     "io.debezium.data.geometry.Point (struct)", "io.debezium.data.geometry.Point (Avro record)"),
    ({"type": "array", "items": named("string", "io.debezium.data.Json")[0]},
     {"type": "array", "items": named("string", "io.debezium.data.Json")[1]},
     "an array of jsonb", "an Avro array of jsonb"),
]


@pytest.mark.parametrize("connect, avro, json_what, avro_what", UNMAPPED,
                         ids=[u[2] for u in UNMAPPED])
def test_a_type_no_column_holds_is_refused_naming_the_field_and_its_type(
        connect, avro, json_what, avro_what):
    with pytest.raises(Unmapped) as by_json:
        from_connect(connect_envelope({"field": "id", "type": "int64"},
                                      {"field": "shape", **connect}), None)
    with pytest.raises(Unmapped) as by_avro:
        from_avro(fastavro.parse_schema(avro_envelope(
            {"name": "id", "type": "long"}, {"name": "shape", "type": avro}),
            named_schemas={}), None)
    assert (by_json.value.field, by_json.value.what) == ("shape", json_what)
    assert (by_avro.value.field, by_avro.value.what) == ("shape", avro_what)
    assert "field 'shape' is " in str(by_json.value)


def test_text_of_an_unknown_semantic_type_is_a_string_with_a_warning():
    xml = named("string", "io.debezium.data.Xml")
    by_json = from_connect(connect_envelope({"field": "doc", **xml[0]}), None)
    by_avro = from_avro(fastavro.parse_schema(avro_envelope({"name": "doc", "type": xml[1]}),
                                              named_schemas={}), None)
    assert by_json == by_avro
    assert by_json.columns == (C("doc", "string"),) and by_json.key == ()
    assert by_json.warnings == (
        "field 'doc' is io.debezium.data.Xml, a semantic type columns = \"schema\" does not "
        "know: read as a string (its text as written)",)


def test_a_value_that_is_no_change_event_has_no_columns():
    with pytest.raises(NotAnEnvelope, match="no 'after' struct"):
        from_connect({"type": "struct", "fields": [{"field": "id", "type": "int64"}]}, None)
    with pytest.raises(NotAnEnvelope, match="no 'after' record"):
        from_avro({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]},
                  None)
