"""A transform's rows as COPY binary tuples (executor/transform/arrow_binary.py) store
exactly what their COPY text lines (executor/transform/arrow_copy.py) store: the same Arrow
batches, built the way Spark hands them to the writer (a null in every column, sliced
batches), COPYed both ways into tables of every type the tuples cover, in the real Postgres,
and read back both as Postgres prints the rows and as its own binary output (the stored
form: a numeric's digits, weight and display scale as Postgres normalized them). Values that
Postgres refuses as text it refuses as a tuple too."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from psycopg import sql

from pipeline.executor.transform import arrow_binary, arrow_copy
from pipeline.formats.timestamps import PG_FIRST_MS, TimestampOutOfRange
from pipeline.store.copy_in import copy_in
from tests.helpers import TEST_DB_URL

# (name, Postgres type, the Arrow type Spark hands over for the column)
COLUMNS = [
    ("topic", "text", pa.string()), ("partition", "integer", pa.int32()),
    ("offset", "bigint", pa.int64()),
    ("kafka_timestamp", "timestamp with time zone", pa.timestamp("us", tz="UTC")),
    ("name", "text", pa.string()), ("n", "bigint", pa.int32()),
    ("i", "integer", pa.int32()), ("s", "smallint", pa.int16()),
    ("x", "double precision", pa.float64()), ("f", "real", pa.float32()),
    ("ok", "boolean", pa.bool_()), ("at", "timestamp with time zone", pa.timestamp("us")),
    ("day", "date", pa.date32()), ("amount", "numeric(12,2)", pa.decimal128(12, 2)),
    ("whole", "numeric(18,0)", pa.decimal128(18, 0)),
    ("fine", "numeric(18,6)", pa.decimal128(18, 6)),
    ("frac", "numeric(4,4)", pa.decimal128(4, 4)),
    ("tiny", "numeric(18,18)", pa.decimal128(18, 18)),
    ("odd", "numeric(7,3)", pa.decimal128(5, 3)), ("k", "bytea", pa.binary())]

STRINGS = ["", "a", "tab\there", "back\\slash", "new\nline", "cr\rx", "\\N", "é ü 日本 😀",
           "a\\tb", " padded ", "'quoted'", "x" * 300]
AMOUNTS = ["0", "0.05", "-0.05", "0.01", "-0.01", "6.25", "-6.25", "1", "10000", "-10000.01",
           "9999999999.99", "-9999999999.99", "99999999.99", "123456789.10", "0.50"]
WHOLES = ["0", "1", "-1", "10000", "9999", "-99999999", "100000000", "999999999999999999",
          "-999999999999999999", "500000000000000000"]
FINES = ["0", "0.000001", "-0.000001", "0.05", "-0.05", "123456789012.345678",
         "-999999999999.999999", "1.5", "10000.0001", "0.0001"]
FRACS = ["0", "0.0001", "-0.0001", "0.9999", "-0.9999", "0.5", "0.0500"]
TINIES = ["0", "0.000000000000000001", "-0.999999999999999999", "0.5", "0.123456789012345678"]
ODDS = ["0", "1.5", "-99.999", "0.001", "12.340"]
TIMES = [datetime(2000, 1, 1, tzinfo=UTC), datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
         datetime(1970, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
         datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
         datetime(1900, 3, 1, 12, 0, 0, 1, tzinfo=UTC), datetime(2026, 11, 26, 10, tzinfo=UTC)]
# Past year 9999 and before year 1 (the text path's far_timestamp form), as microseconds,
# up to int64's largest (year 294247, inside Postgres's range).
FAR_US = [1_761_000_000_000_000_000 + 123, -62_135_596_800_000_000 - 86_400_000_000,
          2**63 - 1]
DAYS = [date(2000, 1, 1), date(1999, 12, 31), date(1970, 1, 1), date(1969, 12, 31),
        date(1, 1, 1), date(9999, 12, 31), date(2024, 2, 29)]
DOUBLES = [0.0, -0.0, 1.5, -2.25, 1e300, -1e-300, 5e-324, 0.1, 1 / 3, float("nan"),
           float("inf"), float("-inf"), 123456789.123456789]
FLOATS = [0.0, -0.0, 0.1, 1.5, 3.4e38, -1.17e-38, 1e-45, 16777217.0, float("nan"),
          float("inf"), float("-inf")]
LONGS = [0, 1, -1, 2**31 - 1, -(2**31)]
SHORTS = [0, 1, -1, 32767, -32768]
BYTES = [b"", b"\x00", b"\xff\x00\\x", b"\\N", b"\t\n", bytes(range(256))]


def _value(rng: random.Random, name: str, i: int):
    """Column ``name``'s value in row ``i``: one of its edge cases, or NULL."""
    if name in ("topic", "partition", "offset") or rng.random() < 0.12:
        return {"topic": "orders.eu-1", "partition": i % 4, "offset": i}.get(name)
    pick = rng.choice
    return {"kafka_timestamp": TIMES[i % len(TIMES)], "name": pick(STRINGS),
            "n": pick(LONGS), "i": pick(LONGS), "s": pick(SHORTS), "x": pick(DOUBLES),
            "f": pick(FLOATS), "ok": pick([True, False]),
            "at": pick([*TIMES, datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=i)]
                       ).replace(tzinfo=None),
            "day": pick(DAYS), "amount": Decimal(pick(AMOUNTS)),
            "whole": Decimal(pick(WHOLES)), "fine": Decimal(pick(FINES)),
            "frac": Decimal(pick(FRACS)), "tiny": Decimal(pick(TINIES)),
            "odd": Decimal(pick(ODDS)), "k": pick(BYTES)}[name]


