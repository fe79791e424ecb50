"""Range splitting: every planned offset in exactly one read task."""

import pytest

from pipeline.plan.offsets import OffsetRange
from pipeline.plan.split import pack_ranges, split_ranges


def covered(pieces):
    return sorted((p.topic, p.partition, o) for p in pieces
                  for o in range(p.from_offset, p.until_offset))


def test_one_big_partition_is_split_so_every_slot_works():
    r = OffsetRange("t", 0, 100, 1_000_100)
    pieces = split_ranges([r], 4, min_offsets=1000, waves=1)
    assert len(pieces) == 4
    assert [p.count for p in pieces] == [250_000] * 4
    assert pieces[0].from_offset == 100 and pieces[-1].until_offset == 1_000_100
    assert all(a.until_offset == b.from_offset for a, b in zip(pieces, pieces[1:], strict=False))


def test_pieces_cover_each_offset_exactly_once_and_stay_in_order():
    ranges = [OffsetRange("b", 1, 0, 7), OffsetRange("a", 0, 5, 1003),
              OffsetRange("a", 2, 10, 10), OffsetRange("a", 1, 0, 333)]
    pieces = split_ranges(ranges, 5, min_offsets=50, max_offsets=200)
    assert covered(pieces) == covered(ranges)
    assert pieces == sorted(pieces)
    assert max(p.count for p in pieces) <= 200
    assert all(p.count > 0 for p in pieces)
    sizes = [p.count for p in pieces if p.tp == ("a", 0)]
    assert max(sizes) - min(sizes) <= 1


def test_each_slot_gets_several_waves_of_tasks_so_publishing_overlaps_reading():
    ranges = [OffsetRange("t", p, 0, 500_000) for p in range(4)]
    pieces = split_ranges(ranges, 2, min_offsets=1000, waves=4)
    assert len(pieces) == 8 and {p.count for p in pieces} == {250_000}
    assert covered(pieces) == covered(ranges)


def test_small_ranges_are_not_split_below_the_minimum():
    ranges = [OffsetRange("t", p, 0, 30) for p in range(3)]
    assert split_ranges(ranges, 8, min_offsets=100) == ranges
    assert split_ranges([], 8) == []


def test_no_piece_exceeds_the_maximum_even_with_one_slot():
    pieces = split_ranges([OffsetRange("t", 0, 0, 10_001)], 1, min_offsets=10,
                          max_offsets=1000)
    assert len(pieces) == 11 and max(p.count for p in pieces) <= 1000


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        split_ranges([OffsetRange("t", 0, 0, 10)], 0)
    with pytest.raises(ValueError):
        split_ranges([OffsetRange("t", 0, 0, 10)], 2, waves=0)


# ---- packing small ranges into few Spark tasks ----------------------------------------------
def flat(groups):
    return [p for g in groups for p in g]


def test_many_small_partitions_are_read_by_one_task_per_slot_not_one_per_partition():
    ranges = [OffsetRange("t", p, 0, 100) for p in range(200)]
    groups = pack_ranges(split_ranges(ranges, 2), 2)
    assert len(groups) == 2
    assert [sum(p.count for p in g) for g in groups] == [10_000, 10_000]
    assert sorted(flat(groups)) == ranges  # every range once, none split or merged


def test_packing_keeps_every_offset_in_exactly_one_task():
    ranges = [OffsetRange("b", 1, 0, 7), OffsetRange("a", 0, 5, 1003),
              OffsetRange("a", 2, 10, 10), OffsetRange("a", 1, 0, 333),
              *(OffsetRange("c", p, 40, 40 + 3 * p + 1) for p in range(50))]
    groups = pack_ranges(split_ranges(ranges, 3, min_offsets=50, max_offsets=200), 3,
                         min_offsets=50, max_offsets=200)
    assert covered(flat(groups)) == covered(ranges)
    assert all(g == sorted(g) for g in groups)
    assert all(len({p.tp for p in g}) == len(g) for g in groups)  # a partition once per task


def test_big_pieces_keep_a_task_each_as_split_ranges_planned():
    ranges = [OffsetRange("t", p, 0, 500_000) for p in range(4)]
    pieces = split_ranges(ranges, 2, min_offsets=1000, waves=4)
    assert pack_ranges(pieces, 2, min_offsets=1000, waves=4) == [[p] for p in pieces]


def test_no_task_reads_more_than_the_largest_piece_or_the_target():
    # Three pieces of 300k, target 500k: two groups by count, but 600k in one would break
    # the bound on what a retried task re-reads.
    pieces = [OffsetRange("t", p, 0, 300_000) for p in range(3)]
    groups = pack_ranges(pieces, 1, waves=1)
    assert max(sum(p.count for p in g) for g in groups) <= 500_000
    assert sorted(flat(groups)) == pieces


def test_a_big_range_and_a_trickle_on_the_others_balance_the_slots():
    pieces = [OffsetRange("t", 0, 0, 60_000), *(OffsetRange("t", p, 0, 10)
                                                 for p in range(1, 65))]
    groups = pack_ranges(pieces, 2)
    assert len(groups) == 2
    assert groups[0] == [OffsetRange("t", 0, 0, 60_000)]  # alone: the trickle goes beside it
    assert sorted(flat(groups)) == sorted(pieces)


def test_packing_is_deterministic_whatever_the_input_order():
    pieces = [OffsetRange("t", p, 0, 1 + (p * 7919) % 97) for p in range(120)]
    groups = pack_ranges(pieces, 4)
    assert pack_ranges(list(reversed(pieces)), 4) == groups
    assert groups == sorted(groups, key=lambda g: g[0])


def test_packing_fewer_pieces_than_slots_gives_one_task_each_and_nothing_for_nothing():
    pieces = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 3, 3)]
    assert pack_ranges(pieces, 8) == [[OffsetRange("t", 0, 0, 5)]]
    assert pack_ranges([], 8) == []
    with pytest.raises(ValueError):
        pack_ranges(pieces, 0)
