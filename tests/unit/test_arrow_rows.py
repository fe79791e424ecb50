"""The Encoder's COPY text result lines -> one typed Arrow batch
(executor/transform/arrow_rows.py), held to the exact per-field read-back (``field_reader``
below: what each field means, one value at a time; once formats/copy_readback.py, which no
run used) on lines the real Encoder writes; no Kafka, no Spark."""

import json
import math
import pickle
import random
import re
import struct
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import pyarrow as pa
import pytest

from pipeline.executor.transform import arrow_rows as ar
from pipeline.executor.transform.arrow_rows import micros
from pipeline.formats.encode import Encoder
from pipeline.formats.timestamps import PG_END_MS, PG_FIRST_MS
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import NULL, unescape
from tests.unit.test_avro import LOGICAL, schemas, wire  # noqa: F401 - a fixture
from tests.unit.test_encode import Record

COLUMNS = (("id", "long", True), ("qty", "int", False), ("price", "double", False),
           ("amount", "decimal(12,2)", False), ("exact", "decimal(38,10)", False),
           ("paid", "boolean", False), ("at", "timestamp", False), ("day", "date", False),
           ("name", "string", False), ("note", "string", False))
# One JSON value per line of what each column may hold; None = the key absent (NULL).
VALUES = {
    "id": [0, 1, -1, 2**63 - 1, -2**63, 2**53 + 1, 42, 7, 8, 9, 10, 11],
    "qty": [None, 0, 2**31 - 1, -2**31, -5, 3, None, 1, 2, 3, 4, 5],
    "price": [None, 0.1, -0.0, 5e-324, 1.7976931348623157e308, 1e16, "NaN", "Infinity",
              "-Infinity", 12, -2.5e-7, 1 / 3],
    "amount": [None, 0, -0.01, 1.25, 9999999999.99, -9999999999.99, "12.5", 3, 0.1,
               -123.45, 0.5, "1E+2"],
    "exact": [None, 0, Decimal("-1234567890123456789012345678.9012345678"),
              Decimal("1234567890123456789012345678.9012345678"), Decimal("0.0000000001"),
              Decimal("-0.00000000005"), Decimal("1e-7"), "17.25", 5, Decimal("2.5"),
              Decimal("-3"), Decimal("1.000000000049")],
    "paid": [None, True, False, True, False, True, None, False, True, True, False, False],
    "at": [None, "2026-01-01T00:00:00+00:00", "0001-01-01T00:00:00+05:00",
           "9999-12-31T23:59:59.999999-15:59", "1969-12-31T23:59:59.999999Z",
           "2024-02-29 12:00:00.1+01:00", "2024-06-01T10:20:30.123456Z",
           "2024-06-01T10:20:30", -62135596800, 253402300799, 0, "2024-06-01T10:20:30+05:30"],
    "day": [None, "0001-01-01", "9999-12-31", "2024-02-29", "2024-06-01T23:00:00Z",
            "1970-01-01", "1969-12-31", None, "2000-01-01", "1900-03-01", "2024-01-01",
            "2024-12-31"],
    "name": ["", "plain", "tab\there", "back\\slash", "new\nline\rcr", "\\N", "\\",
             "zoë 🚀 שלום", "\\t literally", "ends with \\",
             "q\"uote\u2028\x85\x0b\x1c#", "a\\\\b\t\t"],
    "note": [None, "x", None, "\t", "\\N", "", None, "日本", '"quoted"', None, "#z",
             "\n"],
}
N = len(VALUES["id"])
# Kafka timestamps (epoch ms): before the epoch, past datetime's year 9999, BC, the ends.
KAFKA_MS = [1_700_000_000_123, -1, 0, 253_402_300_800_000, PG_FIRST_MS, -62_135_596_800_001,
            9_000_000_000_000_000, 1_700_000_000_123, 86_399_999, -62_167_219_200_000,
            -100_000_000_000_000, 9_223_372_036_854_775]


def records(values=VALUES, kafka_ms=KAFKA_MS):
    n = len(next(iter(values.values())))
    return [Record(100 + i, document({k: v for k, col in values.items()
                                      if (v := col[i]) is not None}),
                   ts=kafka_ms[i % len(kafka_ms)]) for i in range(n)]


