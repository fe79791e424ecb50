"""The JSON record format: a value is a JSON object whose keys are the declared columns,
typed by the JSON value rules (json/values.py); its rows are COPY text lines.

The batch path parses with orjson and runs the generated row encoder (json/rows.py); a
record it rejects is explained here, slowly (json/diagnose.py): bad records are rare. For
a transform's input the same checks also give the values as columns (``value_columns``:
json/rows.column_encoder, then the batch's timestamp check), the same records rejected.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from decimal import Decimal

from pipeline.formats import paths
from pipeline.formats.json import diagnose as d
from pipeline.formats.json.rows import column_encoder, row_encoder, timestamp_checks
from pipeline.formats.json.values import OutOfRange, WrongType
from pipeline.formats.timestamps import kafka_timestamp
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import TEXT, Unstorable


def json_loader(columns: Sequence[tuple[str, str]]) -> Callable[[bytes], object]:
    """orjson for speed; the standard library with exact decimals when a decimal column is
    wider than a double's 15 exact digits, or a jsonb column keeps numbers as written."""
    if wide_decimals(columns):
        return lambda v: json.loads(v, parse_float=Decimal, parse_constant=refuse_constant)
    import orjson

    return orjson.loads


class NonFinite(ValueError):
    """A bare NaN, Infinity or -Infinity: not JSON (RFC 8259). orjson refuses it; the
    standard library would take it, and jsonb would then store it as null."""


def refuse_constant(name: str):
    raise NonFinite(name)


# The dead letter of a record holding one, whichever parser read it.
NON_FINITE = ("malformed_json", "value holds NaN or Infinity as a bare number, which JSON "
                                "does not allow (a double column reads the string \"NaN\")")


def wide_decimals(columns: Sequence[tuple[str, str]]) -> bool:
    """A decimal column wider than a double's 15 exact digits: parsed by the standard
    library (exact decimals), which, unlike orjson, lets a lone surrogate into a string."""
    return any(column_type(t).exact_json for _, t in columns)


