"""The transform path's input rows (executor/transform/typed_rows.py): a batch of Kafka records,
encoded by the built-in sinks' Encoder, becomes the declared columns typed (Arrow types
Spark reads as the declared Spark types) plus the batch's dead letters; no Kafka, no Spark."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from pipeline.executor.task import EncoderSettings
from pipeline.executor.transform import typed_rows as tr
from pipeline.executor.transform.typed_rows import SPARK_MAX_MS
from tests.unit.test_avro import LOGICAL, V1, V2, schemas, wire  # noqa: F401 - a fixture
from tests.unit.test_encode import Record as encoded_record

T = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
MS = int(T.timestamp() * 1000)


def Record(offset, value, ms=MS, key=b"k", headers=None):  # noqa: N802 - reads as one
    """A Kafka record as confluent-kafka's Message reads (test_encode's, other defaults)."""
    return encoded_record(offset, value, key, headers, ms)


def convert(fmt, columns, records, schemas=None, partition=0):  # noqa: F811
    encoder = EncoderSettings(fmt, columns, 0, (), schemas).encoder(text_rows=True)
    batch, dead = tr.converter(fmt, columns, pa)(
        "t", partition, records, encoder.encode("t", partition, records))
    return batch.to_pydict(), [line.rstrip("\n").split("\t") for line in dead]


def test_avro_records_become_typed_columns_across_writer_versions(schemas):  # noqa: F811
    columns = (("order_id", "string", True), ("qty", "long", False), ("price", "double", False),
               ("coupon", "string", False))
    out, dead = convert("avro", columns, [
        Record(5, wire(1, V1, {"order_id": "a\tb\\c\n", "qty": 2, "price": 1.5,
                               "coupon": None})),
        Record(6, wire(2, V2, {"order_id": "b", "qty": 2**40, "price": 0.1, "channel": "x"})),
    ], schemas)
    assert dead == []
    assert out["order_id"] == ["a\tb\\c\n", "b"]
    assert out["qty"] == [2, 2**40] and out["price"] == [1.5, 0.1]
    assert out["coupon"] == [None, None]
    assert out["offset"] == [5, 6] and out["kafka_timestamp"] == [T] * 2
    assert out["topic"] == ["t"] * 2 and out["partition"] == [0] * 2


def test_logical_types_come_out_as_their_spark_types(schemas):  # noqa: F811
    columns = (("amount", "decimal(10,2)", False), ("at_ms", "timestamp", False),
               ("day", "date", False), ("id", "string", False))
    value = {"amount": Decimal("12.34"), "at_ms": T, "at_us": T, "day": date(2026, 1, 2),
             "id": "7d1c0b4e-0000-4000-8000-000000000000"}
    out, _ = convert("avro", columns, [Record(0, wire(7, LOGICAL, value))], schemas)
    assert (out["amount"], out["at_ms"], out["day"], out["id"]) == (
        [Decimal("12.34")], [T], [date(2026, 1, 2)], [value["id"]])


def test_json_rows_typed_and_refused_records_are_dead_letters():
    columns = (("id", "long", True), ("name", "string", False), ("ok", "boolean", False),
               ("x", "double", False), ("at", "timestamp", False), ("n", "int", False))
    out, dead = convert("json", columns, [
        Record(0, b'{"id": 1, "name": "a\\\\b\\tc", "ok": true, "x": 1e300, '
                  b'"at": "2026-11-25T13:00:00+01:00", "n": 7}'),
        Record(1, b'{"name": "no id"}'),
        Record(2, None),
        Record(3, b'{"id": 3, "ok": false, "at": 1700000000}'),
    ])
    assert out["offset"] == [0, 3] and out["id"] == [1, 3]
    assert out["name"] == ["a\\b\tc", None] and out["ok"] == [True, False]
    assert out["x"] == [1e300, None] and out["n"] == [7, None]
    assert out["at"] == [T, datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)]
    assert [(d[2], d[7]) for d in dead] == [("1", "missing_field"), ("2", "null_value")]


def test_a_decimal_is_rounded_half_up_to_its_scale_as_postgres_stores_it():
    out, dead = convert("json", (("id", "long", True), ("amount", "decimal(12,2)", False)), [
        Record(0, b'{"id": 0, "amount": 1.005}'), Record(1, b'{"id": 1, "amount": 1e-7}'),
        Record(2, b'{"id": 2, "amount": "2.5"}'), Record(3, b'{"id": 3, "amount": -0.125}')])
    assert dead == []
    assert out["amount"] == [Decimal("1.01"), Decimal("0.00"), Decimal("2.50"),
                             Decimal("-0.13")]


def test_raw_records_as_they_are_and_a_far_timestamp_is_a_dead_letter():
    far = SPARK_MAX_MS + 1  # Postgres could store it, Spark cannot
    out, dead = convert("raw", (), [
        Record(0, b"\xff", headers=[("h", b"\x00\x01")]),
        Record(1, b"v", ms=far),
        Record(2, None, key=None),
    ])
    assert out["offset"] == [0, 2] and out["value"] == [b"\xff", None]
    assert out["key"] == [b"k", None]
    assert out["headers"] == ['[{"key":"h","value_b64":"AAE="}]', "[]"]
    assert out["kafka_timestamp"] == [T, T]
    assert [(d[2], d[7]) for d in dead] == [("1", tr.FAR)]
    assert str(far) in dead[0][8] and dead[0][6].startswith("294247-")  # Postgres holds it


def test_a_far_timestamp_in_a_text_format_is_a_dead_letter_the_rest_rows():
    out, dead = convert("json", (("id", "long", True),), [
        Record(0, b'{"id": 0}', ms=SPARK_MAX_MS + 5), Record(1, b'{"id": 1}')])
    assert out["id"] == [1] and out["kafka_timestamp"] == [T]
    assert [(d[2], d[7]) for d in dead] == [("0", tr.FAR)]


@pytest.mark.parametrize("text", ["plain", "tab\there", "back\\slash", "nl\nx\rx", "\\t",
                                  "é\\\\n"])
def test_unescape_undoes_copy_text(text):
    from pipeline.formats.wire.text import text as copy_text
    from pipeline.formats.wire.text import unescape

    assert unescape(copy_text(text)) == text