def document(doc: dict) -> bytes:
    """JSON with a Decimal written as the number it is."""
    text = json.dumps({k: f"@@{v}@@" if type(v) is Decimal else v for k, v in doc.items()})
    return re.sub(r'"@@(.*?)@@"', r"\1", text).encode()


def encoded_lines(columns=COLUMNS, recs=None, topic="orders\\eu", partition=3):
    """What the real Encoder writes for ``recs`` (a wide decimal column: exact JSON)."""
    out = Encoder("json", columns, 77).encode(topic, partition, recs or records())
    assert out.dead == [], out.dead
    return out.rows


def field_reader(declared: str) -> Callable[[str], object]:
    """A COPY text field the Encoder wrote for a column of ``declared`` -> its value: the
    plain statement of what each field means, one value at a time."""
    t = column_type(declared)
    if not t.scalar:
        raise ValueError(f"column type {declared} is not read back for a transform")
    if t.precision is not None:
        return Decimal
    return {"string": unescape, "long": int, "int": int, "double": float,
            "boolean": lambda f: f == "t", "timestamp": datetime.fromisoformat,
            "date": date.fromisoformat}[declared]


def field_arrow_type(declared: str, pa):
    t = column_type(declared)
    if t.precision is not None:
        return pa.decimal128(t.precision, t.scale)
    return {"string": pa.string(), "long": pa.int64(), "int": pa.int32(),
            "double": pa.float64(), "boolean": pa.bool_(), "timestamp": pa.timestamp(
                "us", tz="UTC"), "date": pa.date32()}[declared]


def read_back(lines, columns=COLUMNS, kafka_ms=None):
    """The exact per-field read-back, as field_reader gives the declared columns; the
    head as the records hold it."""
    declared = [(n, t) for n, t, *_ in columns]
    rows = [line.rstrip("\n").split("\t") for line in lines]
    out = {"topic": [unescape(r[0]) for r in rows],
           "partition": [int(r[1]) for r in rows], "offset": [int(r[2]) for r in rows]}
    if kafka_ms is not None:
        out["kafka_timestamp"] = [kafka_ms[(o - 100) % len(kafka_ms)] * 1000
                                  for o in out["offset"]]
    for c, (name, t) in enumerate(declared):
        read = field_reader(t)
        typed = pa.array([None if r[4 + c] == NULL else read(r[4 + c]) for r in rows],
                         field_arrow_type(t, pa))
        out[name] = instants(typed).to_pylist()
    return out


def comparable(values):
    """NaN equals NaN, and -0.0 is not 0.0."""
    return [repr(v) if type(v) is float else v for v in values]


def instants(column):
    """A timestamp column as epoch microseconds: its instants may lie outside datetime's
    years 1-9999 (0001-01-01T00:00:00+05:00, a far Kafka timestamp)."""
    return column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column


def as_dict(batch):
    return {name: instants(column).to_pylist()
            for name, column in zip(batch.schema.names, batch.columns, strict=True)}


def test_every_scalar_type_reads_as_the_exact_per_field_read_back():
    lines = encoded_lines()
    assert len(lines) == N
    batch = ar.RowReader(COLUMNS).batch(lines)
    got, want = as_dict(batch), read_back(lines, kafka_ms=KAFKA_MS)
    assert batch.schema == ar.arrow_schema(COLUMNS)
    for name in want:
        assert comparable(got[name]) == comparable(want[name]), name
    # The cases that make the test: NULLs, escapes undone, the far instants exact.
    assert got["topic"] == ["orders\\eu"] * N and got["partition"] == [3] * N
    assert got["name"][2:8] == ["tab\there", "back\\slash", "new\nline\rcr", "\\N", "\\",
                                "zoë 🚀 שלום"]
    assert got["note"][:5] == [None, "x", None, "\t", "\\N"]
    assert got["exact"][2] == Decimal("-1234567890123456789012345678.9012345678")
    assert got["kafka_timestamp"][4] == PG_FIRST_MS * 1000


