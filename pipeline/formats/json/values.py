"""The JSON format's value rules: a parsed JSON value -> its COPY text field, per declared
column type; raises WrongType for a value the type does not allow.

The same rules as Spark's ``from_json``, which a transform's path used to parse with (both
were held to the same catalogue in tests/integration/test_bad_input.py): string = a JSON string;
long/int = a JSON integer in range; double = a JSON number or one of "NaN", "Infinity",
"-Infinity"; boolean = true/false; decimal(p,s) = a JSON number or numeric string, rounded
half-up to s places, at most p digits; decimal (a NUMERIC without precision) = the same,
exact with its own scale (its column makes the JSON parse exact); timestamp = an ISO 8601
string (no offset = UTC) or an integer of epoch seconds; date = an ISO date string.
Timestamps are written with an explicit UTC offset: no time zone of any OS takes part.

types.py holds which rule each declared type uses; json/rows.py inlines the common cases
of these rules into the generated row encoder (tests/unit/test_encode.py holds the two to
the same answers).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation

from pipeline.formats.timestamps import EPOCH
from pipeline.formats.wire.text import text

_SPECIAL_DOUBLES = {"NaN": "NaN", "Infinity": "Infinity", "+Infinity": "Infinity",
                    "-Infinity": "-Infinity", "INF": "Infinity", "+INF": "Infinity",
                    "-INF": "-Infinity"}


class WrongType(ValueError):
    pass


class OutOfRange(WrongType):
    """The kind is right, the value does not fit the declared type: its message says so
    (a dead letter saying "expected decimal(20,4), got bigint" sent users to the type)."""


def string(x):
    if type(x) is str:
        return text(x)
    raise WrongType


def integer(bits: int) -> Callable:
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)

    def convert(x):
        if type(x) is int and lo <= x < hi:
            return str(x)
        raise WrongType
    return convert


def double(x):
    t = type(x)
    if t is float:
        return repr(x)
    if t is int:
        return repr(float(x))
    if t is Decimal:  # parsed exactly (a wide decimal or jsonb column beside it)
        f = float(x)
        if math.isfinite(f):
            return repr(f)
        raise WrongType
    if t is str and x in _SPECIAL_DOUBLES:
        return _SPECIAL_DOUBLES[x]
    raise WrongType


def boolean(x):
    if x is True:
        return "t"
    if x is False:
        return "f"
    raise WrongType


def decimal(precision: int, scale: int) -> Callable:
    quantum = Decimal(1).scaleb(-scale)
    wide = Context(prec=100)  # the default 28 digits would refuse a valid decimal(38, s)
    whole = precision - scale  # digits allowed before the point
    plain = 0 < scale and precision <= wide.prec  # exact's fast path: its quantize is a no-op

    def exact(x):
        t = type(x)
        if t is Decimal and plain:  # already of the column's scale (Debezium's decimals):
            text_ = str(x)          # its text is the quantized one; only its size to check
            dot = text_.find(".")
            if dot >= 0 and len(text_) - dot - 1 == scale and "E" not in text_:
                before = text_[:dot].lstrip("-")
                if (0 if before == "0" else len(before)) <= whole:
                    return text_
        try:
            if t is int or t is Decimal:
                v = Decimal(x)
            elif t is float:
                v = Decimal(repr(x))  # the shortest repr: the JSON text for <= 15 digits
            elif t is str and x.strip():
                v = Decimal(x.strip())
            else:
                raise WrongType
            if not v.is_finite():
                raise WrongType
            v = v.quantize(quantum, rounding=ROUND_HALF_UP, context=wide)
        except InvalidOperation:
            raise WrongType from None
        if len(v.as_tuple().digits) > precision:
            raise OutOfRange(f"{x.strip() if t is str else x} is too large for "
                             f"decimal({precision},{scale}) (at most {whole} digits before "
                             "the point)")
        return str(v)

    def convert(x):
        # Fast path: a plain number whose integer part leaves room for rounding up is
        # passed as written; Postgres rounds it half away from zero, as ROUND_HALF_UP does.
        t = type(x)
        if t is float or t is int:
            text_ = repr(x)
            if "e" not in text_ and "n" not in text_:
                digits = len(text_.split(".", 1)[0].lstrip("-"))
                if digits < whole or (digits == whole and "." not in text_):
                    return text_
        return exact(x)
    return convert


# What Postgres's numeric holds: digits before the point, and after it.
NUMERIC_WHOLE_DIGITS, NUMERIC_SCALE = 131_072, 16_383


def exact_decimal(x):
    """decimal, a NUMERIC without precision: the value exactly, with its own scale ("1.50"
    stays 1.50), written in positional notation (no exponent for Postgres to re-scale)."""
    t = type(x)
    try:
        if t is Decimal:
            v = x
        elif t is int:
            v = Decimal(x)
        elif t is float:
            v = Decimal(repr(x))  # the shortest repr: the text a float was written as
        elif t is str and x.strip():
            v = Decimal(x.strip())
        else:
            raise WrongType
    except (InvalidOperation, ValueError):
        raise WrongType from None
    if not v.is_finite():
        raise WrongType
    _sign, digits, exponent = v.as_tuple()
    if -exponent > NUMERIC_SCALE or len(digits) + exponent > NUMERIC_WHOLE_DIGITS:
        raise WrongType(f"beyond what a Postgres numeric holds ({NUMERIC_WHOLE_DIGITS} digits "
                        f"before the point, {NUMERIC_SCALE} after)")
    return format(v, "f")


# An ISO timestamp with an explicit offset Postgres accepts (at most 15:59 away from UTC):
# once Python has validated it, Postgres reads it as written (no zone of any OS or session
# takes part). Anything else is converted to UTC here.
EXPLICIT_OFFSET_SHAPE = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-](0\d|1[0-5]):[0-5]\d)")


def timestamp(x):
    t = type(x)
    if t is int:
        try:
            return (EPOCH + timedelta(seconds=x)).isoformat(sep=" ")
        except OverflowError:
            raise WrongType from None
    if t is str:
        try:
            v = datetime.fromisoformat(x.strip())
            if v.tzinfo is not None and EXPLICIT_OFFSET_SHAPE.fullmatch(x):
                return x
            if v.tzinfo is None:
                v = v.replace(tzinfo=UTC)
            return v.astimezone(UTC).isoformat(sep=" ")
        except (ValueError, OverflowError):
            raise WrongType from None
    raise WrongType


def date_(x):
    if type(x) is str:
        s = x.strip()
        for sep in ("T", " "):
            s = s.split(sep, 1)[0]
        try:
            return date.fromisoformat(s).isoformat()
        except ValueError:
            raise WrongType from None
    raise WrongType
