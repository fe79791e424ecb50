"""Kafka records -> Postgres COPY rows: a result row or a dead letter per record.

The raw sink's rows are COPY *binary* tuples: its bytes go to bytea as they are, with no
hex to write here or parse in Postgres (2M records: Postgres CPU 13 s -> see
docs/benchmarks.md). The JSON sink's rows and all dead letters are COPY text lines.

The built-in sinks' per-record work, in plain Python on the executors (see consume.py for
why not in the JVM). Pure: takes records (anything with confluent-kafka's Message methods
``offset() key() value() headers() timestamp()``), returns lines; unit-tested without
Kafka or Spark.

Typing rules of the JSON sink (the same as Spark's ``from_json``, which a transform's path
still uses; both are held to the same catalogue in tests/integration/test_bad_input.py):
string = a JSON string; long/int = a JSON integer in range; double = a JSON number or one of
"NaN", "Infinity", "-Infinity"; boolean = true/false; decimal(p,s) = a JSON number or
numeric string, rounded half-up to s places, at most p digits; timestamp = an ISO 8601
string (no offset = UTC) or an integer of epoch seconds; date = an ISO date string; null
or absent = NULL, a dead letter if the column is "not null". Timestamps are written with an
explicit UTC offset: no time zone of any OS takes part.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import NamedTuple

from pipeline.formats import diagnose as d

NULL = "\\N"
# COPY binary: the stream's signature (flags 0, no header extension) and trailer.
BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
BINARY_TRAILER = b"\xff\xff"
_NULL_FIELD = b"\xff\xff\xff\xff"
_PG_EPOCH_MS = 946_684_800_000  # 2000-01-01, where Postgres counts timestamps from
# What timestamptz holds, in epoch ms: [4714-11-24 BC, 294277-01-01) UTC.
PG_FIRST_MS = -210_866_803_200_000
PG_END_MS = 9_224_318_016_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SPECIAL_DOUBLES = {"NaN": "NaN", "Infinity": "Infinity", "+Infinity": "Infinity",
                    "-Infinity": "-Infinity", "INF": "Infinity", "+INF": "Infinity",
                    "-INF": "-Infinity"}


class Unstorable(ValueError):
    """A value Postgres would refuse (a NUL character in text): the record becomes a dead
    letter instead of failing the whole COPY on every rerun."""


def text(value: str) -> str:
    """One COPY text field; Postgres text cannot hold NUL."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
                 .replace("\r", "\\r"))
    if "\x00" in value:
        raise Unstorable("contains a NUL character (\\u0000), which Postgres text cannot store")
    return value


def bytea(value: bytes | None) -> str:
    return NULL if value is None else "\\\\x" + value.hex()


class TimestampOutOfRange(ValueError):
    """A Kafka timestamp outside what Postgres's timestamptz holds: the record is a dead
    letter ``timestamp_out_of_range`` (its timestamp NULL), not a COPY that fails forever."""

    def __init__(self, millis: int):
        super().__init__(f"Kafka timestamp {millis} ms is outside what Postgres can store "
                         "(4714-11-24 BC to 294276-12-31 UTC); a producer that sent micro- or "
                         "nanoseconds as milliseconds?")


class _Millis:
    """Epoch milliseconds -> COPY text, cached: a producer's batch shares its timestamps."""

    def __init__(self) -> None:
        self.cache: dict[int, str] = {}

    def __call__(self, millis: int) -> str:
        s = self.cache.get(millis)
        if s is None:
            if len(self.cache) > 100_000:
                self.cache.clear()
            seconds, ms = divmod(millis, 1000)
            try:
                s = (f"{(_EPOCH + timedelta(seconds=seconds)):%Y-%m-%d %H:%M:%S}"
                     f".{ms:03d}000+00")
            except OverflowError:  # beyond datetime's years 1-9999
                s = far_timestamp(millis)
            self.cache[millis] = s
        return s


