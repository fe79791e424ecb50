"""The schema envelope decoded by a plan per writer schema (formats/debezium/plans.py): a
plan is made per distinct schema, never reused for a record whose schema differs, and the
payload parsed alone gives the lines the whole value gives; no Kafka, no Spark."""

import base64
import json

import pytest

from pipeline.formats.debezium.schema_columns import from_connect
from pipeline.formats.encode import Encoder
from tests.unit.test_encode import Record
from tests.unit.test_schema_columns import CAPTURED_JSON

DECIMAL = "org.apache.kafka.connect.data.Decimal"


def connect_value(fields: list[dict], after: dict, op: str = "c") -> bytes:
    """A change event as Kafka Connect's JsonConverter writes it (compact)."""
    schema = {"type": "struct", "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": fields},
        {"field": "after", "type": "struct", "optional": True, "fields": fields},
        {"field": "op", "type": "string"}]}
    payload = {"before": None, "after": after, "op": op, "source": {"db": "shop"}}
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


def fields_of(row: str, columns: int = 3) -> list[str]:
    """The declared columns' fields of a row: after the coordinates and Kafka timestamp,
    before ``_unavailable``, a primary-key change's old key and the run id."""
    return row.split("\t")[4:4 + columns]


def test_a_plan_is_not_reused_for_a_record_whose_schema_differs():
    id_ = {"field": "id", "type": "int64"}
    total = {"field": "total", "type": "bytes", "name": DECIMAL, "parameters": {"scale": "2"}}
    rescaled = {**total, "parameters": {"scale": "3"}}
    added = {"field": "opened_on", "type": "int32", "name": "io.debezium.time.Date"}
    unscaled = base64.b64encode((12345).to_bytes(2, "big", signed=True)).decode()
    v1 = connect_value([id_, total], {"id": 1, "total": unscaled})
    enc = Encoder("debezium", (("id", "long", True), ("total", "decimal", False),
                               ("opened_on", "date", False)), 1, tombstone_key=("id",))
    out = enc.encode("t", 0, [
        Record(0, v1),
        Record(1, connect_value([id_, rescaled], {"id": 2, "total": unscaled})),
        Record(2, connect_value([id_, total, added],
                                {"id": 3, "total": unscaled, "opened_on": 19_000})),
        Record(3, v1)])
    assert out.dead == []
    assert [fields_of(r) for r in out.rows] == [
        ["1", "123.45", "\\N"], ["2", "12.345", "\\N"], ["3", "123.45", "2022-01-08"],
        ["1", "123.45", "\\N"]]
    assert len(enc.format.plans[frozenset()].plans) == 3  # one per distinct schema


def full_parse(value: bytes) -> bytes:
    """The same JSON with a leading space: not the JsonConverter layout, so read whole."""
    return b" " + value


@pytest.mark.parametrize("topic", sorted(CAPTURED_JSON))
def test_the_payload_read_alone_gives_the_lines_the_whole_value_gives(topic):
    records = CAPTURED_JSON[topic]
    key = json.loads(records[0]["key"])
    w = from_connect(json.loads(records[0]["value"])["schema"], key["schema"])
    columns = [(c.name, c.type, c.required) for c in w.columns]

    def encoded(wrap):
        enc = Encoder("debezium", columns, 1, tombstone_key=w.key, truncate=True)
        return enc.encode("t", 0, [Record(r["offset"], r["value"] and wrap(r["value"].encode()),
                                          k=r["key"] and r["key"].encode()) for r in records])

    planned, whole = encoded(lambda v: v), encoded(full_parse)
    assert planned == whole
    assert planned.rows and not planned.dead


def test_a_number_the_exact_parser_keeps_is_read_as_written():
    # decimal.handling.mode = double into a decimal column (exact: the standard library's
    # parser); a schema whose parameters hold a "payload" key (not split at its bytes).
    price = {"field": "price", "type": "bytes", "name": DECIMAL, "parameters": {"scale": "1"}}
    fields = [{"field": "id", "type": "int64"}, {"field": "balance", "type": "double"}, price]
    after = {"id": 1, "balance": 1, "price": base64.b64encode(b"\x05").decode()}
    double = connect_value(fields, after).replace(b'"balance":1',
                                                  b'"balance":0.1000000000000000055511')
    odd = connect_value([*fields[:2], {**price, "parameters": {"scale": "1", "payload": "x"}}],
                        after)
    columns = (("id", "long", True), ("balance", "decimal", False), ("price", "decimal", False))
    for value, balance in ((double, "0.1000000000000000055511"), (odd, "1")):
        lines = [Encoder("debezium", columns, 1, tombstone_key=("id",)).encode(
            "t", 0, [Record(0, v)]).rows for v in (value, full_parse(value))]
        assert lines[0] == lines[1]
        assert fields_of(lines[0][0]) == ["1", balance, "0.5"]


