"""The avro format's fast decode: a writer schema read without the logical types of the
fields that declared columns take straight to COPY text.

fastavro turns a decimal's bytes into a Decimal and a timestamp's long into a datetime,
and the column rule then turns those into text again: for an order of four fields that
was more than half of the decode (docs/benchmarks.md, "Avro records"). For a top-level
field read only by a column of the matching type (decimal(p,s) of a bytes decimal,
timestamp of timestamp-millis/-micros and their local- variants, date of date) the writer
schema is re-parsed with that field's logicalType removed, and the column takes the raw
value with a converter that writes the text of the value the typed rule writes (the same
text, but a decimal's: "625e-2" for the typed "6.25", which Postgres's numeric input and
Arrow's decimal cast read to the same value and scale). A converter handles
the usual case only (a decimal of the column's scale and precision, a time Python holds)
and raises otherwise: the format then decodes the record again with the full schema and the
usual rules (avro/format.AvroFormat.fields), so every refusal and its message stay exactly
the typed path's. Any other field keeps its logical type.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import date, timedelta

from pipeline.formats.timestamps import EPOCH
from pipeline.formats.types import column_type

_DAY0 = date(1970, 1, 1)
_MICROS = {"timestamp-micros": 1, "local-timestamp-micros": 1, "timestamp-millis": 1000,
           "local-timestamp-millis": 1000}


def _decimal(precision: int, scale: int) -> Callable:
    """The unscaled integer and the scale as an exponent ("625e-2"): Postgres's numeric
    input and Arrow's decimal cast read it to exactly the value of "6.25", the typed
    rule's text, and it costs one str() instead of padding and slicing the digits (0.21
    against 0.46 us, docs/benchmarks.md "Avro records")."""
    bound = 10 ** precision  # at most ``precision`` digits: in the column

    def convert(b: bytes) -> str:
        n = int.from_bytes(b, "big", signed=True)
        if not -bound < n < bound:
            raise ValueError("wider than the column: the typed rule says so")
        return f"{n}e-{scale}" if scale else str(n)
    convert.raw, convert.precision, convert.scale = "decimal", precision, scale
    return convert


def _timestamp(unit: int) -> Callable:
    def convert(x: int) -> str:
        return (EPOCH + timedelta(microseconds=x * unit)).isoformat(sep=" ")
    convert.raw, convert.unit = "timestamp", unit
    return convert


def _date(x: int) -> str:
    return (_DAY0 + timedelta(days=x)).isoformat()


_date.raw = "date"

# For the generated loop's inlined timestamps and dates (avro/rows.py): a day's text by
# its number since 1970-01-01 (records of a batch share their days), and a time of day's
# "HH:MM:SS" by its second, both cached as met.
DAYS: dict[int, str] = {}
TIMES: dict[int, str] = {}


def day_text(day: int) -> str:
    """Day ``day`` since 1970-01-01 as date.isoformat() writes it; OverflowError beyond
    years 1-9999, as the converters above."""
    if len(DAYS) > 10_000:  # about 1 MB at most
        DAYS.clear()
    d = DAYS[day] = (_DAY0 + timedelta(days=day)).isoformat()
    return d


def time_text(second: int) -> str:
    """Second ``second`` of a day as "HH:MM:SS"."""
    if len(TIMES) > 10_000:
        TIMES.clear()
    t = TIMES[second] = f"{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
    return t


def _converter(avro: dict, declared: str) -> Callable | None:
    """The raw converter of a field of Avro type ``avro`` (a dict with a logicalType) into
    a column of ``declared`` type, or None."""
    logical, base = avro.get("logicalType"), avro.get("type")
    t = column_type(declared)
    if logical == "decimal" and base == "bytes" and t.precision is not None:
        if avro.get("scale", 0) == t.scale and avro.get("precision", 0) <= 38:
            return _decimal(t.precision, t.scale)
    elif logical in _MICROS and base == "long" and declared == "timestamp":
        return _timestamp(_MICROS[logical])
    elif logical == "date" and base == "int" and declared == "date":
        return _date
    return None


def _logical_branch(field_type) -> tuple[dict | None, list | None]:
    """(the logical type's dict, the union holding it) of a field typed X or [null, X]."""
    if type(field_type) is dict and "logicalType" in field_type:
        return field_type, None
    if type(field_type) is list and len(field_type) == 2 and "null" in field_type:
        other = field_type[1] if field_type[0] == "null" else field_type[0]
        if type(other) is dict and "logicalType" in other:
            return other, field_type
    return None, None


def raw_plan(parsed, columns: Sequence[tuple]) -> tuple[dict | None, list]:
    """(the writer schema re-parsed without the logical types of the fields listed below,
    or None when there is none; per column, its raw converter or None). ``parsed``:
    fastavro's parsed writer schema; ``columns``: AvroFormat.columns."""
    import fastavro

    if type(parsed) is not dict or parsed.get("type") != "record":
        return None, [None] * len(columns)
    readers: dict[str, list[tuple[int, str]]] = {}  # top-level field -> (column, declared)
    for i, (_, path, _, _, declared, _) in enumerate(columns):
        readers.setdefault(path[0], []).append((i, declared if len(path) == 1 else ""))
    doc = json.loads(json.dumps({k: v for k, v in parsed.items() if not k.startswith("__")}))
    converters: list = [None] * len(columns)
    stripped = False
    for f in doc.get("fields", ()):
        avro, union = _logical_branch(f.get("type"))
        if avro is None:
            continue
        found = [(i, _converter(avro, declared) if declared else None)
                 for i, declared in readers.get(f["name"], ())]
        if any(c is None for _, c in found):
            continue  # another kind of reader (a path into it, another type): typed
        plain = avro["type"]
        if union is None:
            f["type"] = plain
        else:
            union[union.index(avro)] = plain
        stripped = True
        for i, c in found:
            converters[i] = c
    if not stripped:
        return None, converters
    return fastavro.parse_schema(doc, named_schemas={}), converters
