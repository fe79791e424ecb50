"""The transform feed's JSON batches as columns (typed_rows.feed_converter: Encoder.columns
-> executor/transform/arrow_columns.py), held to the lines' path it skips (Encoder.encode ->
COPY text -> arrow_rows.RowReader, itself held to the exact read-back in
test_arrow_rows.py): the same typed batch and the same dead letters for every scalar type,
NULLs, escapes, far timestamps, decimals rounded as Postgres does and refused records; no
Kafka, no Spark."""

import random
import struct
from datetime import date, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from pipeline.executor.task import EncoderSettings
from pipeline.executor.transform import typed_rows as tr
from pipeline.executor.transform.typed_rows import SPARK_MAX_MS
from pipeline.formats.timestamps import PG_END_MS, PG_FIRST_MS
from tests.unit.test_arrow_rows import (
    KAFKA_MS,
    VALUES,
    as_dict,
    comparable,
    document,
    random_timestamp,
    records,
)
from tests.unit.test_encode import Record

# test_arrow_rows's columns but its wide decimal (parsed exactly: the lines' path), and
# a nested one.
COLUMNS = (("id", "long", True), ("qty", "int", False), ("price", "double", False),
           ("amount", "decimal(12,2)", False), ("paid", "boolean", False),
           ("at", "timestamp", False), ("day", "date", False), ("name", "string", False),
           ("note", "string", False), ("city", "string", False, ("address", "city")))


def both(recs, columns=COLUMNS, topic="orders\\eu", partition=3, fmt="json"):
    """(the columns' batch and dead letters, the lines'), and whether the columns' path
    was taken."""
    encoder = EncoderSettings(fmt, columns, 7, (), None).encoder(text_rows=True)
    took = encoder.columns(topic, partition, recs) is not None
    got = tr.feed_converter(encoder, fmt, columns, pa)(topic, partition, recs)
    want = tr.converter(fmt, columns, pa)(topic, partition, recs,
                                          encoder.encode(topic, partition, recs))
    return got, want, took


def assert_same(got, want):
    (batch, dead), (lines_batch, lines_dead) = got, want
    assert batch.schema == lines_batch.schema
    a, b = as_dict(batch), as_dict(lines_batch)
    for name in b:
        assert comparable(a[name]) == comparable(b[name]), name
    assert dead == lines_dead


def test_every_scalar_type_is_the_lines_batch_without_the_lines():
    values = {k: v for k, v in VALUES.items() if k != "exact"}
    values["address"] = [{"city": v} if v is not None else None for v in VALUES["note"]]
    recs = records(values, KAFKA_MS)
    got, want, took = both(recs)
    assert took and len(got[0]) == len(recs) and got[1] == []
    assert_same(got, want)
    out = as_dict(got[0])
    assert out["name"][2:5] == ["tab\there", "back\\slash", "new\nline\rcr"]
    assert out["city"][:5] == [None, "x", None, "\t", "\\N"]
    assert out["topic"] == ["orders\\eu"] * len(recs)


def test_refused_records_are_the_same_dead_letters_with_their_coordinates():
    recs = [Record(15, b'{"id": 15, "at": "2026-02-30T00:00:00+00:00"}'),  # the usual
            # shape, no such day: refused after the batch's loop, dead in the records' order
            Record(0, b'{"id": 1, "name": "a\\u0000b"}'),  # NUL: unstorable
            Record(1, b'{"id": "seven"}'), Record(2, b'{"name": "no id"}'),
            Record(3, None), Record(4, b"{not json"), Record(5, b"\xff\xfe"),
            Record(6, b'{"id": 6, "at": "2026-01-01T00:00:00+16:00"}'),
            Record(7, b'{"id": 7, "amount": 1e11}'), Record(8, b'{"id": 8, "qty": 2147483648}'),
            Record(9, b'{"id": 9, "address": 5}'), Record(10, b'{"id": 10, "day": "x"}'),
            Record(11, b'{"id": 11, "name": "ok\\t", "at": 1700000000}'),
            Record(12, b'{"id": 12}', ts=SPARK_MAX_MS + 1),  # Postgres holds it, Spark not
            Record(13, b'{"id": 13}', ts=SPARK_MAX_MS),
            Record(14, '{"id": 14, "at": "\u0662\u0660\u0662\u0666-01-01T00:00:00+00:00"}'
                   .encode()),  # Arabic-Indic digits: Python's \\d takes them, RE2's not
            Record(16, b'{"id": 16, "at": "2026-01-01T23:59:60+00:00"}'),
            Record(17, b'{"id": 17, "at": "2026-01-01T23:59:59.1234567+00:00"}'),
            Record(18, b'{"id": 18, "at": [1]}'),
            Record(19, b'{"id": 19, "at": "2026-06-01 10:00:00.5-15:59", "day": null}'),
            Record(20, b'{"id": 20, "at": " 2026-06-01T10:00:00+01:00"}')]
    got, want, took = both(recs)
    assert took
    assert_same(got, want)
    # +16:00, 7 places, a leading space: converted to UTC by the rule, not refused
    assert as_dict(got[0])["offset"] == [6, 11, 13, 17, 19, 20]
    assert [line.split("\t")[2] for line in got[1]] == [
        "15", "0", "1", "2", "3", "4", "5", "7", "8", "9", "10", "14", "16", "18", "12"]