def test_far_kafka_timestamps_alone_are_read_field_by_field_and_the_rest_stays_exact(
        monkeypatch):
    kafka_ms = [1_700_000_000_000, 300_000_000_000_000, -62_167_219_200_001]
    lines = encoded_lines(recs=records(kafka_ms=kafka_ms))
    read = []
    monkeypatch.setattr(ar, "micros", lambda text: read.append(text) or micros(text))
    got = as_dict(ar.RowReader(COLUMNS).batch(lines))
    assert len(read) == 8 and all(" BC" in t or t.startswith("11476-") for t in read)
    assert got["kafka_timestamp"] == [kafka_ms[i % 3] * 1000 for i in range(N)]
    assert lines[1].split("\t")[3] == "11476-08-15 05:20:00.000000+00"
    assert lines[2].split("\t")[3] == "0002-12-31 23:59:59.999000+00 BC"


@pytest.mark.parametrize("millis", [PG_FIRST_MS, PG_FIRST_MS + 1, -62_135_596_800_000,
                                    -62_135_596_800_001, -1, 0, 951_782_400_000,
                                    253_402_300_799_999, 253_402_300_800_000,
                                    -200_000_000_000_000, -59_011_459_200_000,
                                    -30_610_224_000_000, 9_223_372_036_854_775])
def test_kafka_timestamps_of_any_year_read_back_to_their_milliseconds(millis):
    lines = encoded_lines(recs=records({"id": [1]}, [millis]))
    got = ar.RowReader(COLUMNS).batch(lines).column("kafka_timestamp")
    assert got.cast(pa.int64()).to_pylist() == [millis * 1000]


def test_a_kafka_timestamp_past_sparks_timestamp_is_refused_naming_the_record():
    lines = encoded_lines(recs=records({"id": [1, 2]}, [0, PG_END_MS - 1]))
    with pytest.raises(ar.Unrepresentable, match="topic orders.eu partition 3 offset 101: "
                                                 "timestamp 294276-12-31 .* year 294247"
                       ) as refused:
        ar.RowReader(COLUMNS).batch(lines)
    assert (refused.value.topic, refused.value.partition, refused.value.offset) == (
        "orders\\eu", 3, 101)


def postgres_numeric(text: str, scale: int) -> Decimal:
    """numeric(p,s) input: rounded half away from zero to s places."""
    return Decimal(text).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)


def test_a_decimal_written_with_more_places_than_its_scale_is_rounded_as_postgres_does():
    # The JSON format passes a float's repr as written (json/values.decimal's fast path);
    # field_reader's read-back cannot even build the column (pyarrow refuses to round).
    amounts = [1.005, 2.675, -0.125, 19.999, 0.1 + 0.2, -9999999999.994, 1.25, None]
    columns = (("id", "long", True), ("amount", "decimal(12,2)", False))
    lines = encoded_lines(columns, records({"id": list(range(8)), "amount": amounts}))
    written = [line.split("\t")[5] for line in lines]
    assert written[:5] == ["1.005", "2.675", "-0.125", "19.999", "0.30000000000000004"]
    with pytest.raises(pa.ArrowInvalid):
        read_back(lines, columns)
    got = ar.RowReader(columns).batch(lines).column("amount").to_pylist()
    assert got == [None if w == NULL else postgres_numeric(w, 2) for w in written]
    assert got[:5] == [Decimal("1.01"), Decimal("2.68"), Decimal("-0.13"), Decimal("20.00"),
                       Decimal("0.30")]


def test_avro_logical_types_read_as_the_exact_read_back(schemas):  # noqa: F811
    from datetime import UTC, date, datetime

    columns = (("amount", "decimal(10,2)", False), ("at_ms", "timestamp", False),
               ("at_us", "timestamp", False), ("day", "date", False), ("id", "string", False))
    at = datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=UTC)
    values = [{"amount": Decimal("-12345678.91"), "at_ms": datetime(1, 1, 1, tzinfo=UTC),
               "at_us": at, "day": date(1, 1, 1), "id": "7d1c0b4e-0000-4000-8000-000000000000"},
              {"amount": Decimal("0.05"), "at_ms": at, "at_us": datetime(9999, 12, 31, 23, 59,
                                                                          59, 999999, tzinfo=UTC),
               "day": date(9999, 12, 31), "id": "00000000-0000-4000-8000-00000000000f"}]
    out = Encoder("avro", columns, 5, schemas=schemas, text_rows=True).encode(
        "t", 0, [Record(100 + i, wire(7, LOGICAL, v)) for i, v in enumerate(values)])
    assert out.dead == [] and len(out.rows) == 2
    batch = ar.RowReader(columns).batch(out.rows)
    got, want = as_dict(batch), read_back(out.rows, columns)
    for name in want:
        assert got[name] == want[name], name
    assert batch.column("at_us")[1].as_py() == datetime(9999, 12, 31, 23, 59, 59, 999999,
                                                         tzinfo=UTC)


