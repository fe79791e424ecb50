"""A transform's output rows, typed Arrow columns as ``mapInArrow`` hands them to the writer
(writer.blob_writer), -> one COPY binary tuple each, with no per-row Python: each
column's fields (a 4-byte length, then the value in Postgres's binary input form, or the
length -1 for NULL) are laid out by numpy as a fixed-width byte matrix (numbers, booleans,
timestamps, dates, numerics) or as a length prefix beside the column's own bytes (text,
bytea), and Arrow's ``binary_join_element_wise`` joins each row's fields in C++.

Postgres then parses no text while the read goes on (the avro sink's tuples took its COPY
of 2M rows from 4.2-4.8 to 3.2-3.5 CPU-s, docs/benchmarks.md). A tuple stores exactly what
the COPY text line of arrow_copy.py stores: only a column whose Spark type maps to
its Postgres type without a conversion of Postgres's text input is written this way
(``exact``); anything else (an array, jsonb, a numeric over 18 digits, a double into a
numeric, a string into a timestamp) keeps the run's rows COPY text, decided on the driver
before the job (driver/transform_job.stage_transformed).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence

from pipeline.formats.binary_fields import NUMERIC, PG_EPOCH_DAY, PG_EPOCH_US
from pipeline.formats.timestamps import PG_FIRST_MS, TimestampOutOfRange
from pipeline.formats.wire.binary import pack_iq, text_field

_INTEGERS = {"bigint": 8, "integer": 4, "smallint": 2}
_SPARK_WIDTHS = {"bigint": 8, "int": 4, "smallint": 2, "tinyint": 1}
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")
MAX_DIGITS = 18  # a numeric whose unscaled value is one int64 (the low word of Arrow's)
_NEG = 0x4000  # numeric's sign: negative
# The Spark types (simpleString) whose values a Postgres type takes as they are.
_EXACT = {"double precision": {"double"}, "real": {"float"}, "boolean": {"boolean"},
          "text": {"string"}, "date": {"date"}, "bytea": {"binary"},
          "timestamp with time zone": {"timestamp", "timestamp_ntz"}}


def exact(columns: Sequence[tuple[str, str]]) -> bool:
    """True when every staged (Postgres type, Spark type) pair has a binary field here
    equal to what Postgres stores from the COPY text line: the same type (integers may
    widen), or a decimal of the numeric's scale, both of at most 18 digits."""
    return all(_exact(pg, spark) for pg, spark in columns)


def _exact(pg: str, spark: str) -> bool:
    if pg in _INTEGERS:
        return _SPARK_WIDTHS.get(spark, 99) <= _INTEGERS[pg]
    numeric, decimal = _NUMERIC.fullmatch(pg), _DECIMAL.fullmatch(spark)
    if numeric and decimal:
        return (int(numeric[1]) <= MAX_DIGITS and int(decimal[1]) <= MAX_DIGITS
                and numeric[2] == decimal[2])
    return spark in _EXACT.get(pg, ())


def tuples(batch, columns: Sequence[tuple[str, str]], run_id: int, pa, pc,
           fixed: Mapping[str, str] | None = None):
    """The batch's rows as COPY binary tuples (a binary array, no stream header):
    ``columns`` are the staged (name, Postgres type) pairs, in order (each one ``exact``
    for the batch's Arrow type), then ``run_id``; ``fixed``: text columns the batch leaves
    out, the same value on every row (a run's one topic)."""
    import numpy as np

    fixed = fixed or {}
    binary = pa.binary()
    pieces = [pa.scalar(struct.pack(">h", len(columns) + 1), binary)]
    for name, pg in columns:
        if name in fixed:
            pieces.append(pa.scalar(text_field(fixed[name]), binary))
        else:
            pieces += _fields(batch.column(name), pg, pa, pc, np)
    pieces.append(pa.scalar(pack_iq(8, run_id), binary))
    return pc.binary_join_element_wise(*pieces, pa.scalar(b"", binary),
                                       null_handling="replace", null_replacement="")


