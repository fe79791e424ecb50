"""NaN and Infinity: JSON has no such numbers, so a record holding one bare is a dead
letter saying so, whichever parser its columns choose (orjson, or the standard library for
jsonb and wide decimals, which would accept them); an Avro NaN is no JSON for a jsonb
column either. Before, a jsonb column stored them as null. No Kafka, no Spark."""

import json

import pytest

from pipeline.formats.encode import Encoder
from pipeline.formats.schema_source import SchemaSource
from tests.unit.test_avro import wire
from tests.unit.test_encode import Record
from tests.unit.test_paths import dead

NOT_JSON = ("malformed_json", "value holds NaN or Infinity as a bare number, which JSON does "
                              "not allow (a double column reads the string \"NaN\")")


@pytest.mark.parametrize("columns", [
    (("id", "long", True), ("doc", "jsonb", False)),
    (("id", "decimal(30,2)", True), ("doc", "string", False)),
    (("id", "long", True), ("doc", "string", False)),
], ids=["jsonb", "wide_decimal", "plain"])
@pytest.mark.parametrize("fmt", ["json", "debezium"])
def test_a_bare_nan_or_infinity_is_a_dead_letter_whatever_the_columns(columns, fmt):
    docs = [b'{"id": 1, "doc": NaN}', b'{"id": 1, "doc": {"x": [Infinity]}}',
            b'{"id": 1, "doc": -Infinity}', b'{"id": 1, "other": NaN}']
    if fmt == "debezium":
        docs = [b'{"op": "c", "after": ' + d + b'}' for d in docs]
    encoded = Encoder(fmt, columns, 1, tombstone_key=("id",) if fmt == "debezium" else ())\
        .encode("t", 0, [Record(i, d) for i, d in enumerate(docs)])
    assert encoded.rows == []
    assert dead(encoded) == {i: NOT_JSON for i in range(len(docs))}


def test_an_avro_nan_or_infinity_for_a_jsonb_column_is_a_dead_letter(tmp_path):
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "doc", "type": {"type": "map", "values": "double"}},
        {"name": "x", "type": "double"}]}
    (tmp_path / "5.avsc").write_text(json.dumps(schema))
    records = [Record(0, wire(5, schema, {"doc": {"a": float("nan")}, "x": 1.0})),
               Record(1, wire(5, schema, {"doc": {"a": float("-inf")}, "x": 1.0})),
               Record(2, wire(5, schema, {"doc": {"a": 1.5}, "x": float("nan")}))]
    encoded = Encoder("avro", (("doc", "jsonb", False), ("x", "double", False)), 1,
                      schemas=SchemaSource(schemas_dir=str(tmp_path)),
                      text_rows=True).encode("t", 0, records)
    # A double column holds NaN (Postgres' double precision has it); jsonb does not.
    assert [line.split("\t")[4:-1] for line in encoded.rows] == [['{"a":1.5}', "nan"]]
    why = ("wrong_type", "field 'doc' (writer schema id 5): expected jsonb, got record or "
                         "map: a NaN or infinite number, which JSON cannot hold")
    assert dead(encoded) == {0: why, 1: why}