def test_many_lines_in_one_batch_keep_their_order_and_values():
    n = 5000
    values = {"id": list(range(n)), "price": [i / 7 for i in range(n)],
              "name": [f"c{i}" if i % 11 else f"c\t{i}" for i in range(n)],
              "at": [None if i % 13 == 0 else f"2026-01-01T00:{i % 60:02d}:00.{i:06d}Z"
                     for i in range(n)]}
    lines = encoded_lines(recs=records(values, [1_700_000_000_000 + i for i in range(n)]))
    got = as_dict(ar.RowReader(COLUMNS).batch(lines))
    want = read_back(lines)
    for name in want:
        assert got[name] == want[name], name


def test_no_lines_are_an_empty_batch_of_the_schema():
    batch = ar.RowReader(COLUMNS).batch([])
    assert batch.num_rows == 0 and batch.schema == ar.arrow_schema(COLUMNS)


def test_lines_of_other_columns_are_refused():
    lines = encoded_lines()
    with pytest.raises(ValueError, match="not result rows of 2 declared columns"):
        ar.RowReader((("id", "long", True), ("qty", "int", False))).batch(lines)


def test_the_schema_is_the_kafka_columns_then_the_declared_ones_as_spark_types():
    columns = (("id", "long", True), ("amount", "decimal(12,2)", False),
               ("we`ird", "timestamp", False), ("day", "date", False))
    assert ar.spark_schema(columns) == (
        "`topic` string, `partition` int, `offset` bigint, `kafka_timestamp` timestamp, "
        "`id` bigint, `amount` decimal(12,2), `we``ird` timestamp, `day` date")
    schema = ar.arrow_schema(columns)
    assert schema.names == ["topic", "partition", "offset", "kafka_timestamp", "id", "amount",
                            "we`ird", "day"]
    assert schema.types == [pa.string(), pa.int32(), pa.int64(), pa.timestamp("us", "UTC"),
                            pa.int64(), pa.decimal128(12, 2), pa.timestamp("us", "UTC"),
                            pa.date32()]


@pytest.mark.parametrize("declared", ["jsonb", "array<long>", "array<decimal(10,2)>"])
def test_a_column_that_is_not_one_scalar_value_is_refused(declared):
    with pytest.raises(ar.NotOnTransformPath, match=f"column doc is {re.escape(declared)}"):
        ar.RowReader((("id", "long", True), ("doc", declared, False)))


def test_a_column_named_as_a_kafka_column_is_refused():
    with pytest.raises(ValueError, match="column offset has the name of a Kafka column"):
        ar.arrow_schema((("offset", "long", True),))


def test_the_exact_reading_agrees_with_pythons_on_far_and_near_instants():
    for text in ["2024-01-01 00:00:00+00", "0001-01-01 00:00:00.000001+00",
                 "1969-12-31 23:59:59.999+00"]:
        from datetime import UTC, datetime, timedelta

        want = (datetime.fromisoformat(text) - datetime(1970, 1, 1, tzinfo=UTC))
        assert ar.micros(text) == want // timedelta(microseconds=1)
    assert ar.micros("10000-01-01 00:00:00.000000+00") == 253_402_300_800_000_000
    assert ar.micros("0001-12-31 23:59:59.999000+00 BC") == -62_135_596_800_001_000
    assert math.isfinite(ar.micros("4714-11-24 00:00:00.000000+00 BC"))


def test_the_exact_reading_keeps_a_far_instants_fraction_and_takes_no_zone_as_utc(
        monkeypatch):
    assert ar.micros("10000-01-01 00:00:00.5+00") == 253_402_300_800_500_000
    assert ar.micros("10000-01-01 00:00:00.000001+00") == 253_402_300_800_000_001
    monkeypatch.setenv("TZ", "America/New_York")  # no zone of the OS takes part
    time.tzset()
    try:
        assert ar.micros("1970-01-01 00:00:01") == 1_000_000
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_decimal_that_does_not_fit_its_precision_after_rounding_is_refused():
    # Not a line the Encoder writes (it checks the precision): the guard of the fallback.
    line = "t\t0\t5\t2026-01-01 00:00:00.000000+00\t99999.995\t1\n"
    with pytest.raises(ValueError, match="'99999.995' does not fit decimal\\(7,2\\)"):
        ar.RowReader((("amount", "decimal(7,2)", False),)).batch([line])


