"""The transform path's decoding of a schema format (formats/decoded_columns.py): Arrow
batches of Kafka records, as Spark's mapInArrow hands them, become the declared columns
typed (Arrow types Spark reads as the declared Spark types) or a refused record's error
code and reason, through the built-in sinks' Encoder; no Kafka, no Spark."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from pipeline.executor.task import EncoderSettings
from pipeline.formats import decoded_columns as dc
from pipeline.formats.json_diagnose import diagnose
from tests.unit.test_avro import LOGICAL, V1, V2, schemas, wire  # noqa: F401 - a fixture

T = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def batch(rows: list[tuple[str, int, int, bytes | None]]) -> pa.RecordBatch:
    """(topic, partition, offset, value) rows as INPUT columns."""
    n = len(rows)
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.RecordBatch.from_arrays([
        pa.array([r[0] for r in rows], pa.string()), pa.array([r[1] for r in rows], pa.int32()),
        pa.array([r[2] for r in rows], pa.int64()), pa.array([b"k"] * n, pa.binary()),
        pa.array([r[3] for r in rows], pa.binary()), pa.array([[]] * n, headers),
        pa.array([T] * n, pa.timestamp("us", tz="UTC"))],
        names=["topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp"])


def decode(schemas, columns, rows):  # noqa: F811 - the fixture's value
    fn = dc.decoder(EncoderSettings("avro", columns, 0, (), schemas))
    return next(fn(iter([batch(rows)]))).to_pydict()


def test_records_become_typed_columns_across_writer_versions_and_partitions(schemas):  # noqa: F811
    columns = (("order_id", "string", True), ("qty", "long", False), ("price", "double", False),
               ("coupon", "string", False))
    out = decode(schemas, columns, [
        ("t", 0, 5, wire(1, V1, {"order_id": "a\tb\\c\n", "qty": 2, "price": 1.5,
                                 "coupon": None})),
        ("t", 0, 6, wire(2, V2, {"order_id": "b", "qty": 2**40, "price": 0.1,
                                 "channel": "x"})),
        ("t", 1, 5, wire(1, V1, {"order_id": "c", "qty": -1, "price": 2.0, "coupon": "z"})),
    ])
    assert out["order_id"] == ["a\tb\\c\n", "b", "c"]
    assert out["qty"] == [2, 2**40, -1]
    assert out["price"] == [1.5, 0.1, 2.0]
    assert out["coupon"] == [None, None, "z"]
    assert out["error_code"] == [None] * 3 and out["_parsed"] == [None] * 3
    assert out["offset"] == [5, 6, 5] and out["kafka_timestamp"] == [T] * 3


def test_logical_types_come_out_as_their_spark_types(schemas):  # noqa: F811
    columns = (("amount", "decimal(10,2)", False), ("at_ms", "timestamp", False),
               ("day", "date", False), ("id", "string", False))
    value = {"amount": Decimal("12.34"), "at_ms": T, "at_us": T, "day": date(2026, 1, 2),
             "id": "7d1c0b4e-0000-4000-8000-000000000000"}
    out = decode(schemas, columns, [("t", 0, 0, wire(7, LOGICAL, value))])
    assert (out["amount"], out["at_ms"], out["day"], out["id"]) == (
        [Decimal("12.34")], [T], [date(2026, 1, 2)], [value["id"]])
    assert dc.output_schema(columns).endswith(
        "`amount` decimal(10,2), `at_ms` timestamp, `day` date, `id` string, "
        "error_code string, _parsed string")


def test_a_refused_record_carries_its_reason_to_its_dead_letter(schemas):  # noqa: F811
    columns = (("order_id", "string", True), ("qty", "int", False))
    good = wire(2, V2, {"order_id": "b", "qty": 1, "price": 0.1, "channel": "x"})
    out = decode(schemas, columns, [
        ("t", 0, 0, b"\x01" + good[1:]),
        ("t", 0, 1, wire(2, V2, {"order_id": "b", "qty": 2**40, "price": 0.1,
                                 "channel": "x"})),
        ("t", 0, 2, None),
        ("t", 0, 3, good),
        ("t", 0, 4, good[:5] + b"\xff"),
    ])
    assert out["error_code"] == ["refused:bad_magic_byte", "refused:wrong_type",
                                 "refused:null_value", None, "refused:corrupt_avro"]
    assert out["order_id"] == [None, None, None, "b", None]
    assert diagnose(out["error_code"][1], None, out["_parsed"][1], ()) == (
        "wrong_type", "field 'qty' (writer schema id 2): expected int, got long")
    assert out["_parsed"][0].startswith("first byte is 0x01")


@pytest.mark.parametrize("text", ["plain", "tab\there", "back\\slash", "nl\nx\rx", "\\t",
                                  "é\\\\n"])
def test_unescape_undoes_copy_text(text):
    from pipeline.formats.copy_text import text as copy_text

    assert dc.unescape(copy_text(text)) == text