def _fields(col, pg: str, pa, pc, np) -> list:
    """One column's fields: a binary array of whole fields, or a length-prefix array and
    the values themselves (a NULL's value empty: the join's null replacement)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    valid = None if col.null_count == 0 else col.is_valid().to_numpy(zero_copy_only=False)
    if pg in ("text", "bytea"):
        lengths = pc.fill_null(pc.binary_length(col), -1).to_numpy().astype(">i4")
        return [_binary(lengths.view(np.uint8).reshape(-1, 4), pa, np),
                col.cast(pa.binary()) if pa.types.is_string(col.type) else col]
    if pg in _INTEGERS:
        width = _INTEGERS[pg]
        values = _filled(col, 0, pa, pc).astype(f">i{width}")
    elif pg == "double precision":
        values = _filled(col, 0.0, pa, pc).astype(">f8")
    elif pg == "real":
        values = _filled(col, 0.0, pa, pc).astype(">f4")
    elif pg == "boolean":
        values = _filled(col, False, pa, pc).astype(np.uint8)
    elif pg == "date":
        days = _filled(pc.cast(col, pa.int32()), 0, pa, pc).astype(np.int64) - PG_EPOCH_DAY
        # Postgres's binary date is an int4; its extremes mean -infinity/infinity, which
        # no text line says: refused as the text of such a day is (out of range).
        values = np.clip(days, -(2**31) + 1, 2**31 - 2).astype(">i4")
    elif pg == "timestamp with time zone":
        values = (_micros(col, pa, pc, np) - PG_EPOCH_US).astype(">i8")
    else:  # numeric(p,s), p <= 18
        scale = int(_NUMERIC.fullmatch(pg)[2])
        return [_binary(_numeric(col, scale, valid, pa, np), pa, np, valid)]
    width = values.dtype.itemsize
    mat = np.empty((len(col), 4 + width), np.uint8)
    mat[:, :4] = np.frombuffer(struct.pack(">i", width), np.uint8)
    mat[:, 4:] = values.view(np.uint8).reshape(-1, width)
    return [_binary(mat, pa, np, valid)]


def _filled(col, zero, pa, pc):
    """The column's values as numpy, a NULL as ``zero`` (its field is only the length)."""
    if col.null_count:
        col = pc.fill_null(col, zero)
    return col.to_numpy(zero_copy_only=False)


def _micros(col, pa, pc, np):
    """A timestamp column's microseconds since 1970 (UTC; a zone-less one's wall clock,
    as the text line's ``+00`` takes it), NULL as 0; before what Postgres stores (4714
    BC), TimestampOutOfRange, as the text line's far_timestamp raises."""
    if col.type.unit != "us":
        col = pc.cast(col, pa.timestamp("us", tz=col.type.tz))
    micros = _filled(pc.cast(col, pa.int64()), 0, pa, pc)
    outside = micros < PG_FIRST_MS * 1000  # int64's largest is inside (year 294247)
    if outside.any():
        raise TimestampOutOfRange(int(micros[outside.argmax()]) // 1000)
    return micros


def _numeric(col, scale: int, valid, pa, np):
    """A decimal column of scale ``scale`` and at most 18 digits -> numeric fields as an
    (n, width) byte matrix: every row the same number of base-10000 digits, enough for
    the batch's largest integer part and the scale (Postgres's input strips the leading
    and trailing zero digits, and checks the column's precision)."""
    n = len(col)
    # Arrow's decimal128 is two little-endian int64 words; at most 18 digits fit the low one.
    words = np.frombuffer(col.buffers()[1], np.int64)[2 * col.offset:2 * (col.offset + n)]
    low, high = words[0::2], words[1::2]
    if valid is not None:  # a NULL's words are anything
        low, high = np.where(valid, low, 0), np.where(valid, high, 0)
    if np.any(high != (low >> 63)) or np.any(low == np.iinfo(np.int64).min):
        raise ValueError(f"a decimal value of more than {MAX_DIGITS} digits in a "
                         f"{col.type} column")
    whole, fraction = np.divmod(np.abs(low), 10**scale)
    ni = max(1, (len(str(int(whole.max()) if n else 0)) + 3) // 4)  # base-10000 digits
    nf = (scale + 3) // 4
    pad = 4 * nf - scale  # the last fraction digit's unused decimal places
    digits = [whole // 10_000 ** k % 10_000 for k in range(ni - 1, -1, -1)]
    if nf:
        rest, last = np.divmod(fraction, 10 ** (4 - pad))
        digits += [rest // 10_000 ** k % 10_000 for k in range(nf - 2, -1, -1)]
        digits.append(last * 10**pad)
    nd = ni + nf
    mat = np.empty((n, 6 + nd), ">u2")
    # length, ndigits, weight (of the first digit), sign, display scale, then the digits
    mat[:, :6] = np.frombuffer(NUMERIC[0](8 + 2 * nd, nd, ni - 1, 0, scale), ">u2")
    mat[:, 4] = np.where(low < 0, _NEG, 0)
    for i, d in enumerate(digits):
        mat[:, 6 + i] = d
    return mat.view(np.uint8)


def _binary(mat, pa, np, valid=None):
    """An (n, width) byte matrix of whole fields (a field's length first) -> a binary
    array of n values; a row not ``valid`` keeps only a NULL's length, -1."""
    n, width = mat.shape
    if valid is None:
        offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
        data = np.ascontiguousarray(mat)
    else:
        mat[~valid, :4] = 0xFF
        keep = np.ones(mat.shape, bool)
        keep[~valid, 4:] = False
        data = mat[keep]
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(np.where(valid, width, 4), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)])
