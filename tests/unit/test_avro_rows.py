"""The avro format's generated batch loop (formats/avro/rows.py) writes exactly the rows and
dead letters of the general path (a value at a time through AvroFormat.project): the same
records, bench orders and varied ones (schema evolution, logical types, nested paths, text
to escape, values out of range, corrupt and foreign records), through both."""

import json
import random
import struct
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from bench.avro_orders import SCHEMA as ORDERS
from bench.avro_orders import avro_order
from pipeline.formats.avro import format as avro_format
from pipeline.formats.encode import Encoder
from pipeline.formats.schema_source import SchemaSource
from tests.unit.test_avro import wire
from tests.unit.test_encode import Record

# v2 of the orders: order_id an int (promoted to the long column), customer nullable,
# amount nullable, placed_at in millis, a nested record read by a path, a uuid, a field
# nobody declared.
ORDERS_V2 = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "int"},
    {"name": "customer", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                         "precision": 20, "scale": 2}], "default": None},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "who", "type": ["null", {"type": "record", "name": "Who", "fields": [
        {"name": "id", "type": "long"}, {"name": "ref", "type": {
            "type": "string", "logicalType": "uuid"}}]}], "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "note", "type": "string", "default": ""},
]}
# v3: amount of another scale (typed, not raw), placed_at a plain long: a wrong type.
ORDERS_V3 = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20,
                                "scale": 4}},
    {"name": "placed_at", "type": "long"},
]}
# v4: flat, every kind the generated decode reads (avro/decode.py), nulls either side.
ORDERS_V4 = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "customer", "type": ["string", "null"]},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "placed_at", "type": ["null", {"type": "long",
                                            "logicalType": "timestamp-micros"}]},
    {"name": "ok", "type": "boolean"},
    {"name": "ratio", "type": ["null", "double"]},
    {"name": "score", "type": "float"},
    {"name": "qty", "type": "int"},
    {"name": "nothing", "type": "null"},
    {"name": "tag", "type": "bytes"},
]}
# v6 and v7: records the columns' paths reach into, of plain fields (the generated
# decode, avro/decode.py): who a nullable record (v6), a record holding a nullable record
# (v7); "who" read by who.id (an int column: a long beyond it is wrong_type) and who.ref.
_WHO = [{"name": "id", "type": "long"}, {"name": "ref", "type": ["null", "string"]}]
ORDERS_V6 = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    *ORDERS["fields"],
    {"name": "who", "type": ["null", {"type": "record", "name": "Who", "fields": _WHO}]},
]}
ORDERS_V7 = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "who", "type": {"type": "record", "name": "Who", "fields": [
        {"name": "in", "type": ["null", {"type": "record", "name": "In", "fields": [
            {"name": "x", "type": "int"}]}]},
        *_WHO, {"name": "flag", "type": "boolean"}]}},
    *ORDERS["fields"],
]}
# v8: who a nullable string: the path who.id runs through it (wrong_type, or null).
ORDERS_V8 = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    *ORDERS["fields"], {"name": "who", "type": ["null", "string"]}]}
# v9: customer an enum (its symbol into the string column), a nullable enum read by none.
_SYMBOLS = [f"c{i}" for i in range(97)] + ["x_y"]
ORDERS_V9 = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "state", "type": ["null", {"type": "enum", "name": "S", "symbols": ["A", "B"]}]},
    *[{**f, "type": {"type": "enum", "name": "C", "symbols": _SYMBOLS}}
      if f["name"] == "customer" else f for f in ORDERS["fields"]]]}
# v10: customer a nullable enum.
ORDERS_V10 = {**ORDERS_V9, "fields": [
    {**f, "type": ["null", f["type"]]} if f["name"] == "customer" else f
    for f in ORDERS_V9["fields"]]}
COLUMNS = (("order_id", "long", True), ("customer", "string", True),
           ("amount", "decimal(12,2)", False), ("placed_at", "timestamp", False),
           ("who_id", "int", False, ("who", "id")), ("ref", "string", False, ("who", "ref")),
           ("day", "date", False))
# Top-level columns only: flat writers (v1, v3, v4) take the generated decode (v4's
# nothing and tag read by none: decoded past).
FLAT_COLUMNS = (*COLUMNS[:4], ("ok", "boolean", False), ("ratio", "double", False),
                ("score", "double", False), ("qty", "int", False), ("day", "date", False))
