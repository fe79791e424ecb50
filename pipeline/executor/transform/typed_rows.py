"""The Encoder's output for one batch -> a typed Arrow batch of the result columns, the
input a user transform receives (feed.py), and the batch's dead letters.

A text format's (json, avro, protobuf) rows are COPY text, read into typed Arrow columns
in Arrow's C++ (arrow_rows.RowReader: exact, the values Postgres would store); the
feed (``feed_converter``) skips the text for a json batch, whose values the Encoder hands
over as columns (arrow_columns.py: the same batch, ~0.6 us a record less). The
raw format's rows are COPY binary: its columns are built from the
records themselves, less those the Encoder refused. A record whose Kafka timestamp Postgres
can store but Spark cannot hold (int64 microseconds) becomes a dead letter
``timestamp_out_of_range`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipeline.formats.dead_letters import dead_line
from pipeline.formats.wire.text import headers_plain, text

FAR = "timestamp_out_of_range"
# The largest Kafka timestamp (ms) Spark can hold as int64 microseconds (TimestampType);
# Postgres holds a little more (timestamps.PG_END_MS).
SPARK_MAX_MS = (2**63 - 1) // 1000


def converter(fmt: str, columns: Sequence[Sequence], pa) -> Callable:
    """``convert(topic, partition, records, encoded)`` -> (RecordBatch, dead lines): the
    batch's good records as result columns (feed.feed_schema) and every dead
    letter (the Encoder's, and records too far in time for Spark)."""

    from pipeline.executor.transform.arrow_rows import RowReader

    reader = None if fmt == "raw" else RowReader(columns)
    ts = pa.timestamp("us", tz="UTC")

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
        if max((m.timestamp()[1] for m in records), default=0) > SPARK_MAX_MS:
            good = {int(r.split("\t", 3)[2]) for r in rows}
            kept = [m for m in records if m.offset() in good]
            far = far_dead(f"{text(topic)}\t{partition}\t", kept,
                           [m.timestamp()[1] for m in kept], dead)
            rows = [r for r in rows if int(r.split("\t", 3)[2]) not in far]
        return reader.batch(rows), dead

    return convert_raw if fmt == "raw" else convert_text


def feed_converter(encoder, fmt: str, columns: Sequence[Sequence], pa) -> Callable:
    """``convert(topic, partition, records)`` -> (RecordBatch, dead lines), as
    ``converter`` over ``encoder.encode``'s output, with the same batch and dead letters.
    A json batch skips the COPY text lines: its values go to Arrow as columns
    (Encoder.columns, arrow_columns.py); a batch that has no such form (another
    format, a json sink with wide decimals) or raised goes through the lines."""
    from pipeline.executor.transform.arrow_columns import column_batch
    from pipeline.executor.transform.arrow_rows import RowReader

    lines = converter(fmt, columns, pa)
    reader = None if fmt == "raw" else RowReader(columns)

    def convert(topic, partition, records):
        encoded = encoder.columns(topic, partition, records)
        if encoded is None:
            return lines(topic, partition, records, encoder.encode(topic, partition, records))
        dead = list(encoded.dead)
        values = encoded.rows
        millis = values[1]
        if max(millis, default=0) > SPARK_MAX_MS:
            by_offset = {m.offset(): m for m in records}
            far = far_dead(f"{text(topic)}\t{partition}\t",
                           [by_offset[o] for o in values[0]], millis, dead)
            keep = [o not in far for o in values[0]]
            values = [[v for v, k in zip(column, keep, strict=True) if k]
                      for column in values]
        return column_batch(reader, topic, partition, values, pa), dead

    return convert


def far_dead(head: str, records, millis, dead: list) -> set[int]:
    """Good records Spark cannot hold: dead letters appended to ``dead``; returns the
    offsets to drop."""
    far = set()
    for m, ms in zip(records, millis, strict=True):
        if ms is not None and ms > SPARK_MAX_MS:
            far.add(m.offset())
            dead.append(dead_line(head, m, FAR, far_message(ms)))
    return far


def far_message(millis: int) -> str:
    """A record Postgres could store but Spark cannot hold (int64 microseconds)."""
    return (f"Kafka timestamp {millis} ms is outside what Spark can read (up to "
            f"{SPARK_MAX_MS} ms, int64 microseconds); a producer that sent micro- or "
            "nanoseconds as milliseconds?")