class JsonFormat:
    """``columns``: the declared (name, type, required[, path]) columns, in table order."""
    wire = TEXT

    def __init__(self, columns: Sequence[Sequence], run_id: int):
        columns = paths.columns(columns)
        self.columns = [(n, column_type(t).from_json, r, p) for n, t, r, p in columns]
        self.declared = [(n, t) for n, t, _, _ in columns]
        self.types = dict(self.declared)
        self.tail = f"\t{run_id}\n"
        self.loads = json_loader(self.declared)
        self.encode_rows = row_encoder(columns)
        # orjson refuses a lone surrogate escape ("\ud800"); the standard library's parser
        # (wide decimals) lets it into a string that cannot be written as UTF-8.
        self.surrogates_possible = wide_decimals(self.declared)
        if not self.surrogates_possible:  # else its rows need utf8_only's line check
            self.encode_columns = column_encoder(columns)
            self.value_columns = self._value_columns

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[str]:
        """The batch's result lines; records the row encoder cannot take go to
        ``rejected`` (JsonFormat.explain says why), lines that are not UTF-8 to
        ``refuse(record, error_type, message)``."""
        rows = self.encode_rows(records, head, self.tail, self.loads, kafka_timestamp,
                                *[c for _, c, _, _ in self.columns], rejected)
        if self.surrogates_possible:
            rows = self.utf8_only(rows, records, refuse)
        return rows

    def _value_columns(self, topic: str, partition: int, head: str, records, rejected: list,
                       refuse: Callable) -> list[list]:
        """``rows`` as one list per column (json/rows.column_encoder: offsets, epoch ms,
        then each declared column's values), for the transform feed: the same records
        accepted and rejected."""
        import pyarrow as pa
        import pyarrow.compute as pc

        found: list = []
        values = self.encode_columns(records, self.loads, *[c for _, c, _, _ in self.columns],
                                     found)
        refused: set[int] = set()
        for j, (_, convert, _, _) in enumerate(self.columns):
            if self.declared[j][1] == "timestamp":
                values[2 + j], bad = timestamp_checks(values[2 + j], convert, pa, pc)
                refused |= bad
        if refused:  # in the records' order, as the row encoder rejects them
            by_offset = {values[0][i]: i for i in refused}
            found += [m for m in records if by_offset.get(m.offset()) is not None]
            order = {id(m): k for k, m in enumerate(records)}
            found.sort(key=lambda m: order[id(m)])
            values = [[v for i, v in enumerate(column) if i not in refused]
                      for column in values]
        rejected += found
        return values

    def utf8_only(self, rows: list[str], records, refuse: Callable) -> list[str]:
        """Rows that cannot be encoded as UTF-8 become dead letters (not a task that fails
        on every rerun); found by their offset, the line's third field."""
        kept = []
        by_offset = None
        for line in rows:
            try:
                line.encode()
            except UnicodeEncodeError:
                by_offset = by_offset or {m.offset(): m for m in records}
                refuse(by_offset[int(line.split("\t", 3)[2])], "unstorable", "a string holds "
                       "an unpaired surrogate escape, which is not valid UTF-8")
                continue
            kept.append(line)
        return kept

    def explain(self, m) -> tuple[str, str]:
        """Why a rejected record is not a result row (error_type, message); bad records are
        rare, so this may be slow. The order of the checks is fixed: the first that fails
        names the record's fault."""
        value = m.value()
        if value is None:
            return d.diagnose(d.NULL_VALUE, value, None, self.declared)
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return d.diagnose(d.INVALID_UTF8, value, None, self.declared)
        try:
            doc = self.loads(value)
        except Exception:  # noqa: BLE001 - any parse failure is the record's
            try:  # what orjson refuses but the standard library reads is explained
                doc = json.loads(value, parse_float=Decimal, parse_constant=refuse_constant)
            except RecursionError:
                return d.TOO_DEEP
            except NonFinite:
                return NON_FINITE
            except ValueError:
                return d.diagnose(d.PARSE, value, None, self.declared)
        if type(doc) is not dict:
            return d.diagnose(d.PARSE, value, None, self.declared)
        typed = {}
        for name, convert, _, path in self.columns:
            try:
                x = paths.lookup(doc, path)
            except paths.NotAnObject as e:
                return "wrong_type", (f"field {paths.field(name, path)}: '{paths.label(e.where)}' "
                                      f"is JSON {d.json_kind(e.value)}, not an object")
            if x is None:
                continue
            try:
                convert(x)
                typed[name] = x
            except OutOfRange as e:
                return "wrong_type", f"field {paths.field(name, path)}: {e}"
            except WrongType as e:
                if self.types[name] == "string":
                    continue
                if path == (name,) and not str(e):  # a flat column: the typed parse explains it
                    return d.diagnose(d.PARSE, value, json.dumps(typed, default=str),
                                      self.declared)
                detail = f": {e}" if str(e) else ""
                return "wrong_type", (f"field {paths.field(name, path)}: expected "
                                      f"{self.types[name]}, got {d.json_kind(x)}{detail}")
            except Unstorable as e:
                return "unstorable", f"field {paths.field(name, path)} {e}"
        for name, _, required, path in self.columns:
            x = paths.lookup(doc, path)
            flat = path == (name,)
            if x is None:
                if required and flat:
                    return d.diagnose(d.MISSING + name, value, None, self.declared)
                if required:
                    return "missing_field", (f"required field {paths.field(name, path)} is missing "
                                             "or null")
            elif self.types[name] == "string" and type(x) is not str:
                if flat:
                    return d.diagnose(d.NOT_A_STRING + name, value, None, self.declared)
                return "wrong_type", (f"field {paths.field(name, path)}: expected string, got "
                                      f"{d.json_kind(x)}")
        return "malformed_json", "value does not match the declared columns"

