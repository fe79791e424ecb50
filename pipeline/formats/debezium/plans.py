"""Kafka Connect's JSON schema envelope, decoded by a plan made once per writer schema.

A JsonConverter value is ``{"schema":S,"payload":P}``, and S (two thirds of a change
event's bytes) is the same for every record of a table until its columns change. Parsing S
and walking it for the semantic types of every record cost more than the rest of the
decode (the sample shop: ~60 us a record). So the value is split at its bytes: S is
looked up, as bytes, in a bounded cache of plans (which of the image's fields to decode,
and how: json.decode's rules, made once), and only P is parsed. A record whose S differs
by one byte (a column added, a decimal's scale changed) has its own plan.

The split is exact: S is taken only when the value starts with ``{"schema":`` and S, up to
the first ``,"payload":`` (or json.dumps' ``, "payload": ``), is one whole JSON value (the
plan is made only from S parsed alone); P then is the rest, up to the closing brace, and
must parse alone. Anything else (another layout, an S that does not parse alone) is left to
the full parse of the value (json.change), as is a payload the configured parser would read
differently (below).
"""

from __future__ import annotations

import base64
from binascii import a2b_base64
from collections.abc import Callable, Collection
from datetime import date, timedelta

from pipeline.formats.debezium.envelope import (
    CONNECT_DECIMAL,
    DATES,
    EPOCH_UNITS,
    JSON_DOCUMENT,
    UNAVAILABLE_BASE64,
    VARIABLE_SCALE,
    json_document,
    scaled,
    variable_scale,
)
from pipeline.formats.timestamps import EPOCH

_HEAD = b'{"schema":'
_PAYLOAD = (b',"payload":', b', "payload":')  # JsonConverter's; json.dumps' separators
_DAY0 = date(1970, 1, 1)
# The exceptions json.decode leaves a value as it is for (its column rule then refuses it).
_UNFIT = (ValueError, OverflowError, TypeError, KeyError, RecursionError)
UNPLANNABLE = object()  # a schema no plan is made of: the full parse decides
SIZE = 256  # schemas kept: a table's few versions, for the topics of one run