def far_timestamp(millis: int) -> str:
    """Epoch ms -> COPY text for any instant Postgres holds, years past 9999 and BC
    included (where Python's datetime stops); else TimestampOutOfRange. Integer arithmetic
    on the proleptic Gregorian calendar (H. Hinnant's days -> civil date), as Postgres."""
    if not PG_FIRST_MS <= millis < PG_END_MS:
        raise TimestampOutOfRange(millis)
    days, ms_of_day = divmod(millis, 86_400_000)
    z = days + 719_468  # days since 0000-03-01
    era, doe = divmod(z, 146_097)
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day, month = doy - (153 * mp + 2) // 5 + 1, mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    seconds, ms = divmod(ms_of_day, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    era_suffix = ""
    if year <= 0:  # no year 0: 1 BC precedes 1 AD
        year, era_suffix = 1 - year, " BC"
    return (f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
            f".{ms:03d}000+00{era_suffix}")


kafka_timestamp = _Millis()
kafka_timestamp.__doc__ = "A record's timestamp (epoch ms) in UTC, as Spark's source has it."


def headers_json(headers: Sequence[tuple[str, bytes | None]] | None) -> str:
    """The headers as a COPY text field (see headers_plain)."""
    return "[]" if not headers else text(headers_plain(headers))


def headers_plain(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """Headers as Spark's Kafka source + to_json has them: [{"key", "value_b64"}], the value
    base64 (bytes need not be UTF-8), a null value without "value_b64"."""
    out = []
    for key, value in headers:
        if "\x00" in key:  # jsonb refuses \u0000
            raise Unstorable("contains a NUL character (\\u0000), which jsonb cannot store")
        item = {"key": key}
        if value is not None:
            item["value_b64"] = base64.b64encode(value).decode()
        out.append(item)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


_pack_i = struct.Struct(">i").pack
_pack_q = struct.Struct(">q").pack
_pack_iq = struct.Struct(">iq").pack
_EMPTY_HEADERS = b"\x00\x00\x00\x03\x01[]"  # jsonb's binary input: version 1, then text


def raw_rows_binary(topic: str, partition: int, run_id: int, records,
                    unstorable: Callable) -> list[bytes]:
    """The raw sink's rows as COPY binary tuples (topic, partition, offset, key, value,
    headers, kafka_timestamp, run_id); a record Postgres cannot store goes to
    ``unstorable(record, reason)`` instead; a timestamp it cannot hold raises
    TimestampOutOfRange (Encoder.encode then makes that record a dead letter)."""
    t = topic.encode()
    prefix = struct.pack(">hi", 8, len(t)) + t + struct.pack(">ii", 4, partition) + _pack_i(8)
    tail = _pack_iq(8, run_id)
    first, end = PG_FIRST_MS, PG_END_MS
    rows = []
    append = rows.append
    for m in records:
        k, v, h = m.key(), m.value(), m.headers()
        if h:
            try:
                hj = b"\x01" + headers_plain(h).encode()
            except Unstorable as e:
                unstorable(m, f"header key {e}")
                continue
            hf = _pack_i(len(hj)) + hj
        else:
            hf = _EMPTY_HEADERS
        ms = m.timestamp()[1]
        if not first <= ms < end:  # Postgres's COPY would refuse the whole batch
            raise TimestampOutOfRange(ms)
        append(b"".join((
            prefix, _pack_q(m.offset()),
            _NULL_FIELD if k is None else _pack_i(len(k)) + k,
            _NULL_FIELD if v is None else _pack_i(len(v)) + v,
            hf, _pack_iq(8, (ms - _PG_EPOCH_MS) * 1000), tail)))
    return rows


def binary_rows(fmt: str) -> bool:
    """True when a sink's result rows are COPY binary (raw), False for COPY text (json)."""
    return fmt == "raw"


# ---- typed JSON fields -----------------------------------------------------------------

class WrongType(ValueError):
    pass


def _string(x):
    if type(x) is str:
        return text(x)
    raise WrongType


def _integer(bits: int):
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)

    def convert(x):
        if type(x) is int and lo <= x < hi:
            return str(x)
        raise WrongType
    return convert


def _double(x):
    t = type(x)
    if t is float:
        return repr(x)
    if t is int:
        return repr(float(x))
    if t is str and x in _SPECIAL_DOUBLES:
        return _SPECIAL_DOUBLES[x]
    raise WrongType


