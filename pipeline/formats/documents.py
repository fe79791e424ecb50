"""The value rules of the column types that hold more than one value: ``jsonb`` (a
sub-document kept whole) and ``array<T>`` (a Postgres array of a scalar type T), each a
decoded value -> its COPY text field; raise WrongType (with what was wrong) for a value
the type does not allow.

jsonb = any JSON value, written as its JSON text (Postgres normalises it: key order,
spacing); from Avro, a record or map is an object, an array a JSON array, bytes base64,
a decimal a JSON number, a timestamp or date its ISO text. array<T> = a JSON (or Avro)
array whose elements are each null or a value of T by T's rule; it is written as a Postgres
array literal with every element quoted, then escaped as one COPY text field.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from uuid import UUID

from pipeline.formats.json.values import WrongType
from pipeline.formats.wire.text import Unstorable, text

# "\u0000" in JSON text that is an escape (not an escaped backslash before "u0000"):
# jsonb cannot store a NUL.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_NON_FINITE = "a NaN or infinite number, which JSON cannot hold"


def json_text(x) -> str:
    """The compact JSON text of a decoded value."""
    import orjson

    try:
        s = orjson.dumps(x).decode()
    except TypeError:  # a Decimal (exact JSON), Avro's bytes, a big integer: the slow path
        s = _dumps(x)
    else:  # orjson writes a NaN or infinite float (Avro's) as null: refuse it instead
        if "null" in s and _non_finite(x):
            raise WrongType(_NON_FINITE)
    if "\\u0000" in s and _NUL_ESCAPE.search(s):
        raise Unstorable("contains a NUL character (\\u0000), which jsonb cannot store")
    return s


def _non_finite(x) -> bool:
    """Whether a decoded value holds a NaN or infinite float."""
    t = type(x)
    if t is float:
        return not math.isfinite(x)
    if t is dict:
        return any(_non_finite(v) for v in x.values())
    if t is list or t is tuple:
        return any(_non_finite(v) for v in x)
    return False


def _dumps(x) -> str:
    """JSON text of what orjson refuses: a Decimal as its exact digits, bytes as base64."""
    t = type(x)
    if t is dict:
        return "{" + ",".join(f"{_dumps(str(k))}:{_dumps(v)}" for k, v in x.items()) + "}"
    if t is list or t is tuple:
        return "[" + ",".join(_dumps(v) for v in x) + "]"
    if t is Decimal or t is float:
        if not (x.is_finite() if t is Decimal else math.isfinite(x)):
            raise WrongType(_NON_FINITE)
        return str(x) if t is Decimal else repr(x)
    if t is bytes:
        x = base64.b64encode(x).decode()
    elif t is datetime or t is date:
        x = x.isoformat()
    elif t is UUID:
        x = str(x)
    return json.dumps(x, ensure_ascii=False)


def jsonb(x) -> str:
    """A JSON (or Avro) value as a jsonb COPY text field."""
    return text(json_text(x))


def array(element: Callable, raw_string: Callable, kind: Callable[[object], str]) -> Callable:
    """The rule of array<T>: ``element`` is T's rule (its COPY-safe text), ``raw_string``
    the string rule without COPY escaping (None for a non-string T), ``kind`` names a
    wrong element's type for the message."""
    convert = raw_string or element

    def rule(x):
        if type(x) is not list:
            raise WrongType
        out = []
        for i, v in enumerate(x):
            if v is None:
                out.append("NULL")
                continue
            try:
                s = convert(v)
            except WrongType:
                raise WrongType(f"element [{i}] is {kind(v)}") from None
            if "\\" in s or '"' in s:
                s = s.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'"{s}"')
        return text("{" + ",".join(out) + "}")
    return rule


def json_string(x) -> str:
    if type(x) is str:
        return x
    raise WrongType


def avro_string(x) -> str:
    if type(x) is str:
        return x
    if type(x) is UUID:
        return str(x)
    raise WrongType
