"""The Encoder's COPY text result lines -> one typed Arrow batch, parsed in Arrow's C++.

The transform path feeds a user transform the rows the built-in sinks would store: the
lines Encoder.encode writes for the json, avro and protobuf formats (``topic, partition,
offset, kafka_timestamp, <declared columns>, run_id``, tab-separated, COPY text escapes,
``\\N`` for NULL). Reading each field back in Python (int(), Decimal(), fromisoformat()) costs about
1 us a field; here the lines go to Arrow as one buffer, its CSV reader splits them (tab,
no quoting, ``\\N`` = NULL) and each column is cast to its type in C++.

Exactness: the Encoder writes a few canonical forms per type (str(int), repr(float),
"t"/"f", ISO dates, ISO timestamps with an explicit offset, decimals as Python writes
them), which Arrow's casts read to the same values as Python does (tests/unit/
test_arrow_rows.py holds them to it). What a cast refuses is never read approximately:
a decimal with more places than its scale (the JSON format passes a float's repr as
written) is rounded half away from zero in C++, as Postgres's numeric input rounds it; a
Kafka timestamp past year 9999 or BC (timestamps.far_timestamp) sends its own rows to
``micros``; anything unforeseen sends its column to the exact per-field rules
(``_exact``). Strings are unescaped in Python only where a backslash occurs.

Use: ``RowReader(columns).batch(encoded.rows)`` -> a pa.RecordBatch of
``arrow_schema(columns)``; ``spark_schema(columns)`` is the same as Spark DDL, for
``mapInArrow``. Pure: no Spark, no I/O.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal

from pipeline.formats import paths
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import unescape

# The columns every line starts with, before the declared ones (Encoder: head, offset,
# kafka_timestamp), as declared types.
HEAD = (("topic", "string"), ("partition", "int"), ("offset", "long"),
        ("kafka_timestamp", "timestamp"))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_INT64 = 1 << 63
_SAMPLE = 256
# The ISO timestamps Arrow's cast reads (RE2); a row of another form (a far Kafka
# timestamp) is read by ``micros``.
_ISO = (r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d{1,6})?"
        r"(Z|[+-]\d\d(:?\d\d)?)$")
# timestamps.far_timestamp's form: a year past 9999 or BC, which datetime cannot read; and
# _Millis's years 1-999, which strftime's %Y writes without leading zeros on glibc.
_FAR = re.compile(r"(\d+)-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?\+00( BC)?",
                  re.ASCII)


class NotOnTransformPath(ValueError):
    """A declared column that is not one scalar value (jsonb, array<T>)."""


class Unrepresentable(ValueError):
    """A value the Arrow type cannot hold: a Kafka timestamp past Spark's year 294247
    (plan/far_records.SPARK_MAX_MS), which Postgres holds; the caller leaves such records
    out (as a dead letter) before encoding. Names the first such record."""

    def __init__(self, message: str, topic: str, partition: int, offset: int):
        super().__init__(message)
        self.topic, self.partition, self.offset = topic, partition, offset


def declared(columns: Sequence[Sequence]) -> list[tuple[str, str]]:
    """The declared (name, type, required[, path]) columns as (name, type); raises
    NotOnTransformPath for a column that is not scalar, ValueError for a name that is
    also a head column."""
    out = []
    for name, t, _, _ in paths.columns(columns):
        if not column_type(t).scalar:
            raise NotOnTransformPath(
                f"column {name} is {t}: only scalar columns (string, long, int, double, "
                "boolean, decimal(p,s), timestamp, date) are read as typed Arrow columns")
        if name in dict(HEAD):
            raise ValueError(f"column {name} has the name of a Kafka column ("
                             f"{', '.join(n for n, _ in HEAD)}): rename it")
        out.append((name, t))
    return out


def arrow_type(declared_type: str):
    """The Arrow type Spark reads as the declared type's Spark type."""
    import pyarrow as pa

    t = column_type(declared_type)
    if t.precision is not None:
        return pa.decimal128(t.precision, t.scale)
    return {"string": pa.string(), "long": pa.int64(), "int": pa.int32(),
            "double": pa.float64(), "boolean": pa.bool_(),
            "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}[declared_type]


def arrow_schema(columns: Sequence[Sequence]):
    """The batches' pa.Schema: HEAD, then the declared columns."""
    import pyarrow as pa

    return pa.schema([(n, arrow_type(t)) for n, t in (*HEAD, *declared(columns))])


def spark_schema(columns: Sequence[Sequence]) -> str:
    """The batches' schema as Spark DDL (mapInArrow's schema argument)."""
    return ", ".join(f"`{n.replace('`', '``')}` {column_type(t).spark}"
                     for n, t in (*HEAD, *declared(columns)))


def _decimal(precision: int, scale: int) -> Callable[[str], Decimal]:
    """Postgres's numeric(p,s) input: rounded half away from zero to s places."""
    quantum = Decimal(1).scaleb(-scale)
    wide = Context(prec=100)

    def read(field: str) -> Decimal:
        v = Decimal(field).quantize(quantum, rounding=ROUND_HALF_UP, context=wide)
        if not v.is_finite() or len(v.as_tuple().digits) > precision:
            raise ValueError(f"{field!r} does not fit decimal({precision},{scale})")
        return v
    return read


def _days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (year 0 = 1 BC); H. Hinnant's
    days_from_civil, timestamps.far_timestamp's inverse."""
    year -= month <= 2
    era, yoe = divmod(year, 400)
    doy = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


def micros(field: str) -> int:
    """A timestamp's COPY text the Encoder wrote -> epoch microseconds, exactly: an ISO
    timestamp with its offset, or far_timestamp's years past 9999 and BC."""
    try:
        v = datetime.fromisoformat(field)
    except ValueError:
        m = _FAR.fullmatch(field)
        if m is None:
            raise
        year, month, day, hour, minute, second = map(int, m.groups()[:6])
        if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60
                and second < 60 and year > 0):
            raise ValueError(f"{field!r} is not a timestamp") from None
        if m.group(8):  # no year 0: 1 BC is year 0 of the proleptic calendar
            year = 1 - year
        seconds = _days(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        return seconds * 1_000_000 + int((m.group(7) or "").ljust(6, "0"))
    if v.tzinfo is None:  # as pyarrow takes a naive datetime for a UTC column
        v = v.replace(tzinfo=UTC)
    return (v - _EPOCH) // _US


def _exact(declared_type: str) -> Callable[[str], object]:
    """The exact per-field reading of a column (the fallback): a non-NULL field -> the
    Python value pyarrow stores as the column's Arrow type."""
    t = column_type(declared_type)
    if t.precision is not None:
        return _decimal(t.precision, t.scale)
    return {"string": unescape, "long": int, "int": int, "double": float,
            "boolean": lambda f: f == "t", "timestamp": micros,
            "date": date.fromisoformat}[declared_type]


def _rounded(strings, target, pa, pc):
    """A decimal column with more places than its scale (the JSON format passes a float's
    repr as written, and Postgres rounds it): read 38 or 76 digits wide, rounded half away from
    zero to the scale (Postgres's numeric input, ROUND_HALF_UP), then narrowed, which
    refuses a value past the precision."""
    whole = target.precision - target.scale
    try:  # 38 digits hold a float's repr beside up to 17 whole digits; faster than 76
        wide = pc.cast(strings, pa.decimal128(38, 38 - whole))
    except pa.ArrowInvalid:
        wide = pc.cast(strings, pa.decimal256(76, 76 - whole))
    rounded = pc.round(wide, ndigits=target.scale, round_mode="half_towards_infinity")
    return pc.cast(rounded, target)


class RowReader:
    """Reads batches of result lines of one sink's declared columns (the Encoder's
    ``Encoded.rows`` of a text format) as pa.RecordBatch of ``arrow_schema(columns)``."""

    def __init__(self, columns: Sequence[Sequence]):
        self.declared = tuple(tuple(c) for c in columns)
        self.columns = [*HEAD, *declared(columns)]
        self.schema = arrow_schema(columns)
        self.exact = [_exact(t) for _, t in self.columns]
        # Positional names: a line's fields, the run id last (not read).
        self.fields = [f"f{i}" for i in range(len(self.columns) + 1)]

    def __reduce__(self):  # pickled by its columns (for Spark's executors), not closures
        return RowReader, (self.declared,)

    def batch(self, lines: Sequence[str]):
        """The lines' columns; raises Unrepresentable for a value the Arrow type cannot
        hold, naming the record."""
        import pyarrow as pa

        if not lines:
            return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in self.schema],
                                              schema=self.schema)
        if not isinstance(lines[0], str):
            raise TypeError(f"lines of {type(lines[0]).__name__}, not str: only a text "
                            "format's rows (json, avro, protobuf) are COPY text; raw's are "
                            "COPY binary")
        table = self._split(lines)
        arrays = [self.typed(table.column(i), t, exact, table)
                  for i, ((_, t), exact) in enumerate(zip(self.columns, self.exact,
                                                          strict=True))]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _split(self, lines: Sequence[str]):
        """The lines' fields as string columns (NULL for ``\\N``), escapes kept."""
        import pyarrow as pa
        import pyarrow.csv as csv

        # pa.array writes the lines' UTF-8 back to back: its data buffer is the text.
        joined = pa.array(lines, pa.large_string())
        _, offsets, data = joined.buffers()
        n = len(lines)
        text = data.slice(0, int.from_bytes(memoryview(offsets)[8 * n:8 * n + 8],
                                            sys.byteorder, signed=True))
        names = self.fields
        try:
            table = csv.read_csv(
                pa.BufferReader(text),
                read_options=csv.ReadOptions(column_names=names, use_threads=False,
                                             block_size=max(1 << 20, text.size + 1)),
                parse_options=csv.ParseOptions(delimiter="\t", quote_char=False,
                                               double_quote=False, escape_char=False,
                                               newlines_in_values=False),
                convert_options=csv.ConvertOptions(
                    column_types={n: pa.string() for n in names}, null_values=["\\N"],
                    strings_can_be_null=True, include_columns=names[:-1]))
        except pa.ArrowInvalid as e:
            raise ValueError(f"the lines are not result rows of {len(self.columns) - 4} "
                             f"declared columns: {e}") from None
        return table.combine_chunks()

    def typed(self, strings, declared_type: str, exact: Callable, table):
        """One column of strings as its Arrow type: a C++ cast; where that refuses a value,
        a decimal rounded in C++ (_rounded), a timestamp's odd rows (a far Kafka
        timestamp) or else the whole column read by the exact per-field rules."""
        import pyarrow as pa
        import pyarrow.compute as pc

        strings = strings.chunk(0) if strings.num_chunks == 1 else strings.combine_chunks()
        if declared_type == "string":
            slashed = pc.fill_null(pc.match_substring(strings, "\\"), False)
            if not pc.any(slashed).as_py():
                return strings
            fixed = [unescape(s) for s in pc.filter(strings, slashed).to_pylist()]
            return pc.replace_with_mask(strings, slashed, pa.array(fixed, pa.string()))
        if declared_type == "boolean":
            return pc.equal(strings, "t")
        target = arrow_type(declared_type)
        refused = (pa.ArrowInvalid, pa.ArrowNotImplementedError)
        try:
            # A cast that refuses a value costs as much as three that do not: a sample
            # first, so that a column needing a fallback (a decimal of floats) skips it.
            pc.cast(strings.slice(0, _SAMPLE), target)
            return pc.cast(strings, target)
        except refused:
            pass
        try:
            if pa.types.is_decimal(target):
                return _rounded(strings, target, pa, pc)
            if declared_type == "timestamp":  # only the odd rows field by field
                odd = pc.invert(pc.fill_null(pc.match_substring_regex(strings, _ISO), True))
                values = self._instants(pc.filter(strings, odd), table, odd)
                ordinary = pc.cast(pc.if_else(odd, None, strings), target)
                return pc.replace_with_mask(ordinary, odd, values)
        except refused:
            pass
        if declared_type == "timestamp":
            return self._instants(strings, table)
        return pa.array([None if s is None else exact(s) for s in strings.to_pylist()],
                        target)

    def _instants(self, strings, table, rows=None):
        """Timestamps read field by field (micros); raises Unrepresentable for one that
        timestamp[us] cannot hold. ``rows``: where ``strings`` are in the batch (a mask),
        None for all of it."""
        import pyarrow as pa

        values = [None if s is None else micros(s) for s in strings.to_pylist()]
        try:
            return pa.array(values, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        except OverflowError:
            bad = next(i for i, v in enumerate(values)
                       if v is not None and not -_INT64 <= v < _INT64)
            if rows is not None:
                table = table.filter(rows)
            topic = unescape(table.column(0)[bad].as_py())
            partition, offset = (int(table.column(c)[bad].as_py()) for c in (1, 2))
            raise Unrepresentable(
                f"topic {topic} partition {partition} offset {offset}: timestamp "
                f"{strings[bad].as_py()} is beyond what Spark's timestamp holds (about year "
                "294247)", topic, partition, offset) from None