def _boolean(x):
    if x is True:
        return "t"
    if x is False:
        return "f"
    raise WrongType


def _decimal(precision: int, scale: int):
    quantum = Decimal(1).scaleb(-scale)
    wide = Context(prec=100)  # the default 28 digits would refuse a valid decimal(38, s)
    whole = precision - scale  # digits allowed before the point

    def exact(x):
        t = type(x)
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
            raise WrongType
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


# An ISO timestamp with an explicit offset Postgres accepts (at most 15:59 away from UTC):
# once Python has validated it, Postgres reads it as written (no zone of any OS or session
# takes part). Anything else is converted to UTC here.
_EXPLICIT_OFFSET_SHAPE = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d{1,6})?(Z|[+-](0\d|1[0-5]):[0-5]\d)")


def _timestamp(x):
    t = type(x)
    if t is int:
        try:
            return (_EPOCH + timedelta(seconds=x)).isoformat(sep=" ")
        except OverflowError:
            raise WrongType from None
    if t is str:
        try:
            v = datetime.fromisoformat(x.strip())
            if v.tzinfo is not None and _EXPLICIT_OFFSET_SHAPE.fullmatch(x):
                return x
            if v.tzinfo is None:
                v = v.replace(tzinfo=UTC)
            return v.astimezone(UTC).isoformat(sep=" ")
        except (ValueError, OverflowError):
            raise WrongType from None
    raise WrongType


def _date(x):
    if type(x) is str:
        s = x.strip()
        for sep in ("T", " "):
            s = s.split(sep, 1)[0]
        try:
            return date.fromisoformat(s).isoformat()
        except ValueError:
            raise WrongType from None
    raise WrongType


def converter(declared: str) -> Callable:
    """The declared column type (config) -> value -> COPY text field; raises WrongType."""
    if declared.startswith("decimal("):
        p, s = declared[len("decimal("):-1].split(",")
        return _decimal(int(p), int(s))
    return {"string": _string, "long": _integer(64), "int": _integer(32), "double": _double,
            "boolean": _boolean, "timestamp": _timestamp, "date": _date}[declared]


def json_loader(columns: Sequence[tuple[str, str]]) -> Callable[[bytes], object]:
    """orjson for speed; the standard library with exact decimals when a decimal column is
    wider than a double's 15 exact digits."""
    if wide_decimals(columns):
        return lambda v: json.loads(v, parse_float=Decimal)
    import orjson

    return orjson.loads


def wide_decimals(columns: Sequence[tuple[str, str]]) -> bool:
    """A decimal column wider than a double's 15 exact digits: parsed by the standard
    library (exact decimals), which, unlike orjson, lets a lone surrogate into a string."""
    return any(t.startswith("decimal(") and int(t[8:].split(",")[0]) > 15 for _, t in columns)


# ---- whole records ---------------------------------------------------------------------

# The per-type conversions of row_encoder, inlined into its loop (a function call per field
# cost as much as the conversion). Each leaves the field in f{i} (str, or an int/float whose
# str() is its COPY text) or raises; anything unusual goes to the general converter c{i}.
_INLINE = {
    "long": ("if type(x) is not int or not {lo} <= x < {hi}: raise W",
             "f{i} = x"),
    "int": ("if type(x) is not int or not {lo} <= x < {hi}: raise W",
            "f{i} = x"),
    # isalnum(): nothing to escape and no NUL, checked in C; otherwise text() decides.
    "string": ("if type(x) is not str: raise W",
               "f{i} = x if x.isalnum() else text(x)"),
    "boolean": ("f{i} = 't' if x is True else 'f' if x is False else c{i}(x)",),
    # A float or int well inside the precision (no rounding can overflow it) is passed as
    # Python writes it; Postgres rounds it half away from zero, as ROUND_HALF_UP does.
    "decimal": ("t = type(x)",
                "f{i} = x if (t is float or t is int) and -{bound} < x < {bound} else c{i}(x)"),
    # The usual shape is validated here and passed as written; others go to _timestamp.
    "timestamp": ("if type(x) is str and shape(x) is not None:",
                  "    fromiso(x)",
                  "    f{i} = x",
                  "else:",
                  "    f{i} = c{i}(x)"),
}