def batch(rows: int, seed: int, columns=COLUMNS) -> pa.RecordBatch:
    rng = random.Random(seed)
    return pa.RecordBatch.from_arrays(
        [pa.array([_value(rng, name, i) for i in range(rows)], t) for name, _, t in columns],
        names=[c[0] for c in columns])


def batches() -> list[pa.RecordBatch]:
    """Varied batches: no NULL in one, only NULLs in a column, sliced (an offset into the
    buffers), one row, and far timestamps."""
    big = batch(600, 1)
    no_nulls = batch(50, 2)
    no_nulls = pa.RecordBatch.from_arrays(
        [pc.fill_null(c, no_nulls.column(0)[0].cast(c.type)) if c.type == pa.string() else
         pc.drop_null(c).take(pa.array([j % max(1, len(pc.drop_null(c)))
                                        for j in range(50)])) for c in no_nulls.columns],
        names=no_nulls.schema.names)
    nulls = batch(20, 3)
    nulls = pa.RecordBatch.from_arrays(
        [c if n in ("topic", "partition", "offset") else pa.nulls(20, c.type)
         for n, c in zip(nulls.schema.names, nulls.columns, strict=True)],
        names=nulls.schema.names)
    far = batch(len(FAR_US), 4).set_column(
        3, "kafka_timestamp", pa.array(FAR_US, pa.timestamp("us", tz="UTC")))
    out, first = [], 0
    for b in [big.slice(0, 300), big.slice(300), big.slice(17, 5), no_nulls, nulls,
              batch(1, 5), far]:  # offsets unique across the batches: the rows' order
        out.append(b.set_column(2, "offset", pa.array(range(first, first + len(b)),
                                                      pa.int64())))
        first += len(b)
    return out


def _table(conn, name: str, columns) -> None:
    conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}, run_id bigint)").format(
        sql.Identifier(name), sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c[0]), sql.SQL(c[1])) for c in columns)))


def _copy(conn, name: str, rows, binary: bool) -> None:
    copy_in(conn.cursor(), sql.Identifier(name), None, rows, binary)


