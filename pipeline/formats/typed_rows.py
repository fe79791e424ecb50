"""The Encoder's output for one batch -> a typed Arrow batch of the result columns, the
input a user transform receives (executor/feed.py), and the batch's dead letters.

A text format's (json, avro, protobuf) rows are COPY text: each column's fields become one
Arrow string array, cast to the column's Arrow type in one call (a field the cast cannot
read falls back to Python's reading of that column: the text is exact, it is what Postgres
would parse). The raw format's rows are COPY binary: its columns are built from the
records themselves, less those the Encoder refused. A record whose Kafka timestamp Postgres
can store but Spark cannot hold (int64 microseconds) becomes a dead letter
``timestamp_out_of_range`` here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal

from pipeline.formats import paths
from pipeline.formats.copy_text import NULL, headers_plain, text
from pipeline.formats.dead_letters import dead_line
from pipeline.formats.types import column_type

_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPED = re.compile(r"\\(.)")
FAR = "timestamp_out_of_range"
# The largest Kafka timestamp (ms) Spark can hold as int64 microseconds (TimestampType);
# Postgres holds a little more (timestamps.PG_END_MS).
SPARK_MAX_MS = (2**63 - 1) // 1000


def unescape(field: str) -> str:
    """A COPY text field's string (copy_text.text undone)."""
    if "\\" not in field:
        return field
    return _ESCAPED.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), field)


def arrow_type(declared: str, pa):
    """A declared scalar column's Arrow type (Spark's, as mapInArrow takes it)."""
    t = column_type(declared)
    if not t.scalar:
        raise ValueError(f"column type {declared} is not given to a transform")
    if t.precision is not None:
        return pa.decimal128(t.precision, t.scale)
    return {"string": pa.string(), "long": pa.int64(), "int": pa.int32(),
            "double": pa.float64(), "boolean": pa.bool_(),
            "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}[declared]


def _python_reader(declared: str) -> Callable[[str], object]:
    """A COPY text field the Encoder wrote for a column of ``declared`` -> its value."""
    t = column_type(declared)
    if t.precision is not None:
        # The Encoder writes a number as JSON had it ("1.005", "1e-07"): Postgres rounds it
        # half away from zero to the column's scale on COPY, and so does this.
        quantum = Decimal(1).scaleb(-t.scale)
        return lambda f: Decimal(f).quantize(quantum, rounding=ROUND_HALF_UP)
    return {"string": unescape, "long": int, "int": int, "double": float,
            "boolean": lambda f: f == "t", "timestamp": datetime.fromisoformat,
            "date": date.fromisoformat}[declared]


def text_column(fields: Sequence[str], declared: str, pa, pc):
    """One column's COPY text fields -> its typed Arrow array."""
    t = arrow_type(declared, pa)
    raw = pa.array(fields, pa.string())
    nulls = pc.equal(raw, NULL)
    if pc.any(nulls).as_py():
        raw = pc.if_else(nulls, pa.scalar(None, pa.string()), raw)
    if declared == "boolean":
        return pc.equal(raw, "t")
    if declared == "string":
        if not pc.any(pc.match_substring(raw, "\\")).as_py():
            return raw
    else:
        try:
            return raw.cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # a form the cast does not read: Python's reading of the text
    read = _python_reader(declared)
    return pa.array([None if f == NULL else read(f) for f in fields], type=t)


def converter(fmt: str, columns: Sequence[Sequence], pa) -> Callable:
    """``convert(topic, partition, records, encoded)`` -> (RecordBatch, dead lines): the
    batch's good records as result columns (executor/feed.feed_schema) and every dead
    letter (the Encoder's, and records too far in time for Spark)."""
    import pyarrow.compute as pc

    declared = [(n, t) for n, t, _, _ in paths.columns(columns)]
    ts = pa.timestamp("us", tz="UTC")

    def far_dead(head, records, millis, dead):
        """Good records Spark cannot hold: dead letters; returns the offsets to drop."""
        far = set()
        for m, ms in zip(records, millis, strict=True):
            if ms is not None and ms > SPARK_MAX_MS:
                far.add(m.offset())
                dead.append(dead_line(head, m, FAR, far_message(ms)))
        return far

    def convert_raw(topic, partition, records, encoded):
        dead = list(encoded.dead)
        refused = {int(line.split("\t", 3)[2]) for line in dead}
        head = f"{text(topic)}\t{partition}\t"
        millis = [m.timestamp()[1] for m in records]
        if max(millis, default=0) > SPARK_MAX_MS:
            refused |= far_dead(head, [m for m in records if m.offset() not in refused],
                                [ms for m, ms in zip(records, millis, strict=True)
                                 if m.offset() not in refused], dead)
        good = [(m, ms) for m, ms in zip(records, millis, strict=True)
                if m.offset() not in refused] if refused else list(zip(records, millis,
                                                                        strict=True))
        n = len(good)
        batch = pa.RecordBatch.from_arrays([
            pa.array([topic] * n, pa.string()), pa.array([partition] * n, pa.int32()),
            pa.array([m.offset() for m, _ in good], pa.int64()),
            pa.array([m.key() for m, _ in good], pa.binary()),
            pa.array([m.value() for m, _ in good], pa.binary()),
            pa.array([headers_plain(h) if (h := m.headers()) else "[]" for m, _ in good],
                     pa.string()),
            pa.array([ms * 1000 for _, ms in good], pa.int64()).cast(ts)],
            names=["topic", "partition", "offset", "key", "value", "headers",
                   "kafka_timestamp"])
        return batch, dead

    def convert_text(topic, partition, records, encoded):
        dead = list(encoded.dead)
        rows = encoded.rows
        head = f"{text(topic)}\t{partition}\t"
        offsets = pa.array([m.offset() for m in records], pa.int64())
        millis = pa.array([m.timestamp()[1] for m in records], pa.int64())
        if pc.max(millis).as_py() is not None and pc.max(millis).as_py() > SPARK_MAX_MS:
            good = set(int(r.split("\t", 3)[2]) for r in rows)
            far = far_dead(head, [m for m in records if m.offset() in good],
                           [m.timestamp()[1] for m in records if m.offset() in good], dead)
            rows = [r for r in rows if int(r.split("\t", 3)[2]) not in far]
        fields = list(zip(*(r[:-1].split("\t") for r in rows), strict=True)) if rows else \
            [() for _ in range(len(declared) + 5)]
        row_offsets = pa.array(fields[2], pa.string()).cast(pa.int64())
        # Each row's Kafka timestamp from its record (rows keep the records' order).
        stamps = pc.take(millis, pc.index_in(row_offsets, value_set=offsets))
        n = len(rows)
        arrays = [pa.array([topic] * n, pa.string()), pa.array([partition] * n, pa.int32()),
                  row_offsets, pc.multiply(stamps, 1000).cast(ts),
                  *(text_column(f, t, pa, pc)
                    for f, (_, t) in zip(fields[4:-1], declared, strict=True))]
        return pa.RecordBatch.from_arrays(
            arrays, names=["topic", "partition", "offset", "kafka_timestamp",
                           *(n_ for n_, _ in declared)]), dead

    return convert_raw if fmt == "raw" else convert_text


def far_message(millis: int) -> str:
    """A record Postgres could store but Spark cannot hold (int64 microseconds)."""
    return (f"Kafka timestamp {millis} ms is outside what Spark can read (up to "
            f"{SPARK_MAX_MS} ms, int64 microseconds); a producer that sent micro- or "
            "nanoseconds as milliseconds?")
