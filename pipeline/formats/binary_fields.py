"""The declared column types' COPY binary fields (Postgres's binary input forms), for the
avro format's rows (avro/rows.py): a field's 4-byte length, then its value.

The avro rows go to Postgres as COPY binary tuples (wire/binary.py), so that a timestamp
is one subtraction and a pack, not text to write here and parse there, and a decimal is
numeric's own form (docs/benchmarks.md, "Avro records"). Every check stays the text
rules': the generated loop writes binary only for what it would have written as text,
and the general path's text fields (avro/format.AvroFormat.fields, the typed rules) are
turned into binary by ``from_text``, which reads each back exactly as Postgres's text
input does, so the rows stored are the same. A column type without a binary form here
(an array) keeps its format's rows COPY text (``binary_types``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from pipeline.formats.timestamps import PG_END_MS, PG_FIRST_MS, TimestampOutOfRange
from pipeline.formats.types import column_type
from pipeline.formats.wire.binary import NULL_FIELD, PG_EPOCH_MS, pack_i, pack_iq
from pipeline.formats.wire.text import NULL, unescape

pack_ii = struct.Struct(">ii").pack  # an int4 field: its length (4) and value
pack_id = struct.Struct(">id").pack  # a float8 field
PG_EPOCH_US = PG_EPOCH_MS * 1000  # 2000-01-01 UTC in epoch microseconds
PG_EPOCH_DAY = 10_957  # 2000-01-01 in days since 1970-01-01
# What Python's datetime holds (years 1-9999), where the text rules stop too: in epoch
# microseconds, and days since 1970-01-01.
FIRST_US, END_US = -62_135_596_800_000_000, 253_402_300_800_000_000
FIRST_DAY, END_DAY = -719_162, 2_932_897
TRUE, FALSE = b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x00"
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_PG_DATE = date(2000, 1, 1).toordinal()
_US = timedelta(microseconds=1)
# numeric's form: length, ndigits, weight, sign, dscale, then ndigits base-10000 digits.
NUMERIC = [struct.Struct(f">ihhhh{n}H").pack for n in range(64)]
_NEG = 0x4000


def _numeric_pack(nd: int) -> Callable[..., bytes]:
    """The packer of a numeric field of ``nd`` base-10000 digits (a decimal without
    precision may have more than NUMERIC's)."""
    return NUMERIC[nd] if nd < len(NUMERIC) else struct.Struct(f">ihhhh{nd}H").pack


def numeric_field(un: int, scale: int) -> bytes:
    """The numeric field of ``un`` * 10**-scale (scale >= 0), display scale ``scale``.
    Postgres's numeric input strips leading and trailing zero digits itself."""
    sign = 0
    if un < 0:
        sign, un = _NEG, -un
    pad = -scale % 4  # the fraction filled to whole base-10000 digits
    n = un * 10 ** pad
    digits = []
    while n:
        n, d = divmod(n, 10_000)
        digits.append(d)
    if not digits:
        return NUMERIC[0](8, 0, 0, 0, scale)
    digits.reverse()
    nd = len(digits)
    return _numeric_pack(nd)(8 + 2 * nd, nd, nd - 1 - (scale + pad) // 4, sign, scale,
                             *digits)


def numeric_of(scale: int) -> Callable[[int], bytes]:
    """numeric_field(un, scale) with the usual cases inline (scale <= 4, |value| under
    10**12: up to three integer digits and one fractional one, leading zeros Postgres's to
    strip): 0.2-0.3 against 0.5-0.7 us."""
    if scale > 4:
        return lambda un: numeric_field(un, scale)
    mul = 10 ** (4 - scale)  # |un| * mul: the value in units of 10**-4
    two, three, four = NUMERIC[2], NUMERIC[3], NUMERIC[4]

    def numeric(un: int) -> bytes:
        if un < 0:
            sign, n = _NEG, -un * mul
        else:
            sign, n = 0, un * mul
        if n < 100_000_000:
            return two(12, 2, 0, sign, scale, n // 10_000, n % 10_000)
        if n < 1_000_000_000_000:
            return three(14, 3, 1, sign, scale, n // 100_000_000, n // 10_000 % 10_000,
                         n % 10_000)
        if n < 10_000_000_000_000_000:
            return four(16, 4, 2, sign, scale, n // 1_000_000_000_000,
                        n // 100_000_000 % 10_000, n // 10_000 % 10_000, n % 10_000)
        return numeric_field(un, scale)
    return numeric


def unscaled(d: Decimal, scale: int) -> int:
    """The integer d * 10**scale, exactly (``d`` has at most ``scale`` places; Decimal's
    arithmetic would round to its context's 28 digits)."""
    sign, digits, exponent = d.as_tuple()
    n, shift = int("".join(map(str, digits))), exponent + scale
    if shift >= 0:
        n *= 10 ** shift
    else:  # trailing zeros beyond the scale ("1.50" at scale 1) only
        n, rest = divmod(n, 10 ** -shift)
        if rest:
            raise ValueError(f"{d} has more than {scale} places")
    return -n if sign else n


def _numeric_of_text(scale: int) -> Callable[[str], bytes]:
    """A decimal column's text (a typed rule's, at most ``scale`` places, or the raw
    "625e-2") -> the field numeric_of(scale) writes for the same value: the same bytes
    whichever path wrote the row."""
    numeric = numeric_of(scale)

    def convert(t: str) -> bytes:
        return numeric(unscaled(Decimal(t), scale))
    return convert


def _numeric_own_scale(t: str) -> bytes:
    """A decimal (no precision) column's text, positional (json/values.exact_decimal) ->
    its numeric field, with the value's own scale as the display scale (as Postgres's text
    input keeps it)."""
    d = Decimal(t)
    scale = max(0, -d.as_tuple().exponent)
    return numeric_field(unscaled(d, scale), scale)


def _string(t: str) -> bytes:
    b = unescape(t).encode()
    return pack_i(len(b)) + b


def _jsonb(t: str) -> bytes:
    b = b"\x01" + unescape(t).encode()
    return pack_i(len(b)) + b


def _timestamp(t: str) -> bytes:
    return pack_iq(8, (datetime.fromisoformat(t) - _PG_EPOCH) // _US)


def _date(t: str) -> bytes:
    return pack_ii(4, date.fromisoformat(t).toordinal() - _PG_DATE)


# A COPY text field (a text rule's output, never NULL) -> the binary field of the same
# value, by Postgres type; an int field may come as an int (the inlined rules' f{i}).
_FROM_TEXT: dict[str, Callable[[str], bytes]] = {
    "text": _string, "jsonb": _jsonb, "bigint": lambda t: pack_iq(8, int(t)),
    "integer": lambda t: pack_ii(4, int(t)), "double precision": lambda t: pack_id(8, float(t)),
    "boolean": lambda t: TRUE if t == "t" else FALSE, "timestamp with time zone": _timestamp,
    "date": _date}


def from_text(declared: str) -> Callable[[str], bytes] | None:
    """The text field -> binary field converter of a declared column type, or None (an
    array: no binary form here)."""
    t = column_type(declared)
    if t.precision is not None:
        return _numeric_of_text(t.scale)
    if t.pg == "numeric":
        return _numeric_own_scale
    return _FROM_TEXT.get(t.pg)


def binary_types(declared: Sequence[str]) -> bool:
    """True when every declared type has a binary form (from_text)."""
    return all(from_text(d) is not None for d in declared)


def tuple_of(declared: Sequence[str]) -> Callable[[str], bytes]:
    """The general path's tab-separated text fields of ``declared`` columns -> their
    binary fields (a COPY text field holds no raw tab: text() escapes it)."""
    convert = [from_text(d) for d in declared]

    def fields(line: str) -> bytes:
        return b"".join([NULL_FIELD if f == NULL else c(f)
                         for c, f in zip(convert, line.split("\t"), strict=True)])
    return fields


class KafkaMillis:
    """Epoch milliseconds -> the timestamptz field, cached (a producer's batch shares its
    timestamps); TimestampOutOfRange outside what Postgres holds, as the text's."""

    def __init__(self) -> None:
        self.cache: dict[int, bytes] = {}

    def __call__(self, millis: int) -> bytes:
        b = self.cache.get(millis)
        if b is None:
            if not PG_FIRST_MS <= millis < PG_END_MS:
                raise TimestampOutOfRange(millis)
            if len(self.cache) > 100_000:
                self.cache.clear()
            b = self.cache[millis] = pack_iq(8, (millis - PG_EPOCH_MS) * 1000)
        return b


kafka_millis = KafkaMillis()


def row_head(topic: str, partition: int, fields: int) -> bytes:
    """A tuple's start: its field count, the topic and partition fields."""
    b = topic.encode()
    return struct.pack(">h", fields) + pack_i(len(b)) + b + pack_ii(4, partition)