# who.id into a long column: a field never null in its record, in a record that can be.
NESTED_COLUMNS = (*COLUMNS[:4], ("who_id", "long", False, ("who", "id")),
                  ("ref", "string", False, ("who", "ref")))
TEXTS = ["c1", "", "a b", "tab\there", "back\\slash", "new\nline", "cr\r", "nul\x00",
         "é", "日本", "x" * 50]


def _when(rng: random.Random) -> datetime:
    return datetime(1, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=rng.randrange(0, 9998 * 365 * 86_400 * 10**6))


def _amount(rng: random.Random, scale: int, wide: bool = True) -> Decimal:
    """Wide: past the column's 12 digits too (the writer's precision is 20)."""
    return Decimal(rng.choice([0, 1, -1, 99, -100, 10**12 - 1, -(10**12 - 1), 10**12 - 1,
                               *([10**12, rng.randrange(-10**13, 10**13)] if wide else []),
                               rng.randrange(-10**11, 10**11)])).scaleb(-scale)


def _v2(rng: random.Random, i: int) -> dict:
    return {"order_id": rng.choice([i, -i, 2**31 - 1]), "customer": rng.choice(
                [None, *TEXTS]), "amount": rng.choice([None, _amount(rng, 2)]),
            "placed_at": _when(rng).replace(microsecond=rng.choice([0, 1000, 999_000])),
            "who": rng.choice([None, {"id": rng.choice([1, -5, 2**31, -(2**31) - 1]),
                                      "ref": str(uuid.UUID(int=rng.getrandbits(128)))}]),
            "day": rng.choice([date(1, 1, 1), date(9999, 12, 31), _when(rng).date()]),
            "note": rng.choice(TEXTS)}


def _who(rng: random.Random) -> dict:
    return {"id": rng.choice([1, -5, 2**31, -(2**31) - 1, 2**63 - 1]),
            "ref": rng.choice([None, *TEXTS])}


def _v6(rng: random.Random, i: int) -> dict:
    return {**_orders(rng, i), "who": rng.choice([None, _who(rng)])}


def _v7(rng: random.Random, i: int) -> dict:
    return {**_orders(rng, i), "who": {**_who(rng), "flag": rng.random() < 0.5,
                                       "in": rng.choice([None, {"x": rng.choice([0, -7])}])}}


def _v3(rng: random.Random, i: int) -> dict:
    return {"order_id": i, "customer": rng.choice(TEXTS), "amount": _amount(rng, 4),
            "placed_at": rng.randrange(-2**40, 2**40)}


def _v4(rng: random.Random, i: int) -> dict:
    return {"order_id": rng.choice([i, -i, 2**63 - 1, -2**63]),
            "customer": rng.choice([None, *TEXTS]), "amount": _amount(rng, 2, wide=False),
            "placed_at": rng.choice([None, _when(rng)]), "ok": rng.random() < 0.5,
            "ratio": rng.choice([None, 0.1, -2.5, 1e308, float("inf"), float("nan"), 3]),
            "score": rng.choice([0.0, 1.5, -3.25, 1e30]),
            "qty": rng.choice([0, 5, -(2**31), 2**31 - 1]), "nothing": None,
            "tag": rng.choice([b"", b"x", b"\xff\x00", b"tab\t"])}


def _flipped(rng: random.Random, good: bytes) -> bytes:
    """A byte of the datum changed: decodes to other values, or not at all."""
    at = rng.randrange(5, len(good))
    return good[:at] + bytes([rng.randrange(256)]) + good[at + 1:]


def _crafted(rng: random.Random, i: int) -> bytes:
    """v4's bytes as its writer would never write them, by writing another type in a
    field's place: a boolean byte 2 (fastavro reads any non-zero as true), a string of
    negative length, a float's 4 bytes that are a double's first half."""
    doc = _v4(rng, i)
    field, avro, value = rng.choice([("ok", "int", 1), ("customer", ["long", "null"], -3),
                                     ("score", "int", 7), ("qty", "long", 2**40)])
    schema = {**ORDERS_V4, "fields": [{**f, "type": avro} if f["name"] == field else f
                                      for f in ORDERS_V4["fields"]]}
    return wire(5, schema, {**doc, field: value})


