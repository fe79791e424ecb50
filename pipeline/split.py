"""Planned ranges -> read tasks: pure range splitting, no I/O.

A planned range is what a run must read of one partition; a read task is what one Spark
task reads. Splitting lets every executor core work even when one partition holds the whole
backlog, and bounds what a retried task re-reads. Offsets follow Kafka's convention:
``until_offset`` is exclusive, so the pieces of a range are contiguous and disjoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.offsets import OffsetRange

# Below this, a piece costs more in task overhead (a consumer, a connection) than it saves.
MIN_OFFSETS_PER_TASK = 50_000
# A retried task re-reads at most this many offsets, and the publisher waits at most for
# this many before it can COPY a task's rows.
MAX_OFFSETS_PER_TASK = 500_000
# Tasks per executor core: the publisher COPYs the first wave's rows while later waves
# read, and a slow task delays the end less. 2M records, 2 cores: 4 tasks of 500k 19.8 s,
# 8 of 250k 17.8 s, 16 of 125k 21.5 s (per-task consumer start; docs/benchmarks.md).
TASKS_PER_SLOT = 4


def split_ranges(ranges: Sequence[OffsetRange], slots: int, *,
                 min_offsets: int = MIN_OFFSETS_PER_TASK,
                 max_offsets: int = MAX_OFFSETS_PER_TASK,
                 waves: int = TASKS_PER_SLOT) -> list[OffsetRange]:
    """Split ``ranges`` into about ``slots * waves`` pieces when they span enough offsets
    (each piece >= ``min_offsets``) and into pieces of at most ``max_offsets``.

    Every offset of every range is in exactly one piece; pieces of one range are equal in
    size to within one offset; the order is (topic, partition, from_offset)."""
    if slots < 1 or waves < 1 or min_offsets < 1 or max_offsets < min_offsets:
        raise ValueError(f"bad split: slots={slots} waves={waves} min={min_offsets} "
                         f"max={max_offsets}")
    total = sum(r.count for r in ranges)
    if total == 0:
        return []
    target = min(max(-(-total // (slots * waves)), min_offsets), max_offsets)
    pieces: list[OffsetRange] = []
    for r in sorted(ranges):
        if r.count == 0:
            continue
        n = -(-r.count // target)
        size, extra = divmod(r.count, n)
        start = r.from_offset
        for i in range(n):
            until = start + size + (1 if i < extra else 0)
            pieces.append(OffsetRange(r.topic, r.partition, start, until))
            start = until
    return pieces