def _both(conn, batches, columns=COLUMNS, fixed=None) -> tuple[list, list, bytes, bytes]:
    """The batches COPYed as text lines and as binary tuples: each table's rows as
    Postgres prints them, and its COPY binary output."""
    typed = [(c[0], c[1]) for c in columns]
    conn.execute("SET TimeZone = 'UTC'")
    out = []
    for name, binary in (("as_text", False), ("as_binary", True)):
        _table(conn, name, columns)
        encode = arrow_binary.tuples if binary else arrow_copy.lines
        _copy(conn, name, [v.as_py() if binary else v.as_py().encode()
                           for b in batches for v in encode(b, typed, 7, pa, pc, fixed)],
              binary)
        order = sql.SQL('ORDER BY "offset"')
        printed = conn.execute(sql.SQL("SELECT t::text FROM {} t {}").format(
            sql.Identifier(name), order)).fetchall()
        with conn.cursor().copy(sql.SQL(
                "COPY (SELECT * FROM {} {}) TO STDOUT (FORMAT BINARY)").format(
                    sql.Identifier(name), order)) as cp:
            stored = b"".join(bytes(block) for block in cp)
        out.append(([r[0] for r in printed], stored))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def test_binary_tuples_store_what_the_text_lines_store():
    with psycopg.connect(TEST_DB_URL) as conn:
        as_text, as_binary, text_stored, binary_stored = _both(conn, batches())
        # The edge cases as Postgres prints them, from the tuples' table.
        seen = {c: {r[0] for r in conn.execute(sql.SQL(
            "SELECT DISTINCT {}::text FROM as_binary").format(sql.Identifier(c)))}
            for c in ("amount", "whole", "fine", "frac", "tiny", "kafka_timestamp", "day",
                      "x", "name")}
    assert len(as_binary) == len(as_text) == 300 + 300 + 5 + 50 + 20 + 1 + len(FAR_US)
    assert as_binary == as_text
    assert binary_stored == text_stored
    assert {"0.00", "0.05", "-0.05", "-9999999999.99", "10000.00", "0.50", None} <= seen["amount"]
    assert {"0", "-999999999999999999", "100000000"} <= seen["whole"]
    assert {"0.000000", "-0.000001", "-999999999999.999999", "10000.000100"} <= seen["fine"]
    assert {"0.0000", "-0.9999", "0.0500"} <= seen["frac"]
    assert {"0.000000000000000001", "-0.999999999999999999"} <= seen["tiny"]
    assert {"0001-01-01 00:00:00+00", "1969-12-31 23:59:59.999999+00",
            "9999-12-31 23:59:59.999999+00", "57773-11-13 10:40:00.000123+00",
            "0001-12-31 00:00:00+00 BC"} <= seen["kafka_timestamp"]
    assert {"0001-01-01", "1969-12-31", "9999-12-31"} <= seen["day"]
    assert {"NaN", "Infinity", "-Infinity", "-0"} <= seen["x"]
    assert {"", "tab\there", "é ü 日本 😀", "\\N", None} <= seen["name"]


def test_a_fixed_topic_is_the_column_it_replaces():
    b = batches()[0]
    with psycopg.connect(TEST_DB_URL) as conn:
        _, whole, _, whole_stored = _both(conn, [b])
    with psycopg.connect(TEST_DB_URL) as conn:
        _, fixed, _, fixed_stored = _both(conn, [b.drop_columns(["topic"])],
                                          fixed={"topic": "orders.eu-1"})
    assert fixed == whole and fixed_stored == whole_stored


@pytest.mark.parametrize(("column", "values", "error"), [
    # NUL in text: Postgres refuses it in either form.
    (("name", "text", pa.string()), ["a\x00b"], psycopg.errors.CharacterNotInRepertoire),
    # A decimal wider than the column: numeric's precision check, either way.
    (("amount", "numeric(4,2)", pa.decimal128(6, 2)), [Decimal("1234.56")],
     psycopg.errors.NumericValueOutOfRange),
    # A timestamp out of Postgres's range (never its -infinity): refused by the writer.
    (("at", "timestamp with time zone", pa.timestamp("us", tz="UTC")), [-(2**63) + 1],
     TimestampOutOfRange),
    (("at", "timestamp with time zone", pa.timestamp("us")), [PG_FIRST_MS * 1000 - 1],
     TimestampOutOfRange),
    # A day at int32's ends (Arrow prints no date for it): never Postgres's -infinity.
    (("day", "date", pa.date32()), [-(2**31) + 10_957], psycopg.errors.DataError),
    (("day", "date", pa.date32()), [2**31 - 1], psycopg.errors.DataError),
], ids=["nul", "precision", "int64-min", "just-before-4714-bc", "int32-min-day",
        "int32-max-day"])
def test_what_postgres_refuses_as_text_it_refuses_as_a_tuple(column, values, error):
    b = pa.RecordBatch.from_arrays([pa.array([0], pa.int64()), pa.array(values, column[2])],
                                   names=["offset", column[0]])
    typed = [("offset", "bigint"), column[:2]]
    for encode, binary in ((arrow_copy.lines, False), (arrow_binary.tuples, True)):
        with psycopg.connect(TEST_DB_URL) as conn, pytest.raises(error):
            _table(conn, "refused", typed)
            _copy(conn, "refused", [v.as_py() if binary else v.as_py().encode()
                                    for v in encode(b, typed, 7, pa, pc)], binary)
    # Just inside the range: stored, the same both ways.
    if error is TimestampOutOfRange:
        b = b.set_column(1, column[0], pa.array([PG_FIRST_MS * 1000], column[2]))
        with psycopg.connect(TEST_DB_URL) as conn:
            as_text, as_binary, text_stored, binary_stored = _both(
                conn, [b], [("offset", "bigint", pa.int64()), column])
        assert as_binary == as_text and binary_stored == text_stored, as_text