def _inline(i: int, declared: str) -> list[str]:
    kind = declared.split("(", 1)[0]
    if kind in ("long", "int"):
        bits = 64 if kind == "long" else 32
        fmt = {"lo": -(1 << (bits - 1)), "hi": 1 << (bits - 1)}
    elif kind == "decimal":
        p, s = declared[len("decimal("):-1].split(",")
        if int(p) > 15:  # parsed as Decimal (json_loader): the exact path
            return [f"f{i} = c{i}(x)"]
        fmt = {"bound": 10 ** (int(p) - int(s)) - 1}
    elif kind in _INLINE:
        fmt = {}
    else:
        return [f"f{i} = c{i}(x)"]
    return [line.format(i=i, **fmt) for line in _INLINE[kind]]


def row_encoder(columns: Sequence[tuple[str, str, bool]]) -> Callable:
    """A function (records, head, tail, loads, convert..., rejected) -> result lines, with
    the declared columns and their type checks unrolled into its source: the per-record
    loop over columns and a function call per field cost as much as the conversions
    themselves (200k bench records: 2.6 -> 2.1 us each). Any record it cannot turn into a
    line, for whatever reason, goes to ``rejected`` for the general path (Encoder.explain),
    so this function only ever accepts what the column rules (``converter``) accept."""
    params = [f"c{i}" for i in range(len(columns))]
    body = []
    for i, (name, declared, required) in enumerate(columns):
        convert = _inline(i, declared)
        if required:
            body += [f"x = doc[{name!r}]", "if x is None: raise W", *convert]
        else:
            body += [f"x = doc.get({name!r})", "if x is None:", f"    f{i} = NULL", "else:",
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
                 "fromiso": datetime.fromisoformat, "shape": _EXPLICIT_OFFSET_SHAPE.fullmatch}
    exec(compile(source, f"<row_encoder {[c[0] for c in columns]}>", "exec"), namespace)
    return namespace["encode_rows"]


_NOT_JSON = object()
JSON_WHITESPACE = " \t\n\r"  # what JSON ignores around a value (RFC 8259), and so do keys


class BadTombstone(ValueError):
    """A null-valued record whose Kafka key cannot name the row to delete."""


def key_fields(key: bytes | None, columns: Sequence[tuple[str, Callable, str]]) -> list[str]:
    """The business key of an upsert sink's tombstone, from its Kafka key, as COPY text
    fields. ``columns``: (name, converter, declared type) of the key columns. The Kafka key
    is a JSON object holding them (``{"order_id": 42}``); for a one-column key also a bare
    JSON value (``42``, ``"A-17"``), or, for a string column, any UTF-8 text (``A-17``).
    Whitespace around the key is insignificant in every form, as JSON has it around a
    value: ``"42"\\n``, ``42\\n`` and ``42`` all name the row whose key is '42'."""
    if key is None:
        raise BadTombstone("has no Kafka key")
    try:
        as_text = key.decode("utf-8")
    except UnicodeDecodeError:
        raise BadTombstone("has a Kafka key that is not UTF-8") from None
    try:
        doc = json.loads(as_text, parse_float=Decimal)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json allows
        doc = _NOT_JSON
    if type(doc) is not dict:
        single_string = len(columns) == 1 and columns[0][2] == "string"
        if len(columns) != 1 or (doc is _NOT_JSON and not single_string):
            names = ", ".join(n for n, _, _ in columns)
            raise BadTombstone(f"has a Kafka key that is not a JSON object with {names}")
        if single_string and type(doc) is not str:
            doc = as_text.strip(JSON_WHITESPACE)  # 42 (or null, or any text) names '42'
        doc = {columns[0][0]: doc}
    fields = []
    for name, convert, declared in columns:
        x = doc.get(name)
        if x is None:
            raise BadTombstone(f"has a Kafka key without '{name}'")
        try:
            fields.append(str(convert(x)))
        except WrongType:
            raise BadTombstone(f"has a Kafka key whose '{name}' is not a {declared}") from None
        except Unstorable as e:
            raise BadTombstone(f"has a Kafka key whose '{name}' {e}") from None
    return fields


