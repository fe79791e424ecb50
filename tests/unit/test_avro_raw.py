"""The avro format's fast decode (formats/avro/raw.py: logical types of the fields columns
take straight to text read raw) writes exactly what the typed rules write, and refuses
exactly what they refuse, with the same messages: the same records through both."""

import json
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from pipeline.formats.avro import format as avro_format
from pipeline.formats.encode import Encoder
from pipeline.formats.schema_source import SchemaSource
from tests.unit.test_avro import wire
from tests.unit.test_encode import Record

SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "fine", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                       "precision": 20, "scale": 4}], "default": None},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "at_ms", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
     "default": None},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
    {"name": "other", "type": {"type": "long", "logicalType": "timestamp-micros"}},
]}
COLUMNS = (("amount", "decimal(6,2)", True), ("fine", "decimal(20,2)", False),
           ("at_us", "timestamp", False), ("at_ms", "timestamp", True),
           ("local", "timestamp", False), ("day", "date", False))  # "other": read by none


def value(rng: random.Random) -> dict:
    def when():
        return datetime(1900, 1, 1, tzinfo=UTC) + timedelta(
            microseconds=rng.randrange(0, 250 * 365 * 86_400 * 10**6))
    return {"amount": Decimal(rng.choice([0, 1, -1, 5, -99, 999_999, -999_999, 1_000_000,
                                          rng.randrange(-10**8, 10**8)])).scaleb(-2),
            "fine": rng.choice([None, Decimal(rng.randrange(-10**12, 10**12)).scaleb(-4)]),
            "at_us": when(), "at_ms": rng.choice([None, when().replace(microsecond=1000)]),
            "local": when().replace(tzinfo=None),
            "day": rng.choice([None, date(1, 1, 1), date(9999, 12, 31), when().date()]),
            "other": when()}


def _decimals(row: str) -> list:
    """A row's fields, the decimal columns' (amount, fine) as (sign, digits, exponent)."""
    fields = row.split("\t")
    return [Decimal(f).as_tuple() if i in (4, 5) and f != "\\N" else f
            for i, f in enumerate(fields)]


@pytest.mark.parametrize("text_rows", [True, False], ids=["text", "binary"])
def test_the_fast_decode_writes_and_refuses_exactly_as_the_typed_rules(tmp_path, monkeypatch,
                                                                      text_rows):
    (tmp_path / "1.avsc").write_text(json.dumps(SCHEMA))
    rng = random.Random(7)
    records = [Record(i, wire(1, SCHEMA, value(rng))) for i in range(2000)]

    def run():
        enc = Encoder("avro", COLUMNS, 1, schemas=SchemaSource(schemas_dir=str(tmp_path)),
                      text_rows=text_rows)
        out = [enc.encode("t", 0, records[i:i + 500]) for i in range(0, 2000, 500)]
        return out, [w[2] for w in enc.format._known.values()]

    fast, plans = run()
    # Every column read raw but "fine" (the writer's scale 4 is not the column's 2).
    assert len(plans) == 1 and [c[2].__module__ == "pipeline.formats.avro.raw"
                                for c in plans[0]] == [True, False, True, True, True, True]
    monkeypatch.setattr(avro_format, "raw_plan", lambda schema, columns: (
        None, [None] * len(columns)))
    typed, plans = run()
    assert plans == [None]
    # A raw decimal is written as its unscaled integer and the scale's exponent ("125e-2",
    # the typed rule's "1.25"): the same digits, sign and scale, which is what Postgres's
    # numeric input and Arrow's cast read; every other field byte for byte. As COPY
    # binary tuples both are numeric's own form of the value: byte for byte.
    if not text_rows:
        assert [(e.rows, e.dead) for e in fast] == [(e.rows, e.dead) for e in typed]
    else:
        assert [([_decimals(r) for r in e.rows], e.dead) for e in fast] == [
            ([_decimals(r) for r in e.rows], e.dead) for e in typed]
        assert any("e-2" in r.split("\t")[4] for e in fast for r in e.rows)
    rows, dead = sum(len(e.rows) for e in fast), sum(len(e.dead) for e in fast)
    assert rows > 200 and dead > 200  # both kinds exercised: wide amounts, null at_ms


@pytest.mark.parametrize("column, raw", [("decimal(12,2)", True), ("decimal(12,3)", False),
                                         ("string", False), ("timestamp", False)])
def test_only_a_column_of_the_matching_type_reads_a_field_raw(column, raw):
    import fastavro

    from pipeline.formats.avro.raw import raw_plan

    parsed = fastavro.parse_schema(SCHEMA, named_schemas={})
    fmt = avro_format.AvroFormat((("amount", column, False),), 1, SchemaSource(schemas_dir="."))
    schema, converters = raw_plan(parsed, fmt.columns)
    assert (converters[0] is not None) == raw
    amount = (schema or parsed)["fields"][0]["type"]
    assert (amount == "bytes") == raw
