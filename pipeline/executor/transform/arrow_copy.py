"""A transform's output rows, typed Arrow columns as ``mapInArrow`` hands them to the
writer (writer.blob_writer), -> one COPY text line each, in Arrow's C++: numbers,
booleans, dates and decimals by a cast to string, text escaped by four substring
replacements (only when a batch holds a character to escape), timestamps as their UTC
wall clock (one cast of the microseconds, zone-less) with an explicit ``+00``, NULL as
``\\N``; the fields joined by tabs, the run id last. Python per value only where Arrow
has no kernel (bytea's hex, a timestamp outside years 1-9999). The JVM then only converts
the rows to Arrow (no COPY projection in Spark SQL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.formats import types
from pipeline.formats.timestamps import far_timestamp
from pipeline.formats.wire.text import NULL

_ESCAPES = (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))


def lines(batch, columns: Sequence[tuple[str, str]], run_id: int, pa, pc,
          fixed: Mapping[str, str] | None = None):
    """The batch's rows as COPY text lines (a string array), newline included:
    ``columns`` are the staged (name, Postgres type) pairs, in order; ``fixed``: columns
    the batch leaves out, each the same text value on every row (a run's one topic)."""
    fixed = fixed or {}
    fields = [pa.scalar(_escaped(fixed[name]), pa.string()) if name in fixed
              else _field(batch.column(name), types.copy_form(pg), pa, pc)
              for name, pg in columns]
    return pc.binary_join_element_wise(*fields, pa.scalar(f"{run_id}\n"), "\t")


def _field(col, form: str, pa, pc):
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if form == types.HEX:
        text = pa.array([None if v is None else "\\\\x" + v.hex() for v in col.to_pylist()],
                        pa.string())
    elif form == types.TIMESTAMP:
        text = _timestamps(col, pa, pc)
    else:
        text = _as_string(col, pa, pc)
        if form == types.ESCAPED and pc.any(
                pc.match_substring_regex(text, r"[\\\n\r\t]")).as_py():
            for raw, escaped in _ESCAPES:
                text = pc.replace_substring(text, raw, escaped)
    return pc.fill_null(text, NULL)


def _escaped(value: str) -> str:
    for raw, escaped in _ESCAPES:
        value = value.replace(raw, escaped)
    return value


def _as_string(col, pa, pc):
    if pa.types.is_string(col.type):
        return col
    try:
        return pc.cast(col, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # no cast: Python's str
        return pa.array([None if v is None else str(v) for v in col.to_pylist()],
                        pa.string())


def _timestamps(col, pa, pc):
    """``YYYY-MM-DD HH:MM:SS.ffffff+00`` in UTC; years past 9999 or BC as Postgres reads
    them (timestamps.far_timestamp, to the microsecond)."""
    if not pa.types.is_timestamp(col.type):
        return _as_string(col, pa, pc)
    micros = pc.cast(col, pa.int64()) if col.type.unit == "us" else pc.cast(
        pc.cast(col, pa.timestamp("us", tz="UTC")), pa.int64())
    lo, hi = (v.as_py() for v in pc.min_max(micros).values())
    if lo is None or (-62_135_596_800_000_000 <= lo and hi < 253_402_300_800_000_000):
        # The microseconds as a timestamp without a zone, cast to text: its UTC wall clock,
        # "YYYY-MM-DD HH:MM:SS.ffffff" (~0.06 us a value; strftime ~1.1, the UTC-zoned
        # cast ~1.2, a date and a time-of-day cast joined ~0.24).
        return pc.binary_join_element_wise(
            pc.cast(pc.cast(micros, pa.timestamp("us")), pa.string()), "+00", "")
    return pa.array([None if us is None else _far(us) for us in micros.to_pylist()],
                    pa.string())


def _far(us: int) -> str:
    """far_timestamp's text (to the millisecond) with the microseconds put back."""
    ms, rest = divmod(us, 1000)
    text = far_timestamp(ms)
    head, _, tail = text.rpartition("000+00")
    return f"{head}{rest:03d}+00{tail}"
