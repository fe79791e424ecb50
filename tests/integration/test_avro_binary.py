"""The avro sink's COPY binary tuples (formats/binary_fields.py) store exactly what its COPY
text rows store: the same records through both wires of the Encoder, each COPYed into a
table of the declared columns' Postgres types in the real Postgres, read back as Postgres
writes them (numerics with their scale, timestamps in UTC, dates, doubles, text), equal
row for row; the dead letters identical. The varied records of test_avro_rows (writer
versions, nested paths, enums, text to escape, years 1 and 9999, NaN and infinities, wide
and corrupt values) and the numeric and timestamp edge cases named below."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql

from pipeline.formats import paths
from pipeline.formats.encode import Encoder
from pipeline.formats.types import column_type
from pipeline.store.copy_in import copy_in
from tests.helpers import TEST_DB_URL
from tests.unit.test_avro import wire
from tests.unit.test_avro_rows import COLUMNS, FLAT_COLUMNS, NESTED_COLUMNS, Record, values
from tests.unit.test_avro_rows import schemas as schemas  # noqa: F401 - the fixture

# Edge cases: a writer with decimals of scale 2 (the bench's), 0 and 6 (more than one
# base-10000 digit of fraction), timestamps in micros and millis, a date.
EDGES = {"type": "record", "name": "Edge", "fields": [
    {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                         "precision": 12, "scale": 2}]},
    {"name": "whole", "type": {"type": "bytes", "logicalType": "decimal", "precision": 18,
                               "scale": 0}},
    {"name": "fine", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20,
                              "scale": 6}},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
]}
EDGE_COLUMNS = (("amount", "decimal(12,2)", False), ("whole", "decimal(18,0)", True),
                ("fine", "decimal(20,6)", True), ("at", "timestamp", False),
                ("at_ms", "timestamp", True), ("day", "date", True))
AMOUNTS = ["0", "0.05", "-0.05", "6.25", "-6.25", "9999999999.99", "-9999999999.99",
           "0.01", "-0.01", "10000", "-10000.01", "99999999.99", "123456789.1", None]
WHOLES = ["0", "1", "-1", "10000", "-99999999", "999999999999999999", "-999999999999999999"]
FINES = ["0", "0.000001", "-0.000001", "0.05", "-0.05", "12345678901234.567891",
         "-99999999999999.999999", "1.5"]
TIMES = [datetime(2000, 1, 1, tzinfo=UTC), datetime(1999, 12, 31, 23, 59, 59, 999999,
                                                    tzinfo=UTC),
         datetime(1970, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 999999,
                                                    tzinfo=UTC),
         datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
         datetime(1900, 3, 1, 12, 0, 0, 1, tzinfo=UTC), datetime(2026, 11, 26, 10, tzinfo=UTC),
         None]
DAYS = [date(2000, 1, 1), date(1999, 12, 31), date(1970, 1, 1), date(1969, 12, 31),
        date(1, 1, 1), date(9999, 12, 31)]
# Beyond years 1-9999 (a far time, written without its logical type): corrupt_avro, as
# fastavro says; an amount one digit wider than numeric(12,2) (10000000000.00):
# wrong_type. Dead letters through either wire.
FAR_US = [253_402_300_800_000_000, -62_135_596_800_000_001, 2**62]


def _table(conn, name: str, columns) -> None:
    cols = [sql.SQL("{} {}").format(sql.Identifier(c[0]), sql.SQL(column_type(c[1]).pg))
            for c in paths.columns(columns)]
    conn.execute(sql.SQL("CREATE TEMP TABLE {} (topic text, partition int, \"offset\" bigint, "
                         "kafka_timestamp timestamptz, {}, run_id bigint)").format(
        sql.Identifier(name), sql.SQL(", ").join(cols)))


def _stored(conn, columns, text_rows: list[str], binary_rows: list[bytes]) -> tuple[list, list]:
    """Both wires' rows COPYed into tables of the columns' types, read back as text."""
    conn.execute("SET TimeZone = 'UTC'")
    out = []
    for name, rows, binary in (("as_text", text_rows, False), ("as_binary", binary_rows, True)):
        _table(conn, name, columns)
        copy_in(conn.cursor(), sql.Identifier(name), None,
                [r if binary else r.encode() for r in rows], binary)
        got = conn.execute(sql.SQL("SELECT t::text FROM {} AS t ORDER BY \"offset\"").format(
            sql.Identifier(name))).fetchall()
        out.append([r[0] for r in got])
    return out[0], out[1]


def _both(schemas, columns, records, batch: int = 500):  # noqa: F811
    """(text rows, binary rows, dead letters of each) of the same records."""
    got = []
    for text_rows in (True, False):
        enc = Encoder("avro", columns, 7, schemas=schemas, text_rows=text_rows)
        assert enc.binary is not text_rows
        rows, dead = [], []
        for i in range(0, len(records), batch):
            e = enc.encode("t\tx", 3, records[i:i + batch])
            rows += e.rows
            dead += e.dead
        got.append((rows, dead))
    return got[0][0], got[1][0], got[0][1], got[1][1]


@pytest.mark.parametrize("columns", [COLUMNS, FLAT_COLUMNS, NESTED_COLUMNS],
                         ids=["paths", "flat", "nested"])
def test_binary_tuples_store_what_the_text_rows_store(schemas, columns):  # noqa: F811
    rng = random.Random(26)
    records = [Record(i, v, ts=1_700_000_000_000 + rng.choice([0, i, -i * 10**9]))
               for i, v in enumerate(values(rng, 3000))]
    text_rows, binary_rows, text_dead, binary_dead = _both(schemas, columns, records)
    assert binary_dead == text_dead and len(text_dead) > 300
    assert len(binary_rows) == len(text_rows) > 1000
    with psycopg.connect(TEST_DB_URL) as conn:
        as_text, as_binary = _stored(conn, columns, text_rows, binary_rows)
    assert as_binary == as_text


def _edge(i: int, amount, whole, fine, at, day, at_ms=None) -> dict:
    return {"amount": None if amount is None else Decimal(amount), "whole": Decimal(whole),
            "fine": Decimal(fine), "at": at, "day": day,
            "at_ms": at_ms or datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=i)}


def test_numeric_and_timestamp_edges_store_what_the_text_rows_store(tmp_path):
    import json

    from pipeline.formats.schema_source import SchemaSource

    (tmp_path / "1.avsc").write_text(json.dumps(EDGES))
    plain = json.loads(json.dumps(EDGES).replace('"logicalType"', '"x"'))
    schemas = SchemaSource(schemas_dir=str(tmp_path))
    docs = [_edge(i, AMOUNTS[i % len(AMOUNTS)], WHOLES[i % len(WHOLES)],
                  FINES[i % len(FINES)], TIMES[i % len(TIMES)], DAYS[i % len(DAYS)],
                  TIMES[(i + 3) % (len(TIMES) - 1)])
            for i in range(120)]
    values = [wire(1, EDGES, d) for d in docs]
    far = [wire(1, plain, {**_edge(0, "1", "1", "1", None, date(2000, 1, 1)),
                           "amount": b"\x01", "whole": b"\x01", "fine": b"\x01", "at": us,
                           "day": 0, "at_ms": 0}) for us in FAR_US]
    # The unscaled bytes of an amount one digit too wide (fastavro refuses to write it).
    wide = wire(1, plain, {**_edge(0, "1", "1", "1", None, date(2000, 1, 1)), "amount": (
        10**12).to_bytes(6, "big", signed=True), "whole": b"\x01", "fine": b"\x01",
        "day": 0, "at_ms": 0})
    records = [Record(i, v) for i, v in enumerate([*values, *far, wide])]
    for batch in (1, 7, 500):  # the first record of a writer, the loop, the general path
        text_rows, binary_rows, text_dead, binary_dead = _both(schemas, EDGE_COLUMNS, records,
                                                               batch)
        assert binary_dead == text_dead
        assert [d.split("\t")[7] for d in binary_dead] == ["corrupt_avro"] * 3 + [
            "wrong_type"], binary_dead
        with psycopg.connect(TEST_DB_URL) as conn:
            as_text, as_binary = _stored(conn, EDGE_COLUMNS, text_rows, binary_rows)
            assert as_binary == as_text and len(as_binary) == 120
            # Read back as written: the scale of each numeric, times before 2000 and 1970.
            got = conn.execute("SELECT amount::text, whole::text, fine::text, at::text, "
                               "day::text FROM as_binary ORDER BY \"offset\" LIMIT 14"
                               ).fetchall()
    assert [g[0] for g in got] == [
        "0.00", "0.05", "-0.05", "6.25", "-6.25", "9999999999.99", "-9999999999.99", "0.01",
        "-0.01", "10000.00", "-10000.01", "99999999.99", "123456789.10", None]
    assert [g[1] for g in got[:7]] == WHOLES
    assert [g[2] for g in got[:8]] == ["0.000000", "0.000001", "-0.000001", "0.050000",
                                       "-0.050000", "12345678901234.567891",
                                       "-99999999999999.999999", "1.500000"]
    assert [g[3] for g in got[:9]] == [
        "2000-01-01 00:00:00+00", "1999-12-31 23:59:59.999999+00", "1970-01-01 00:00:00+00",
        "1969-12-31 23:59:59.999999+00", "0001-01-01 00:00:00+00",
        "9999-12-31 23:59:59.999999+00", "1900-03-01 12:00:00.000001+00",
        "2026-11-26 10:00:00+00", None]
    assert [g[4] for g in got[:6]] == ["2000-01-01", "1999-12-31", "1970-01-01", "1969-12-31",
                                       "0001-01-01", "9999-12-31"]
