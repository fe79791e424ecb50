"""Planned ranges around the records Spark's Kafka source cannot read: pure planning, no I/O.

Spark's Kafka source turns each record's timestamp (epoch ms) into int64 microseconds
itself, with an overflow check: a record past SPARK_MAX_MS fails the read, every run, before
our code sees it. Such records are read on the driver instead (driver/far_timestamps.py),
and the source reads the planned ranges around them: ``layers`` cuts each range at those
offsets, and one read per layer (explicit starting and ending offsets per partition) covers
every other offset exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pipeline.plan.offsets import OffsetRange, TopicPartition, subtract_ranges

# The largest Kafka timestamp (ms) Spark's source can hold as int64 microseconds.
SPARK_MAX_MS = (2**63 - 1) // 1000


def segments(r: OffsetRange, skipped: Iterable[int]) -> list[OffsetRange]:
    """``r`` minus the ``skipped`` offsets, as its non-empty pieces in offset order.
    Offsets outside ``r`` are ignored."""
    return subtract_ranges([r], [OffsetRange(r.topic, r.partition, o, o + 1) for o in skipped])


def layers(ranges: Iterable[OffsetRange],
           skipped: Mapping[TopicPartition, Iterable[int]]) -> list[list[OffsetRange]]:
    """The ranges minus the skipped offsets, as reads of at most one range per partition:
    layer i holds the i-th piece of every range cut into more than i pieces. With nothing
    skipped, one layer: the ranges themselves (empty ranges left out)."""
    cut = [segments(r, skipped.get(r.tp, ())) for r in sorted(ranges)]
    depth = max((len(pieces) for pieces in cut), default=0)
    return [[pieces[i] for pieces in cut if len(pieces) > i] for i in range(depth)]
