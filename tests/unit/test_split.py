"""Range splitting: every planned offset in exactly one read task."""

import pytest

from pipeline.offsets import OffsetRange
from pipeline.split import split_ranges


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