def test_a_batch_that_raises_goes_through_the_lines():
    # A Kafka timestamp Postgres cannot hold raises in the Encoder (its record then a dead
    # letter of its own): the columns' path gives the batch to the lines'.
    recs = [Record(0, b'{"id": 0}', ts=PG_END_MS), Record(1, b'{"id": 1}'),
            Record(2, b'{"id": 2}', ts=PG_FIRST_MS - 1)]
    got, want, took = both(recs)
    assert not took
    assert_same(got, want)
    assert [line.split("\t")[7] for line in got[1]] == ["timestamp_out_of_range"] * 2


@pytest.mark.parametrize("columns", [
    (("id", "long", True), ("exact", "decimal(38,10)", False)),  # wide: exact JSON, lines
    (("id", "long", True), ("amount", "decimal(12,2)", False))])
def test_decimals_as_floats_strings_and_ints_round_as_the_lines_do(columns):
    name = columns[1][0]
    rng = random.Random(25)
    amounts = [round(rng.uniform(-1e10, 1e10), rng.randrange(0, 18)) for _ in range(2000)]
    amounts += [h / 1000 for h in range(-995, 1000, 10)] + [1.005, 2.675, -0.125, 1e-7,
                                                           0.30000000000000004, -0.0, 0]
    amounts += [123456789, 9999999999, -9999999998, 5e-324]
    recs = [Record(i, document({"id": i, name: a})) for i, a in enumerate(amounts)]
    with_text = recs + [Record(len(recs), document({"id": 0, name: "12.345"})),
                        Record(len(recs) + 1, document({"id": 1}))]
    for batch in (recs, with_text):
        got, want, took = both(batch, columns)
        assert took == (columns[1][1] == "decimal(12,2)")
        assert_same(got, want)
        assert got[1] == []


def test_random_values_of_every_type_are_the_lines_batch():
    rng = random.Random(26)
    n = 3000
    doubles = []
    while len(doubles) < n:
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if x == x and abs(x) != float("inf"):
            doubles.append(x)
    chars = "ab\\\t\n\r\"é🚀 N"
    values = {"id": [rng.randrange(-2**63, 2**63) for _ in range(n)],
              "qty": [rng.randrange(-2**31, 2**31) for _ in range(n)],
              "price": doubles,
              "amount": [round(rng.uniform(-1e10, 1e10), rng.randrange(0, 12))
                         for _ in range(n)],
              "paid": [rng.choice([True, False, None]) for _ in range(n)],
              "at": [random_timestamp(rng) if rng.random() < 0.9 else
                     rng.randrange(-62135596800, 253402300800) for _ in range(n)],
              "day": [(date(1, 1, 1) + timedelta(days=rng.randrange(3_652_059))).isoformat()
                      for _ in range(n)],
              "name": ["".join(rng.choice(chars) for _ in range(rng.randrange(8)))
                       for _ in range(n)],
              "note": [None] * n,
              "address": [{"city": str(i)} for i in range(n)]}
    kafka_ms = [rng.randrange(PG_FIRST_MS, SPARK_MAX_MS) for _ in range(n)]
    got, want, took = both(records(values, kafka_ms))
    assert took and len(got[0]) == n
    assert_same(got, want)


def test_other_formats_and_no_records_go_as_before():
    got, want, took = both([])
    assert took and len(got[0]) == 0
    assert_same(got, want)
    raw = [Record(0, b"x", k=b"k"), Record(1, None)]
    got, want, took = both(raw, (), fmt="raw")
    assert not took
    assert_same(got, want)


def test_a_decimal_column_the_float_route_cannot_take_is_read_from_its_texts():
    # The exact rule's texts (a numeric string) beside floats: str() of each value.
    recs = [Record(0, document({"id": 0, "amount": "7.125"})),
            Record(1, document({"id": 1, "amount": 2.675}))]
    got, want, took = both(recs)
    assert took
    assert_same(got, want)
    assert as_dict(got[0])["amount"] == [Decimal("7.13"), Decimal("2.68")]


def test_a_timestamp_of_the_usual_shape_but_no_such_instant_is_refused_in_any_batch():
    at = ["2026-01-01T00:00:00+00:00", None, "2025-02-29T00:00:00Z", "2026-01-01T24:00:00Z",
          "2024-02-29 12:00:00.5-05:30"]
    recs = [Record(i, document({"id": i} if a is None else {"id": i, "at": a}))
            for i, a in enumerate(at)]
    for batch in (recs, [recs[0], recs[1], recs[4]]):
        got, want, took = both(batch)
        assert took
        assert_same(got, want)
    assert [line.split("\t")[2] for line in both(recs)[0][1]] == ["2", "3"]
