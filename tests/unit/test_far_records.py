from pipeline.plan.far_records import SPARK_MAX_MS, layers, segments
from pipeline.plan.offsets import OffsetRange


def r(p, a, b, t="t"):
    return OffsetRange(t, p, a, b)


def test_the_limit_is_the_largest_ms_whose_microseconds_fit_a_long():
    assert SPARK_MAX_MS * 1000 <= 2**63 - 1 < (SPARK_MAX_MS + 1) * 1000


def test_nothing_skipped_is_one_layer_of_the_ranges():
    assert layers([r(1, 0, 5), r(0, 3, 4)], {}) == [[r(0, 3, 4), r(1, 0, 5)]]


def test_a_skipped_offset_splits_its_range_in_two_layers():
    assert layers([r(0, 0, 10), r(1, 0, 4)], {("t", 0): [5]}) == [
        [r(0, 0, 5), r(1, 0, 4)], [r(0, 6, 10)]]


def test_skipped_offsets_at_the_ends_adjacent_and_outside_leave_no_empty_piece():
    assert segments(r(0, 0, 10), [0, 3, 4, 9, 12, 4]) == [r(0, 1, 3), r(0, 5, 9)]
    assert segments(r(0, 2, 3), [2]) == []
    assert layers([r(0, 2, 3), r(1, 0, 2)], {("t", 0): [2]}) == [[r(1, 0, 2)]]


def test_layers_cover_every_offset_but_the_skipped_exactly_once():
    ranges = [r(0, 0, 20), r(1, 5, 9), r(2, 0, 3)]
    skipped = {("t", 0): [1, 7, 8, 19], ("t", 1): [5, 6]}
    got = layers(ranges, skipped)
    for layer in got:
        assert len({x.tp for x in layer}) == len(layer)  # one range per partition per read
    covered = sorted((x.partition, o) for layer in got for x in layer
                     for o in range(x.from_offset, x.until_offset))
    expected = sorted((x.partition, o) for x in ranges
                      for o in range(x.from_offset, x.until_offset)
                      if o not in skipped.get(x.tp, ()))
    assert covered == expected