class Encoded(NamedTuple):
    """One batch's lines: result rows, dead letters, and an upsert sink's tombstones
    (``topic, partition, offset, kafka_timestamp, key..., run_id, t``)."""
    rows: list[str] | list[bytes]
    dead: list[str]
    tombstones: list[str]


class Encoder:
    """Turns a batch of one partition's records into result lines and dead-letter lines.

    ``columns``: the JSON sink's declared (name, type, required) triples; empty for raw.
    ``tombstone_key``: an upsert sink's key columns when a null value deletes its key
    (config.SinkSettings.deletes); empty otherwise, and a null value is a dead letter."""

    def __init__(self, fmt: str, columns: Sequence[tuple[str, str, bool]], run_id: int,
                 tombstone_key: Sequence[str] = ()):
        self.raw = fmt == "raw"
        self.binary = binary_rows(fmt)
        self.columns = [(n, converter(t), r) for n, t, r in columns]
        self.declared = [(n, t) for n, t, _ in columns]
        self.run_id = run_id
        self.tail = f"\t{run_id}\n"
        self.loads = json_loader(self.declared) if not self.raw else None
        self.rows = row_encoder(columns) if not self.raw else None
        # orjson refuses a lone surrogate escape ("\ud800"); the standard library's parser
        # (wide decimals) lets it into a string that cannot be written as UTF-8.
        self.surrogates_possible = not self.raw and wide_decimals(self.declared)
        types = dict(self.declared)
        self.key = [(n, converter(types[n]), types[n]) for n in tombstone_key]

    def encode(self, topic: str, partition: int, records) -> Encoded:
        """(result rows, dead-letter lines, tombstones): rows are COPY binary tuples for
        the raw sink (bytes), COPY text lines for the JSON sink; the rest is text.

        No record can fail a batch: the batch is encoded at full speed and, only when that
        raises (anything: RecursionError, OverflowError, MemoryError, a bug), again one
        record at a time, where whatever one record raises makes it a dead letter naming
        the exception. The good path pays nothing for the guard."""
        head = f"{text(topic)}\t{partition}\t"
        try:
            return self._encode(topic, partition, head, records)
        except Exception:  # noqa: BLE001 - some record of the batch: found by _encode_each
            return self._encode_each(topic, partition, head, records)

    def _encode_each(self, topic: str, partition: int, head: str, records) -> Encoded:
        """The per-record boundary: each record alone; any exception is its dead letter."""
        rows: list = []
        dead: list[str] = []
        tombstones: list[str] = []
        for m in records:
            try:
                one = self._encode(topic, partition, head, [m])
            except Exception as e:  # noqa: BLE001 - whatever it is, it is this record's
                dead.append(self.failed_line(head, m, e))
                continue
            rows += one.rows
            dead += one.dead
            tombstones += one.tombstones
        return Encoded(rows, dead, tombstones)

    def failed_line(self, head: str, m, e: Exception) -> str:
        """The dead letter of a record whose encoding raised ``e``."""
        if isinstance(e, TimestampOutOfRange):
            return self.dead_line(head, m, "timestamp_out_of_range", str(e))
        return self.dead_line(head, m, *d.unexpected(e, "encoding the record"))

    def _encode(self, topic: str, partition: int, head: str, records) -> Encoded:
        dead: list[str] = []
        tombstones: list[str] = []
        if self.raw:
            rows = raw_rows_binary(topic, partition, self.run_id, records, lambda m, why:
                                   dead.append(self.dead_line(head, m, "unstorable", why)))
            return Encoded(rows, dead, tombstones)
        rejected: list = []
        rows = self.rows(records, head, self.tail, self.loads, kafka_timestamp,
                         *[c for _, c, _ in self.columns], rejected)
        if self.surrogates_possible:
            rows = self._utf8_only(rows, records, head, dead)
        for m in rejected:
            # A timestamp Postgres cannot hold raises here (the row encoder rejected it):
            # encode() then makes the record a dead letter of that type.
            timestamp = kafka_timestamp(m.timestamp()[1])
            value = m.value()
            if value is None and self.key:
                try:
                    fields = "\t".join(key_fields(m.key(), self.key))
                except BadTombstone as e:
                    dead.append(self.dead_line(head, m, "bad_tombstone", f"tombstone (null "
                                               f"value) {e}: it cannot name the row to delete"))
                else:
                    tombstones.append(f"{head}{m.offset()}\t{timestamp}\t{fields}"
                                      f"\t{self.run_id}\tt\n")
                continue
            try:
                doc = self.loads(value)
            except Exception:  # noqa: BLE001 - any parse failure is the record's
                doc = None
            error_type, message = self.explain(value, doc)
            dead.append(self.dead_line(head, m, error_type, message))
        return Encoded(rows, dead, tombstones)

    def _utf8_only(self, rows: list[str], records, head: str, dead: list[str]) -> list[str]:
        """Rows that cannot be encoded as UTF-8 become dead letters (not a task that fails
        on every rerun); found by their offset, the line's third field."""
        kept = []
        by_offset = None
        for line in rows:
            try:
                line.encode()
            except UnicodeEncodeError:
                by_offset = by_offset or {m.offset(): m for m in records}
                m = by_offset[int(line.split("\t", 3)[2])]
                dead.append(self.dead_line(head, m, "unstorable", "a string holds an unpaired "
                                           "surrogate escape, which is not valid UTF-8"))
                continue
            kept.append(line)
        return kept

    def explain(self, value: bytes | None, doc: object) -> tuple[str, str]:
        """Why a record is not a result row; bad records are rare, so this may be slow.
        The order of the checks is the Spark marking's (transform.mark)."""
        if value is None:
            return d.diagnose(d.NULL_VALUE, value, None, self.declared)
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return d.diagnose(d.INVALID_UTF8, value, None, self.declared)
        if doc is None:
            try:  # what orjson refuses but JSON allows (NaN) is explained, not accepted
                doc = json.loads(value, parse_float=Decimal)
            except RecursionError:
                return d.TOO_DEEP
            except ValueError:
                return d.diagnose(d.PARSE, value, None, self.declared)
        if type(doc) is not dict:
            return d.diagnose(d.PARSE, value, None, self.declared)
        typed = {}
        for name, convert, _ in self.columns:
            x = doc.get(name)
            if x is None:
                continue
            try:
                convert(x)
                typed[name] = x
            except WrongType:
                if dict(self.declared)[name] != "string":
                    return d.diagnose(d.PARSE, value, json.dumps(typed, default=str),
                                      self.declared)
            except Unstorable as e:
                return "unstorable", f"field '{name}' {e}"
        for name, _, required in self.columns:
            x = doc.get(name)
            if x is None:
                if required:
                    return d.diagnose(d.MISSING + name, value, None, self.declared)
            elif dict(self.declared)[name] == "string" and type(x) is not str:
                return d.diagnose(d.NOT_A_STRING + name, value, None, self.declared)
        return "malformed_json", "value does not match the declared columns"

    def dead_line(self, head: str, m, error_type: str, message: str) -> str:
        """A dead letter; whatever the record holds, this line can be written."""
        try:
            headers = headers_json(m.headers())
        except Exception:  # noqa: BLE001 - a NUL in a key (jsonb refuses it), or anything
            # The header key cannot be stored as jsonb text: keep it escaped, as base64.
            headers = text(json.dumps([{"key_b64": base64.b64encode(k.encode()).decode(),
                                   "value_b64": None if v is None else
                                   base64.b64encode(v).decode()} for k, v in m.headers()]))
        try:
            timestamp = kafka_timestamp(m.timestamp()[1])
        except TimestampOutOfRange:
            timestamp = NULL  # the record's timestamp is in the message
        return (f"{head}{m.offset()}\t{bytea(m.key())}\t{bytea(m.value())}\t{headers}\t"
                f"{timestamp}\t{text(error_type)}\t{text(message)}\n")
