"""What the commands print: aligned tables for people, JSON for machines. Times are UTC."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns; numbers right-aligned, None shown as '-'."""
    cells = [list(headers)] + [[fmt(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], int) or row[i] is None for row in rows)
               for i in range(len(headers))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        line = "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(r, widths, numeric, strict=True))
        lines.append(line.rstrip())
    return "\n".join(lines)


def json_default(value: Any) -> Any:
    """For json.dumps: datetimes as ISO 8601 UTC, anything else unknown as its text."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value)


def print_json(doc: Any, out=None) -> None:
    """One JSON document on one line (stdout unless ``out``)."""
    print(json.dumps(doc, default=json_default), file=out or sys.stdout)