@pytest.mark.parametrize("declared", ["decimal(12,2)", "decimal(6,3)", "decimal(15,0)",
                                      "decimal(3,3)"])
def test_floats_of_any_length_in_a_decimal_column_round_as_postgres_does(declared,
                                                                        monkeypatch):
    def per_field(field):  # rounded in Arrow's C++, not field by field
        raise AssertionError(f"the per-field reading of {field}")
    monkeypatch.setattr(ar, "_decimal", lambda precision, scale: per_field)
    rng = random.Random(declared)
    precision, scale = map(int, declared[8:-1].split(","))
    whole = 10 ** (precision - scale)
    floats = [round(rng.uniform(-whole, whole), rng.randrange(0, 18)) for _ in range(3000)]
    floats += [h / 1000 for h in range(-995, 1000, 10)]  # halves at three places
    columns = (("id", "long", True), ("amount", declared, False))
    out = Encoder("json", columns, 1).encode("t", 0, records(
        {"id": list(range(len(floats))), "amount": floats}))
    written = {int(line.split("\t")[2]): line.split("\t")[5] for line in out.rows}
    longer = sum(len(w.split(".")[-1]) > scale for w in written.values() if "." in w)
    assert longer > 100 or precision == scale  # (p,p): Encoder's exact path, s places
    got = ar.RowReader(columns).batch(out.rows).column("amount").to_pylist()
    assert got == [postgres_numeric(w, scale) for w in written.values()]


def test_a_reader_pickles_by_its_columns_and_reads_the_same_after():
    lines = encoded_lines()
    reader = pickle.loads(pickle.dumps(ar.RowReader(COLUMNS)))
    got, want = as_dict(reader.batch(lines)), as_dict(ar.RowReader(COLUMNS).batch(lines))
    assert {k: comparable(v) for k, v in got.items()} == {
        k: comparable(v) for k, v in want.items()}


def test_raw_rows_are_refused_they_are_copy_binary():
    with pytest.raises(TypeError, match="lines of bytes, not str: .* raw's are COPY binary"):
        ar.RowReader(COLUMNS).batch([b"PGCOPY\n"])


def random_timestamp(rng: random.Random) -> str:
    """An ISO timestamp of any instant of years 1-9999, any fraction length, any offset
    Postgres takes (the forms the JSON format passes as written, or converts)."""
    from datetime import UTC, datetime, timedelta

    at = datetime(1, 1, 2, tzinfo=UTC) + timedelta(
        microseconds=rng.randrange(315_537_500_000_000_000))
    places = rng.randrange(7)
    text = at.strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0")
    if places:
        text += "." + f"{at.microsecond:06d}"[:places]
    minutes = rng.randrange(-959, 960)
    return text + ("Z" if minutes == 0 else f"{'+-'[minutes < 0]}{abs(minutes) // 60:02d}:"
                   f"{abs(minutes) % 60:02d}")


def test_random_values_of_every_type_read_as_the_exact_read_back():
    rng = random.Random(25)
    n = 3000
    doubles = []
    while len(doubles) < n:  # any bit pattern: subnormals, huge, tiny; JSON has no NaN
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(x):
            doubles.append(x)
    values = {"id": [rng.randrange(-2**63, 2**63) for _ in range(n)],
              "qty": [rng.randrange(-2**31, 2**31) for _ in range(n)],
              "price": doubles,
              "exact": [Decimal(rng.randrange(-10**38 + 1, 10**38)).scaleb(-10)
                        for _ in range(n)],
              "at": [random_timestamp(rng) for _ in range(n)],
              "day": [(date(1, 1, 1) + timedelta(days=rng.randrange(3_652_059))).isoformat()
                      for _ in range(n)]}
    kafka_ms = [rng.randrange(PG_FIRST_MS, 2**53) for _ in range(n)]
    lines = encoded_lines(recs=records(values, kafka_ms))
    got, want = as_dict(ar.RowReader(COLUMNS).batch(lines)), read_back(lines, kafka_ms=kafka_ms)
    for name in want:
        assert comparable(got[name]) == comparable(want[name]), name
