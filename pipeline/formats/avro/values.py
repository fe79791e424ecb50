"""The Avro format's value rules: a value fastavro decoded -> its COPY text field, per
declared column type; raises WrongType for a value the type does not allow.

fastavro hands out Python values with the Avro logical types already applied: decimal ->
Decimal, timestamp-millis/micros -> a UTC datetime, date -> date, uuid -> UUID (or its
string). So the rules go by the Python type: string = a string, an enum symbol or a uuid;
long/int = an integer in range (an Avro int read into a long column is the int -> long
promotion); double = a float or an integer (float -> double); boolean; decimal(p,s) = a
Decimal, an integer or a float, rounded half-up to s places, at most p digits (the JSON
rule); decimal = the same, exact with its own scale; timestamp = a datetime (a
local-timestamp without zone is taken as UTC); date = a date. types.py holds which rule
each declared type uses.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from uuid import UUID

from pipeline.formats.json import values as jv
from pipeline.formats.json.values import WrongType
from pipeline.formats.wire.text import text


def string(x):
    t = type(x)
    if t is str:
        return text(x)
    if t is UUID:
        return str(x)
    raise WrongType


# An integer in range: the same rule as JSON's (fastavro hands out Python ints too).
integer = jv.integer


def double(x):
    t = type(x)
    if t is float:
        return repr(x)
    if t is int:
        return repr(float(x))
    raise WrongType


boolean = jv.boolean


def decimal(precision: int, scale: int) -> Callable:
    rule = jv.decimal(precision, scale)  # takes Decimal, int and float exactly as JSON's

    def convert(x):
        if type(x) is str or type(x) is bool:  # JSON allows numeric strings; Avro has types
            raise WrongType
        return rule(x)
    return convert


def exact_decimal(x):
    if type(x) is str or type(x) is bool:  # as decimal(p,s): Avro has types
        raise WrongType
    return jv.exact_decimal(x)


def timestamp(x):
    if type(x) is datetime:
        if x.tzinfo is None:
            x = x.replace(tzinfo=UTC)
        return x.astimezone(UTC).isoformat(sep=" ")
    raise WrongType


def date_(x):
    if type(x) is date:
        return x.isoformat()
    raise WrongType


def avro_kind(x) -> str:
    """What a decoded value is, in Avro's words, for a wrong_type message."""
    if x is None:
        return "null"
    names = {bool: "boolean", int: "long", float: "double", str: "string", bytes: "bytes",
             dict: "record or map", list: "array", datetime: "timestamp", date: "date",
             UUID: "uuid"}
    return names.get(type(x), type(x).__name__.lower())
