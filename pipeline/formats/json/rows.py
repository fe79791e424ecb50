"""The JSON format's hot loop: a row encoder generated for the declared columns.

A per-record loop over the columns and a function call per field cost as much as the
conversions themselves (200k bench records: 2.6 -> 2.1 us each), so the columns and their
type checks (types.ColumnType.inline) are unrolled into the source of one function.
Its twin, column_encoder, runs the same checks for a transform's input and keeps the values
in one list per column (executor/transform/arrow_columns.py makes them Arrow); a timestamp string's
shape is checked there once per batch in Arrow's RE2 (timestamp_checks), ~0.5 us a record
less than Python's re.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from pipeline.formats.json.values import EXPLICIT_OFFSET_SHAPE, WrongType
from pipeline.formats.timestamps import PG_END_MS, PG_FIRST_MS
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import NULL, text


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


def _body(columns: Sequence[tuple[str, str, bool, Sequence[str]]], null: str,
          inline: Callable[[int, str], list[str]]) -> list[str]:
    """The per-record checks of every column: f{i} = its value, ``null`` where absent."""
    body = []
    for i, (_, declared, required, path) in enumerate(columns):
        convert = inline(i, declared)
        if len(path) > 1:
            body += _nested(path)
            body += (["if x is None: raise W", *convert] if required else
                     ["if x is None:", f"    f{i} = {null}", "else:",
                      *("    " + line for line in convert)])
        elif required:  # a top-level key: the flat path, as fast as it was
            body += [f"x = doc[{path[0]!r}]", "if x is None: raise W", *convert]
        else:
            body += [f"x = doc.get({path[0]!r})", "if x is None:", f"    f{i} = {null}", "else:",
                     *("    " + line for line in convert)]
    return body


def _compile(source: str, columns) -> Callable:
    namespace = {"NULL": NULL, "W": WrongType, "text": text, "stored": stored,
                 "fromiso": datetime.fromisoformat, "shape": EXPLICIT_OFFSET_SHAPE.fullmatch}
    exec(compile(source, f"<row_encoder {[c[0] for c in columns]}>", "exec"), namespace)
    return namespace["encode_rows"]


def row_encoder(columns: Sequence[tuple[str, str, bool, Sequence[str]]]) -> Callable:
    """A function (records, head, tail, loads, ts, convert..., rejected) -> result lines,
    ``convert``: each column's from_json; ``columns``: (name, type, required, path). Any
    record it cannot turn into a line, for whatever reason, goes to ``rejected`` for the
    general path (JsonFormat.explain), so this function only ever accepts what the column
    rules (json/values.py) accept."""
    params = [f"c{i}" for i in range(len(columns))]
    body = _body(columns, "NULL", _inline)
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
    return _compile(source, columns)


def stored(x: str) -> str:
    """A string as stored (not escaped): text()'s checks (no NUL) without its escaping."""
    text(x)
    return x


def _inline_value(i: int, declared: str) -> list[str]:
    """Column i's check for column_encoder: the string itself, not its COPY text; a
    timestamp string as it is, its check left to the batch (timestamp_checks)."""
    if declared == "string":
        return ["if type(x) is not str: raise W", f"f{i} = x if x.isalnum() else stored(x)"]
    if declared == "timestamp":
        return [f"f{i} = x if type(x) is str else c{i}(x)"]
    return _inline(i, declared)


# EXPLICIT_OFFSET_SHAPE for Arrow's RE2, whose \d is ASCII only: a string Python's \d
# takes beyond it (another script's digits) is refused by fromisoformat either way.
_SHAPE_RE2 = "^" + EXPLICIT_OFFSET_SHAPE.pattern + "$"


def timestamp_checks(values: list, convert: Callable, pa, pc) -> tuple[list, set[int]]:
    """A timestamp column of column_encoder (strings as given, None, or convert's text
    of a number) -> (its values as row_encoder writes them, the rows it refuses): a string
    of the usual shape (matched in Arrow's C++, ~10x cheaper than Python's re) is checked
    by fromisoformat and kept as written, any other is convert's text or refused, as the
    inlined rule does (types.py) record by record."""
    strings = pa.array(values, pa.string())
    usual = pc.match_substring_regex(strings, _SHAPE_RE2)
    refused: set[int] = set()
    fromiso = datetime.fromisoformat
    if pc.all(usual).as_py():  # every string of the usual shape (NULLs skipped)
        try:
            for _ in map(fromiso, filter(None, values) if strings.null_count else values):
                pass
            return values, refused
        except Exception:  # noqa: BLE001 - some value: found one by one below
            pass
    out = list(values)
    for i, (x, plain) in enumerate(zip(values, usual.to_pylist(), strict=True)):
        if x is None:
            continue
        try:
            if plain:
                fromiso(x)
            else:
                out[i] = convert(x)
        except Exception:  # noqa: BLE001 - as the row encoder: any failure refuses it
            refused.add(i)
    return out, refused


def column_encoder(columns: Sequence[tuple[str, str, bool, Sequence[str]]]) -> Callable:
    """row_encoder's twin for the transform feed (executor/transform/typed_rows.py): the
    same checks, the same records accepted and rejected, but each record's values appended
    to one list per column instead of joined into a line: (records, loads, convert...,
    rejected) -> [offsets, epoch ms, column 0, ...]. A value is what row_encoder would write
    (a COPY text field, or an int/float whose str() is it) except a string, which is the
    string itself, and NULL, which is None."""
    params = [f"c{i}" for i in range(len(columns))]
    body = _body(columns, "None", _inline_value)
    n = len(columns)
    lists = ", ".join(f"v{i}" for i in range(n + 2))
    appends = "; ".join(f"a{i + 2}(f{i})" for i in range(n))
    inner = "\n".join("            " + b for b in body)
    source = f"""
def encode_rows(records, loads, {', '.join(params + [''])}rejected):
    {lists}, = [[] for _ in range({n + 2})]
    {", ".join(f"a{i}" for i in range(n + 2))}, = [v.append for v in ({lists},)]
    for m in records:
        try:
            doc = loads(m.value())
            ms = m.timestamp()[1]
            if not {PG_FIRST_MS} <= ms < {PG_END_MS}: raise W  # ts(ms) would raise
{inner}
        except Exception:
            rejected.append(m)
            continue
        a0(m.offset()); a1(ms); {appends}
    return [{lists}]
"""
    return _compile(source, columns)
