"""A read range's summary by source transaction (executor/segments.py) and how the driver
reads it back (store/segments.py): segments, distinct events, and the ledger row of a
range cut at a segment's start; no Kafka, no Postgres."""

from __future__ import annotations

import pytest

from pipeline.executor.content_hash import ContentHash
from pipeline.executor.segments import RangeSegments
from pipeline.executor.segments import summary as read_back
from pipeline.plan.offsets import OffsetRange
from pipeline.plan.split import pack_ranges, split_ranges
from pipeline.plan.transactions import Segment, TransactionEnd, cut_at_transactions
from pipeline.store.segments import StagedRange, read_partitions
from tests.unit.test_encode import Record

R = OffsetRange("shop.public.orders", 0, 10, 20)


def staged(summary: RangeSegments, r: OffsetRange = R) -> StagedRange:
    """What store.segments.staged_ranges makes of the range's two staged summaries."""
    segments, events, *_ = read_back(summary.blob())
    from pipeline.plan.transactions import ReadPartition

    return StagedRange(ReadPartition(r, tuple(Segment(t, a, b) for t, a, b, _, _ in segments),
                                     events),
                       {a: (n, d) for _, a, _, n, d in segments}, summary.hash.records,
                       summary.hash.digest())


def records_and_sources():
    # offsets 10..19: a snapshot read, transaction 5 (orders 1, 2), a tombstone, 6 (1),
    # then after a connector's restart 5 again (2) and 6 again (1), then 7 (1).
    spec = [(10, None), (11, ("5", 1)), (12, ("5", 2)), (13, None), (14, ("6", 1)),
            (15, ("5", 2)), (16, ("6", 1)), (17, ("7", 1)), (18, ("7", 2)), (19, None)]
    return ([Record(o, f"v{o}".encode(), k=b"k", ts=1_000 + o) for o, _ in spec],
            [s for _, s in spec])


def test_changes_read_again_in_a_range_are_marked_with_the_tombstone_after_their_delete():
    # 5 deletes k1 (20, its tombstone 21) and updates k2 (22); Connect restarts and writes
    # 5 again (23-25), then 6 (26) and a tombstone of another key (27).
    spec = [(20, b"k1", b"d", ("5", 1)), (21, b"k1", None, None), (22, b"k2", b"u", ("5", 2)),
            (23, b"k1", b"d", ("5", 1)), (24, b"k1", None, None), (25, b"k2", b"u", ("5", 2)),
            (26, b"k3", b"c", ("6", 1)), (27, b"k4", None, None)]
    summary = RangeSegments()
    summary.add([Record(o, v, k=k) for o, k, v, _ in spec[:4]], [s for *_, s in spec[:4]])
    summary.add([Record(o, v, k=k) for o, k, v, _ in spec[4:]], [s for *_, s in spec[4:]])
    assert read_back(summary.blob()).replayed == ((23, 25),)
    segments, events, *_ = read_back(summary.blob())
    # A delete's tombstone is in its segment: published, or left out, with it.
    assert [(t, a, b) for t, a, b, _, _ in segments] == [("5", 20, 25), ("6", 26, 26),
                                                       (None, 27, 27)]
    assert events == {"5": 2, "6": 1}


def test_segments_are_runs_of_one_transaction_with_what_came_before_them():
    records, sources = records_and_sources()
    summary = RangeSegments()
    summary.add(records[:4], sources[:4])  # two batches: a segment never ends at one
    summary.add(records[4:], sources[4:])
    segments, events, *_ = read_back(summary.blob())
    assert [(t, a, b, n) for t, a, b, n, _ in segments] == [
        (None, 10, 10, 0), ("5", 11, 12, 1), (None, 13, 13, 3), ("6", 14, 14, 4),
        ("5", 15, 15, 5), ("6", 16, 16, 6), ("7", 17, 18, 7), (None, 19, 19, 9)]
    # Distinct events by their order in their table: a change written twice counts once.
    assert events == {"5": 2, "6": 1, "7": 2}
    # Each transaction's first Kafka timestamp: how long one without an END has waited.
    assert read_back(summary.blob()).started == {"5": records[1].ts, "6": records[4].ts,
                                       "7": records[7].ts}
    for _, first, _, before, digest in segments:
        h = ContentHash()
        h.add(records[:first - 10])
        assert (before, digest) == (h.records, h.digest())
    whole = ContentHash()
    whole.add(records)
    assert summary.hash.digest() == whole.digest() and summary.hash.records == 10


def test_the_ledger_row_of_a_cut_range_is_its_records_before_the_cut():
    records, sources = records_and_sources()
    summary = RangeSegments()
    summary.add(records, sources)
    s = staged(summary)
    ends = [TransactionEnd("5", 0, {"public.orders": 2}), TransactionEnd("6", 1,
                                                                        {"public.orders": 1})]
    cut = cut_at_transactions(ends, [s.read], lambda c: "shop.public.orders")
    assert cut.until == {R.tp: 17} and cut.unended == ("7",)
    before = ContentHash()
    before.add(records[:7])
    assert s.ledger_at(17) == (7, before.digest())
    assert s.ledger_at(20) == (10, summary.hash.digest())
    assert s.ledger_at(10) == (0, ContentHash().digest())
    with pytest.raises(ValueError, match="12 is not where a segment starts"):
        s.ledger_at(12)


def test_read_partitions_lists_every_planned_partition_empty_ones_too():
    records, sources = records_and_sources()
    summary = RangeSegments()
    summary.add(records, sources)
    quiet = OffsetRange("shop.public.lines", 0, 4, 4)
    read = read_partitions({R.tp: staged(summary)}, [R, quiet])
    assert read[0].events == {"5": 2, "6": 1, "7": 2}
    assert read[1].range == quiet and read[1].segments == ()
    with pytest.raises(ValueError, match=r"shop.public.orders\[0\] \[10, 20\) was planned"):
        read_partitions({}, [R])


def test_a_pipeline_keeping_transactions_whole_reads_each_partition_in_one_task():
    big = OffsetRange("t", 0, 0, 2_000_000)
    assert len(split_ranges([big], 4)) > 1
    whole = split_ranges([big, OffsetRange("t", 1, 5, 5), OffsetRange("s", 0, 0, 3)], 4,
                         whole=True)
    assert whole == [OffsetRange("s", 0, 0, 3), big]
    assert sorted(r for g in pack_ranges(whole, 4) for r in g) == whole