def test_a_float_outside_what_is_read_of_a_change_keeps_the_payload_parsed_alone():
    # An exact column (the standard library's parser decides a float's digits): a float
    # in the images or the transaction block sends the value to the whole value's parse;
    # one in the source block (not read) does not, and both parses give the same lines.
    fields = [{"field": "id", "type": "int64"}, {"field": "balance", "type": "double"}]
    columns = (("id", "long", True), ("balance", "decimal", False))
    plain = connect_value(fields, {"id": 1, "balance": 2})

    def with_(old: bytes, new: bytes) -> bytes:
        assert old in plain
        return plain.replace(old, new)

    values = {"source": with_(b'"source":{"db":"shop"}', b'"source":{"db":"shop","t":0.5}'),
              "after": with_(b'"balance":2', b'"balance":0.1000000000000000055511'),
              "transaction": with_(b'"source":', b'"transaction":{"id":"7:1","total_order":'
                                   b'1.0,"data_collection_order":1e0},"source":')}
    for part, value in values.items():
        enc = Encoder("debezium", columns, 1, tombstone_key=("id",))
        whole = enc.format.loads
        parsed_whole = []
        enc.format.loads = lambda v, whole=whole, seen=parsed_whole: seen.append(v) or whole(v)
        lines = enc.encode("t", 0, [Record(0, value)]).rows
        assert lines == Encoder("debezium", columns, 1, tombstone_key=("id",)).encode(
            "t", 0, [Record(0, full_parse(value))]).rows
        assert (value in parsed_whole) == (part != "source"), part


def connect_key(fields: list[dict], payload: dict) -> bytes:
    """A Kafka key as JsonConverter writes it (compact)."""
    return json.dumps({"schema": {"type": "struct", "fields": fields}, "payload": payload},
                      separators=(",", ":")).encode()


@pytest.mark.parametrize("exact", [False, True])
def test_a_keys_payload_read_alone_names_the_row_the_whole_key_names(exact):
    # A tombstone's Kafka key (and a delete's without a before image) by its schema's plan:
    # the same key fields as the whole key's parse; a float in it (an exact column beside:
    # the standard library's parser decides its digits) goes to the whole parse.
    fields = [{"field": "order_id", "type": "int64"},
              {"field": "placed", "type": "int32", "name": "io.debezium.time.Date"}]
    columns = (("order_id", "long", True), ("placed", "date", True),
               ("total", "decimal" if exact else "decimal(10,2)", False))
    keys = [connect_key(fields, {"order_id": 7, "placed": 19_000}),
            connect_key(fields, {"order_id": 8, "placed": 19_001.0}),
            connect_key(fields, {"order_id": 9}), b'{"order_id": 10, "placed": "2022-01-01"}']
    delete = connect_value(fields, None, op="d").replace(b'"before":null', b'"before":{}')

    def encoded(wrap):
        enc = Encoder("debezium", columns, 1, tombstone_key=("order_id", "placed"))
        return enc.encode("t", 0, [Record(i, v, k=wrap(k)) for i, k in enumerate(keys)
                                   for v in (None, delete)])

    planned, whole = encoded(lambda k: k), encoded(full_parse)
    assert (planned.rows, planned.tombstones) == (whole.rows, whole.tombstones)
    # A dead letter holds the key's bytes as they are: the same errors.
    assert [d.split("\t")[-2:] for d in planned.dead] == [
        d.split("\t")[-2:] for d in whole.dead]
    assert [line.split("\t")[4:6] for line in planned.tombstones] == [
        ["7", "2022-01-08"]] * 2 + [["10", "2022-01-01"]] * 2
    assert len(planned.dead) == 4 and "placed" in planned.dead[2]


def test_a_deletes_before_image_names_the_key_its_json_text_names():
    # A delete's before image (REPLICA IDENTITY DEFAULT: every column, decoded: decimals,
    # dates) names its key by the key columns alone, as its JSON text read back does.
    from decimal import Decimal

    from pipeline.formats.tombstones import key_fields
    from pipeline.formats.types import column_type

    columns = [(n, column_type(t).from_json, t, (n,))
               for n, t in (("id", "long"), ("sku", "string"))]
    for before in ({"id": 3, "sku": "A-1", "total": Decimal("1.50"), "on": "2022-01-08"},
                   {"id": 3, "sku": "\u00e9\\n\t", "total": None},
                   {"id": True, "sku": "x"}, {"id": 3, "sku": 5}, {"id": 3}):
        as_text = json.dumps(before, default=str).encode()
        try:
            want = key_fields(as_text, columns)
        except ValueError as e:
            with pytest.raises(type(e), match=str(e)):
                key_fields(before, columns)
            continue
        assert key_fields(before, columns) == want
