"""The exact per-field read-back of the Encoder's COPY text rows: the reference that
executor/transform/arrow_rows.py's vectorized reading is held to (tests/unit/test_arrow_rows.py,
bench/arrow_rows.py). No run uses it: runs read with arrow_rows (executor/transform/typed_rows.py);
one value at a time, it is the plain statement of what each field means."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal

from pipeline.formats.types import column_type
from pipeline.formats.wire.text import unescape


def reader(declared: str) -> Callable[[str], object]:
    """A COPY text field the Encoder wrote for a column of ``declared`` -> its value."""
    t = column_type(declared)
    if not t.scalar:
        raise ValueError(f"column type {declared} is not read back for a transform")
    if t.precision is not None:
        return Decimal
    return {"string": unescape, "long": int, "int": int, "double": float,
            "boolean": lambda f: f == "t", "timestamp": datetime.fromisoformat,
            "date": date.fromisoformat}[declared]


def arrow_type(declared: str, pa):
    t = column_type(declared)
    if t.precision is not None:
        return pa.decimal128(t.precision, t.scale)
    return {"string": pa.string(), "long": pa.int64(), "int": pa.int32(),
            "double": pa.float64(), "boolean": pa.bool_(), "timestamp": pa.timestamp(
                "us", tz="UTC"), "date": pa.date32()}[declared]
