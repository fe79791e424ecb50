"""The JSON format's hot loop: a row encoder generated for the declared columns.

A per-record loop over the columns and a function call per field cost as much as the
conversions themselves (200k bench records: 2.6 -> 2.1 us each), so the columns and their
type checks (types.ColumnType.inline) are unrolled into the source of one function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from pipeline.formats.copy_text import NULL, text
from pipeline.formats.json_values import EXPLICIT_OFFSET_SHAPE, WrongType
from pipeline.formats.types import column_type


def _inline(i: int, declared: str) -> list[str]:
    """Column i's check: leaves its COPY text (or an int/float whose str() is it) in f{i}
    or raises; anything unusual goes to the column's from_json, c{i}."""
    lines = column_type(declared).inline or ("f{i} = c{i}(x)",)
    return [line.format(i=i) for line in lines]


def _nested(path: Sequence[str]) -> list[str]:
    """x = the value at a path of two or more keys, None where it is absent or runs through
    a null; a value on the way that is not an object has no .get: the record is rejected."""
    return [f"x = doc.get({path[0]!r})",
            *(f"if x is not None: x = x.get({key!r})" for key in path[1:])]


def row_encoder(columns: Sequence[tuple[str, str, bool, Sequence[str]]]) -> Callable:
    """A function (records, head, tail, loads, ts, convert..., rejected) -> result lines,
    ``convert``: each column's from_json; ``columns``: (name, type, required, path). Any
    record it cannot turn into a line, for whatever reason, goes to ``rejected`` for the
    general path (JsonFormat.explain), so this function only ever accepts what the column
    rules (json_values) accept."""
    params = [f"c{i}" for i in range(len(columns))]
    body = []
    for i, (_, declared, required, path) in enumerate(columns):
        convert = _inline(i, declared)
        if len(path) > 1:
            body += _nested(path)
            body += (["if x is None: raise W", *convert] if required else
                     ["if x is None:", f"    f{i} = NULL", "else:",
                      *("    " + line for line in convert)])
        elif required:  # a top-level key: the flat path, as fast as it was
            body += [f"x = doc[{path[0]!r}]", "if x is None: raise W", *convert]
        else:
            body += [f"x = doc.get({path[0]!r})", "if x is None:", f"    f{i} = NULL", "else:",
                     *("    " + line for line in convert)]
    fields = [f"{{f{i}}}" for i in range(len(columns))]
    line = "\\t".join(["{head}{m.offset()}", "{kts}", *fields]) + "{tail}"
    inner = "\n".join("            " + b for b in body)
    source = f"""
def encode_rows(records, head, tail, loads, ts, {', '.join(params + [''])}rejected):
    rows = []
    append = rows.append
    seen = ts.cache
    for m in records:
        try:
            doc = loads(m.value())
            ms = m.timestamp()[1]
            kts = seen.get(ms)
            if kts is None:
                kts = ts(ms)
{inner}
            append(f"{line}")
        except Exception:
            rejected.append(m)
    return rows
"""
    namespace = {"NULL": NULL, "W": WrongType, "text": text,
                 "fromiso": datetime.fromisoformat, "shape": EXPLICIT_OFFSET_SHAPE.fullmatch}
    exec(compile(source, f"<row_encoder {[c[0] for c in columns]}>", "exec"), namespace)
    return namespace["encode_rows"]
