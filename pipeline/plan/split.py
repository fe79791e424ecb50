"""Planned ranges -> read tasks: pure range splitting, no I/O.

A planned range is what a run must read of one partition; a read task is what one Spark
task reads. Splitting lets every executor core work even when one partition holds the whole
backlog, and bounds what a retried task re-reads. Offsets follow Kafka's convention:
``until_offset`` is exclusive, so the pieces of a range are contiguous and disjoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.plan.offsets import OffsetRange

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
                 waves: int = TASKS_PER_SLOT, whole: bool = False) -> list[OffsetRange]:
    """Split ``ranges`` into about ``slots * waves`` pieces when they span enough offsets
    (each piece >= ``min_offsets``) and into pieces of at most ``max_offsets``.

    Every offset of every range is in exactly one piece; pieces of one range are equal in
    size to within one offset; the order is (topic, partition, from_offset).

    ``whole``: no range is split (a pipeline that keeps source transactions whole: one
    task summarises a partition's range, so that a change written twice counts once in
    it, executor/segments.py); the non-empty ranges in that order."""
    if slots < 1 or waves < 1 or min_offsets < 1 or max_offsets < min_offsets:
        raise ValueError(f"bad split: slots={slots} waves={waves} min={min_offsets} "
                         f"max={max_offsets}")
    total = sum(r.count for r in ranges)
    if total == 0:
        return []
    if whole:
        return sorted(r for r in ranges if r.count > 0)
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


def pack_ranges(pieces: Sequence[OffsetRange], slots: int, *,
                min_offsets: int = MIN_OFFSETS_PER_TASK,
                max_offsets: int = MAX_OFFSETS_PER_TASK,
                waves: int = TASKS_PER_SLOT) -> list[list[OffsetRange]]:
    """Read tasks (``split_ranges``' pieces) -> Spark tasks: small pieces packed together,
    so that a run's fixed cost per task (a Python worker, a Kafka consumer and its metadata,
    a Postgres connection and staging transaction) is paid per task, not per partition. A
    topic of 200 partitions with a few records each is read by about ``slots`` tasks, not
    200.

    As many groups as ``split_ranges`` would aim for (about ``total / target`` offsets each,
    the target clamped to [``min_offsets``, ``max_offsets``]), but at least ``slots`` (every
    core works) and at most one per piece. Pieces go largest first into the emptiest group
    (ties: the lowest group index), and a piece that would push a non-empty group past
    ``max(target, largest piece)`` opens a new group, so no task (and no retried task)
    reads more than a piece of ``split_ranges`` would. Deterministic: the same pieces give
    the same groups in the same order. Each group lists its pieces in (topic, partition,
    from_offset) order; the groups are ordered by their first piece."""
    if slots < 1 or waves < 1 or min_offsets < 1 or max_offsets < min_offsets:
        raise ValueError(f"bad packing: slots={slots} waves={waves} min={min_offsets} "
                         f"max={max_offsets}")
    pieces = [p for p in pieces if p.count > 0]
    if not pieces:
        return []
    total = sum(p.count for p in pieces)
    target = min(max(-(-total // (slots * waves)), min_offsets), max_offsets)
    capacity = max(target, max(p.count for p in pieces))
    n = min(len(pieces), max(slots, -(-total // target)))
    groups: list[list[OffsetRange]] = [[] for _ in range(n)]
    loads = [0] * n
    # Largest first; equal sizes in range order, so the result does not depend on the input
    # order.
    for p in sorted(pieces, key=lambda p: (-p.count, p)):
        i = min(range(len(groups)), key=lambda g: (loads[g], g))
        if groups[i] and loads[i] + p.count > capacity:
            groups.append([])
            loads.append(0)
            i = len(groups) - 1
        groups[i].append(p)
        loads[i] += p.count
    return sorted((sorted(g) for g in groups if g), key=lambda g: g[0])