def split(value: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(S, the mark after it, P) of a value laid out as ``{"schema":S,"payload":P}``, else
    None; S is not yet known to be a whole JSON value (Plans.get checks it)."""
    if not value.startswith(_HEAD) or value[-1:] != b"}":
        return None
    for mark in _PAYLOAD:
        i = value.find(mark, len(_HEAD))
        if i >= 0:
            return value[len(_HEAD):i], mark, value[i + len(mark):-1]
    return None


class Plans:
    """Schema bytes -> ``build(S parsed by loads)``, or UNPLANNABLE when S is not one whole
    JSON text alone (orjson: strict UTF-8, no byte order mark, no NaN) or its plan cannot
    be made; at most SIZE, all dropped when full (a new version of every table's schema at
    once is rare; a cache that thrashes costs one parse a record)."""

    def __init__(self, loads: Callable, build: Callable):
        import orjson

        self.strict, self.loads, self.build = orjson.loads, loads, build
        self.plans: dict[bytes, object] = {}
        self.last: tuple[bytes, bytes, object] | None = None  # (S, its mark, its plan)

    def of(self, value: bytes) -> tuple[object, bytes | None]:
        """(the plan, P) of a value (split, get), or (UNPLANNABLE, None). The last S is
        compared in place first: a partition's records share one, and so neither search,
        copy nor hash its bytes (the same S, whole JSON, then the same mark: the same
        split)."""
        last = self.last
        if last is not None:
            schema, mark, plan = last
            end = len(_HEAD) + len(schema)
            if (value.startswith(schema, len(_HEAD)) and value.startswith(mark, end)
                    and value.startswith(_HEAD) and value[-1:] == b"}"):
                return plan, value[end + len(mark):-1]
        parts = split(value)
        if parts is None:
            return UNPLANNABLE, None
        schema, mark, payload = parts
        plan = self.get(schema)
        self.last = schema, mark, plan
        return plan, payload

    def get(self, schema: bytes):
        plan = self.plans.get(schema)
        if plan is None:
            try:
                parsed = self.strict(schema)
                plan = self.build(parsed if self.loads is self.strict else self.loads(schema))
            except Exception:  # noqa: BLE001 - the full parse says what is wrong
                plan = UNPLANNABLE
            if len(self.plans) >= SIZE:
                self.plans.clear()
            self.plans[schema] = plan
        return plan


def decoders(fields: dict[str, dict], documents: Collection[str], generic: Callable
             ) -> tuple[tuple[str, Callable], ...]:
    """What json.decode does to an image of these fields, as (field, decoder) pairs, only
    the fields whose values it may change; ``generic``: json._decoded(f, x), for a field of
    an unusual shape (and an array of a semantic type)."""
    out = []
    for name, f in fields.items():
        kind = f.get("name")
        if kind is None:  # json._semantic: an array of a named type, else left as it is
            items = f.get("items")
            if f.get("type") == "array" and type(items) is dict and items.get("name") is not None:
                out.append((name, lambda x, f=f: generic(f, x)))
            continue
        if type(kind) is not str or kind not in _DECODED:
            continue  # a name json._decoded returns the value of as it is (Uuid, Enum, ...)
        if kind == JSON_DOCUMENT and name not in documents:
            continue
        one = _fast(kind, f)
        out.append((name, one if one is not None else lambda x, f=f: generic(f, x)))
    return tuple(out)


def _fast(kind: str, f: dict) -> Callable | None:
    """A decoder equal to json._decoded for this field, for the usual shapes; None else."""
    if kind in EPOCH_UNITS:
        unit = EPOCH_UNITS[kind]

        def epoch(x):
            if type(x) is not int:
                return x
            seconds, rest = divmod(x, unit)
            return (EPOCH + timedelta(seconds=seconds, microseconds=rest * 1_000_000 // unit)
                    ).isoformat()
        return epoch
    if kind in DATES:
        return lambda x: (_DAY0 + timedelta(days=x)).isoformat() if type(x) is int else x
    if kind == CONNECT_DECIMAL:
        parameters = f.get("parameters")
        if parameters is not None and type(parameters) is not dict:
            return None
        scale = int((parameters or {}).get("scale", 0))  # raises: json._decoded decides

        def decimal(x):
            if type(x) is not str:
                return x
            try:  # what strict mode takes, b64decode(validate=True) reads the same, faster
                unscaled = a2b_base64(x, strict_mode=True)
            except ValueError:  # it decides (and raises) for anything else
                unscaled = base64.b64decode(x, validate=True)
            return scaled(int.from_bytes(unscaled, "big", signed=True), scale)
        return decimal
    if kind == VARIABLE_SCALE:
        return lambda x: variable_scale(x) if type(x) is dict else x
    return lambda x: json_document(x) if type(x) is str else x  # JSON_DOCUMENT


# The named types json._decoded changes a value of (an array of one: no name, its items').
_DECODED = frozenset((*EPOCH_UNITS, *DATES, CONNECT_DECIMAL, VARIABLE_SCALE, JSON_DOCUMENT))


def decoded(image: dict, plan: tuple[tuple[str, Callable], ...]) -> dict:
    """json.decode(image, fields, documents) by the plan of those fields."""
    if not plan:
        return image
    out = dict(image)
    for name, decode in plan:
        x = out.get(name)
        if x is None or x == UNAVAILABLE_BASE64:
            continue
        try:
            out[name] = decode(x)
        except _UNFIT:
            continue
    return out


def floats(doc: dict, parts: tuple[str, ...] | None = None) -> bool:
    """Whether a parsed document holds a float anywhere (``parts``: in the values of these
    keys of it): orjson reads a number with a fraction or exponent, or an integer beyond
    64 bits, as one, where the standard library's parser (exact decimals:
    json.json_loader) keeps it exact."""
    if parts is not None:
        stack = []
        for part in parts:
            v = doc.get(part)
            t = type(v)
            if t is float:
                return True
            if t is dict or t is list:
                stack.append(v)
    else:
        stack = [doc]
    while stack:
        x = stack.pop()
        for v in x.values() if type(x) is dict else x:
            t = type(v)
            if t is float:
                return True
            if t is dict or t is list:
                stack.append(v)
    return False
