"""Why a JSON record could not become a result row: the dead letter's error type and
message, for a check's short code (json/format.JsonFormat.explain, on every path: a
transform's input is read by the same Encoder). Explaining a bad record needs a second,
untyped look at it; that runs for the bad records only, so the good ones pay nothing for
it. Pure functions: unit-tested without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

NULL_VALUE = "null_value"
INVALID_UTF8 = "invalid_utf8"
PARSE = "parse"  # the typed parse rejected the record: diagnosed below
MISSING = "missing:"  # + column name
NOT_A_STRING = "string:"  # + column name
# json.loads raises RecursionError (not a ValueError) past ~1,000 levels; orjson and Spark's
# Jackson refuse such a value too (limits 1,024 and 1,000).
TOO_DEEP = ("malformed_json", "value nests arrays or objects deeper than the JSON parsers "
                              "accept (about 1,000 levels)")


def json_kind(value: Any) -> str:
    """The JSON kind of a parsed value, in Spark SQL's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float | Decimal):  # Decimal: a number parsed exactly
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    return "array"


def diagnose(code: str, value: bytes | None, parsed_json: str | None,
             columns: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """(error_type, error_message) of a bad record. ``columns`` are the declared (name,
    type) pairs; ``parsed_json`` is the typed parse of the record as JSON (fields it could
    not convert are null)."""
    if code == NULL_VALUE:
        return "null_value", "value is null (tombstone)"
    if code == INVALID_UTF8:
        return "invalid_utf8", "value is not valid UTF-8"
    if code.startswith(MISSING):
        return "missing_field", f"required field '{code[len(MISSING):]}' is missing or null"
    try:
        raw = json.loads(value) if value is not None else None
    except RecursionError:
        return TOO_DEEP
    except ValueError:
        return "malformed_json", "value is not valid JSON"
    if code.startswith(NOT_A_STRING):
        name = code[len(NOT_A_STRING):]
        got = json_kind(raw.get(name)) if isinstance(raw, dict) else "unknown"
        return "wrong_type", f"field '{name}': expected string, got {got}"
    if not isinstance(raw, dict):
        return "not_an_object", f"value is JSON {json_kind(raw)}, expected an object"
    try:
        parsed = json.loads(parsed_json) if parsed_json else {}
    except (ValueError, RecursionError):
        parsed = {}
    for name, declared in columns:
        if declared != "string" and raw.get(name) is not None and parsed.get(name) is None:
            return "wrong_type", (f"field '{name}': expected {declared}, got "
                                  f"{json_kind(raw[name])}")
    return "malformed_json", "value does not match the declared columns"