def _orders(rng: random.Random, i: int) -> dict:
    doc = avro_order(i)
    if rng.random() < 0.3:  # beyond the bench's shapes: any time, any amount, any text
        doc = {**doc, "placed_at": _when(rng), "amount": _amount(rng, 2, wide=False),
               "customer": rng.choice(TEXTS), "order_id": rng.choice([i, -2**63, 2**63 - 1])}
    return doc


def _raw(schema_id: int, schema: dict, doc: dict) -> bytes:
    """A value fastavro would refuse to write typed: placed_at's long as it is (past
    year 9999, before year 1), written against the schema without logical types."""
    plain = json.loads(json.dumps(schema).replace('"logicalType"', '"x"'))
    return wire(schema_id, plain, doc)


def values(rng: random.Random, n: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.45:
            out.append(wire(1, ORDERS, _orders(rng, i)))
        elif kind < 0.6:  # nested records: fastavro (v2: a uuid) or generated (v6, v7)
            nested = rng.choice([wire(2, ORDERS_V2, _v2(rng, i)), wire(6, ORDERS_V6, _v6(rng, i)),
                                 wire(7, ORDERS_V7, _v7(rng, i)),
                                 wire(8, ORDERS_V8, {**_orders(rng, i),
                                                     "who": rng.choice([None, "x"])}),
                                 wire(9, ORDERS_V9, {**avro_order(i), "customer": rng.choice(
                                     _SYMBOLS), "state": rng.choice([None, "A", "B"])}),
                                 wire(10, ORDERS_V10, {**avro_order(i), "customer": rng.choice(
                                     [None, *_SYMBOLS]), "state": None})])
            out.append(rng.choice([nested, nested, nested, nested + b"\x00", nested[:-1],
                                   _flipped(rng, nested)]))
        elif kind < 0.67:
            out.append(wire(3, ORDERS_V3, _v3(rng, i)))
        elif kind < 0.8:
            v4 = wire(5, ORDERS_V4, _v4(rng, i))
            out.append(rng.choice([v4, v4, v4, _flipped(rng, v4), _crafted(rng, i)]))
        elif kind < 0.86:  # a timestamp past what Python's datetime holds, both ways,
            # and the first and last microseconds of 1970-01-01 and of the day before
            doc = {**_orders(rng, i), "amount": b"\x01", "placed_at": rng.choice(
                [2**62, -2**62, 253_402_300_800_000_000, -62_135_596_800_000_001,
                 0, 86_399_999_999, -1, -86_400_000_000])}
            out.append(_raw(1, ORDERS, doc))
        else:
            good = wire(1, ORDERS, _orders(rng, i))
            out.append(rng.choice([
                None, good[:-1], _flipped(rng, good), _flipped(rng, good), good + b"\x00",
                good[:3], b"\x01" + good[1:],
                b"\x00\x00\x00\x00\x63" + good[5:], good[:5], b"",
                wire(4, {"type": "string"}, "just a string"), b"\x00\x00\x00\x00\x02"
                + good[5:]]))  # v1's bytes read as v2: misread or refused
    return out


@pytest.fixture
def schemas(tmp_path):
    for schema_id, schema in ((1, ORDERS), (2, ORDERS_V2), (3, ORDERS_V3),
                              (4, {"type": "string"}), (5, ORDERS_V4), (6, ORDERS_V6),
                              (7, ORDERS_V7), (8, ORDERS_V8), (9, ORDERS_V9),
                              (10, ORDERS_V10)):
        (tmp_path / f"{schema_id}.avsc").write_text(json.dumps(schema))
    return SchemaSource(schemas_dir=str(tmp_path))


def no_loop(columns, schema=None, binary=False):
    """No generated loop: every record through the general path (the code before it)."""
    return None


def _encode(source, columns, records, batch: int,
            text_rows: bool = True) -> list[tuple[list, list, list]]:
    """Each batch's (rows, dead letters, tombstones); ``text_rows``: COPY text lines (a
    transform's feed), else the staged COPY binary tuples."""
    enc = Encoder("avro", columns, 7, tombstone_key=(), schemas=source, text_rows=text_rows)
    out = []
    for i in range(0, len(records), batch):
        e = enc.encode("t\tx", 3, records[i:i + batch])
        out.append((e.rows, e.dead, e.tombstones))
    return out


@pytest.mark.parametrize("text_rows", [True, False], ids=["text", "binary"])
@pytest.mark.parametrize("seed, batch", [(1, 1), (2, 17), (3, 500)])
@pytest.mark.parametrize("columns", [COLUMNS, FLAT_COLUMNS, NESTED_COLUMNS],
                         ids=["paths", "flat", "nested"])
def test_the_generated_loop_writes_and_refuses_exactly_as_the_general_path(
        schemas, monkeypatch, seed, batch, columns, text_rows):
    rng = random.Random(seed)
    records = [Record(i, v, ts=1_700_000_000_000 + rng.choice([0, i]))
               for i, v in enumerate(values(rng, 3000))]
    handed, passed_on, decodes = [], [], set()
    real = avro_format.batch_encoder

    def counting(columns, schema=None, binary=False):  # values handed to loops, those passed on
        loop = real(columns, schema, binary)

        def counted(records, head, tail, header, fo, read, schema, general, *rest):
            handed.extend(m for m in records if m.value() is not None)
            decodes.add(loop.__code__.co_filename.rsplit(", ", 1)[1])
            return loop(records, head, tail, header, fo, read, schema,
                        lambda *a: passed_on.append(1) or general(*a), *rest)
        return counted

    monkeypatch.setattr(avro_format, "batch_encoder", counting)
    fast = _encode(schemas, columns, records, batch, text_rows)
    taken_by_the_loop = len(handed) - len(passed_on)
    monkeypatch.setattr(avro_format, "batch_encoder", no_loop)
    general = _encode(schemas, columns, records, batch, text_rows)
    assert fast == general
    rows = [r for e in fast for r in e[0]]
    assert {type(r) for r in rows} == {str if text_rows else bytes}
    dead = [d for e in fast for d in e[1]]
    kinds = {d.split("\t")[7] for d in dead}
    assert taken_by_the_loop > (500 if batch > 1 else 0)
    # A uuid (v2) or a decimal of another scale (v3): fastavro; the rest, nested records
    # the paths reach into (v6, v7) too: generated.
    assert decodes == {"fastavro>", "generated decode>"} if batch == 1 else (
        "generated decode>" in decodes), decodes
    assert len(rows) > 1000 and {"corrupt_avro", "bad_magic_byte", "unknown_schema",
                                 "missing_field", "wrong_type", "unstorable",
                                 "not_a_record", "null_value"} <= kinds, kinds


def test_the_bench_orders_take_the_generated_loop_from_a_tasks_first_batch(
        schemas, monkeypatch):
    records = [Record(i, wire(1, ORDERS, avro_order(i))) for i in range(1000)]
    handed, passed_on = [], []
    real = avro_format.batch_encoder

    def counting(columns, schema=None, binary=False):
        loop = real(columns, schema, binary)

        def counted(records, head, tail, header, fo, read, schema, general, *rest):
            handed.extend(records)
            return loop(records, head, tail, header, fo, read, schema,
                        lambda *a: passed_on.append(1) or general(*a), *rest)
        return counted

    monkeypatch.setattr(avro_format, "batch_encoder", counting)
    enc = Encoder("avro", COLUMNS[:4], 7, schemas=schemas, text_rows=True)
    e = enc.encode("t", 0, records)
    assert len(e.rows) == 1000 and not e.dead
    assert len(handed) == 1000 and not passed_on
    # The amount as its unscaled integer and the scale's exponent: Postgres reads 1.25.
    assert e.rows[1] == ("t\t0\t1\t2023-11-14 22:13:20.123000+00\t1\tc1\t125e-2\t"
                         "2026-01-01 00:01:00+00:00\t7\n")


def test_a_value_of_another_schema_id_in_the_batch_goes_the_general_way(schemas):
    """The loop is the batch's first writer's; a v2 record among v1's is still exact."""
    v1 = wire(1, ORDERS, avro_order(5))
    v2 = wire(2, ORDERS_V2, {"order_id": 6, "customer": "b", "amount": None,
                             "placed_at": datetime(2026, 1, 1, tzinfo=UTC), "who": None,
                             "day": date(2026, 1, 2), "note": ""})
    enc = Encoder("avro", COLUMNS, 7, schemas=schemas, text_rows=True)
    enc.encode("t", 0, [Record(0, v1), Record(1, v2)])
    e = enc.encode("t", 0, [Record(0, v1), Record(1, v2), Record(2, struct.pack(">bI", 0, 1))])
    assert [r.split("\t")[4:] for r in e.rows] == [
        ["5", "c5", "625e-2", "2026-01-01 00:05:00+00:00", "\\N", "\\N", "\\N", "7\n"],
        ["6", "b", "\\N", "2026-01-01 00:00:00+00:00", "\\N", "\\N", "2026-01-02", "7\n"]]
    assert [d.split("\t")[7] for d in e.dead] == ["corrupt_avro"]



@pytest.mark.parametrize("text_rows", [True, False], ids=["text", "binary"])
@pytest.mark.parametrize("columns", [COLUMNS, FLAT_COLUMNS], ids=["paths", "flat"])
def test_values_of_other_writers_in_a_batch_take_their_own_encoders(schemas, monkeypatch,
                                                                    columns, text_rows):
    """A batch of writers 2, 1 and 5 mixed (a producer fleet mid-rollout): the loop is the
    first writer's, the others' values go through their one-record encoders, none through
    the general path; the rows are the general path's."""
    rng = random.Random(9)
    makers = [lambda i: wire(2, ORDERS_V2, _v2(rng, i)),
              lambda i: wire(1, ORDERS, avro_order(i)),
              lambda i: wire(5, ORDERS_V4, _v4(rng, i))]
    records = [Record(i, makers[i % 3](i)) for i in range(300)]
    passed_on = []
    real = avro_format.batch_encoder

    def counting(columns, schema=None, binary=False):
        loop = real(columns, schema, binary)

        def counted(records, head, tail, header, fo, read, schema, general, *rest):
            return loop(records, head, tail, header, fo, read, schema,
                        lambda *a: passed_on.append(a) or general(*a), *rest)
        return counted

    monkeypatch.setattr(avro_format, "batch_encoder", counting)
    first = Encoder("avro", columns, 7, schemas=schemas, text_rows=text_rows)
    first.encode("t", 0, records[:3])  # every writer met once
    passed_on.clear()
    fast = first.encode("t", 0, records)
    monkeypatch.setattr(avro_format, "batch_encoder", no_loop)
    general = Encoder("avro", columns, 7, schemas=schemas, text_rows=text_rows).encode(
        "t", 0, records)
    assert fast == general
    by_writer = [a[0][4] for a in passed_on]
    # The bench orders (writer 1) are always the usual case: none passed on; writer 5's
    # random values often are not (a null customer, a NaN): the general path's then.
    assert len(fast.rows) > 150 and by_writer.count(1) == 0, by_writer


def test_timestamps_either_side_of_midnight_are_written_as_the_general_path_does(
        schemas, monkeypatch):
    """The loop keeps a timestamp column's last day: a time on the next day's first
    microsecond, or back on the day before, is that day's."""
    midnight = datetime(2026, 3, 1, tzinfo=UTC)
    offsets = [-1, 0, 86_399_999_999, 86_400_000_000, -43_200_000_000, 86_400_000_001, 0,
               -86_400_000_000, 172_800_000_000, -1, 1]
    records = [Record(i, wire(1, ORDERS, {**avro_order(i), "placed_at": midnight
                                           + timedelta(microseconds=us)}))
               for i, us in enumerate(offsets)]
    fast = Encoder("avro", COLUMNS[:4], 7, schemas=schemas, text_rows=True).encode(
        "t", 0, records)
    monkeypatch.setattr(avro_format, "batch_encoder", no_loop)
    general = Encoder("avro", COLUMNS[:4], 7, schemas=schemas, text_rows=True).encode(
        "t", 0, records)
    assert fast == general and not fast.dead
    assert [r.split("\t")[7] for r in fast.rows[:4]] == [
        "2026-02-28 23:59:59.999999+00:00", "2026-03-01 00:00:00+00:00",
        "2026-03-01 23:59:59.999999+00:00", "2026-03-02 00:00:00+00:00"]
