"""pipeline verify's pure reconciliation (driver/reconcile.py): Kafka's offsets vs the
tables', the published ranges from run rows, the split at retention."""

from __future__ import annotations

import pytest

from pipeline.driver.reconcile import chunk_windows, clip, merge, published, reconcile, retained
from pipeline.driver.verdict import INCOMPLETE, MATCH, MISMATCH, verdict, worst
from pipeline.plan.offsets import OffsetRange

R = OffsetRange("t", 0, 0, 10)


def test_every_record_in_exactly_one_table_matches():
    f = reconcile(R, range(10), [0, 1, 2, 4, 5, 6, 7, 8, 9], [3])
    assert f.ok and (f.expected, f.rows, f.dead_letters) == (10, 9, 1)


def test_a_record_in_neither_table_is_missing_with_its_offset():
    f = reconcile(R, range(10), [0, 1, 2, 4, 5, 6, 7, 8], [3])
    assert not f.ok and f.missing == 1 and f.missing_offsets == [9]
    assert (f.unexpected, f.duplicates) == (0, 0)


def test_gaps_kafka_skips_are_fine_unless_a_row_claims_them():
    kafka = [0, 1, 2, 5, 6]  # 3, 4: aborted records and a marker; 7-9: compacted
    assert reconcile(R, kafka, [0, 1, 2, 5], [6]).ok
    f = reconcile(R, kafka, [0, 1, 2, 4, 5], [6, 8])
    assert f.unexpected == 2 and f.unexpected_offsets == [4, 8]
    assert f.rows == 5 and f.dead_letters == 2 and f.expected == 5


def test_in_a_compacted_topic_a_claimed_offset_without_a_record_is_not_compared():
    # The cleaner may have removed its record after it was published: no read tells.
    f = reconcile(R, [0, 1, 2, 5, 6], [0, 1, 2, 4, 5], [6, 8], compacted=True)
    assert f.ok and (f.gone, f.gone_offsets, f.unexpected) == (2, [4, 8], 0)


def test_an_offset_in_both_tables_or_twice_in_one_is_a_duplicate():
    f = reconcile(R, [0, 1, 2], [0, 1, 1], [0, 2])
    assert f.duplicates == 2 and f.duplicate_offsets == [0, 1]
    assert f.missing == f.unexpected == 0


def test_only_the_first_mismatches_are_kept_but_all_are_counted():
    f = reconcile(OffsetRange("t", 0, 0, 1000), range(1000), [], [], keep=3)
    assert f.missing == 1000 and f.missing_offsets == [0, 1, 2]


def test_reconcile_streams_its_inputs_without_holding_them():
    def gen(n):
        yield from range(n)
    f = reconcile(OffsetRange("t", 0, 0, 100_000), gen(100_000), gen(100_000), iter(()))
    assert f.ok and f.rows == 100_000


def test_empty_inputs_are_an_empty_match():
    f = reconcile(R, [], [], [])
    assert f.ok and f.expected == 0


def test_published_is_the_union_of_the_planned_ranges_per_partition():
    plans = [
        [{"topic": "t", "partition": 0, "from": 0, "until": 10},
         {"topic": "t", "partition": 1, "from": 0, "until": 0}],  # nothing read: left out
        [{"topic": "t", "partition": 0, "from": 10, "until": 20}],
        [{"topic": "t", "partition": 0, "from": 5, "until": 8}],  # a reprocess inside
        [{"topic": "t", "partition": 0, "from": 30, "until": 40}],  # after a skip
    ]
    assert published(plans) == {("t", 0): [OffsetRange("t", 0, 0, 20),
                                           OffsetRange("t", 0, 30, 40)]}


def test_ranges_planned_before_a_topic_was_archived_are_not_published_any_more():
    plans = [[{"topic": "t", "partition": 0, "from": 0, "until": 10},
              {"topic": "u", "partition": 0, "from": 0, "until": 5}],
             [{"topic": "t", "partition": 0, "from": 0, "until": 3}]]
    got = published(plans, archived={"t": 5}, runs=[4, 6])
    assert got == {("t", 0): [OffsetRange("t", 0, 0, 3)], ("u", 0): [OffsetRange("u", 0, 0, 5)]}


def test_merge_and_clip():
    rs = [OffsetRange("t", 0, 10, 20), OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 5, 7)]
    assert merge(rs) == [OffsetRange("t", 0, 0, 7), OffsetRange("t", 0, 10, 20)]
    assert list(clip(merge(rs), 6, 15)) == [OffsetRange("t", 0, 6, 7),
                                           OffsetRange("t", 0, 10, 15)]
    assert list(clip(rs, None, None)) == rs
    assert list(clip(rs, 100, None)) == []


def test_windows_hold_at_most_size_published_offsets_and_cover_everything():
    rs = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 20, 23), OffsetRange("t", 0, 30, 31)]
    assert chunk_windows(rs, 0, 100, 4) == [(0, 4), (4, 8), (8, 22), (22, 100)]
    assert chunk_windows(rs, 0, 100, 1000) == [(0, 100)]
    assert chunk_windows([], 5, 9, 4) == [(5, 9)]  # rows no run published are still looked at


@pytest.mark.parametrize(("differs", "not_compared", "skip_lost", "says"), [
    (False, False, False, MATCH), (True, True, False, MISMATCH),
    (False, True, False, INCOMPLETE), (False, True, True, MATCH), (True, False, True, MISMATCH)])
def test_a_match_is_said_only_of_what_was_compared(differs, not_compared, skip_lost, says):
    assert verdict(differs, not_compared, skip_lost) == says


def test_the_whole_has_its_worst_partition_verdict():
    assert worst([MATCH, INCOMPLETE, MATCH]) == INCOMPLETE
    assert worst([INCOMPLETE, MISMATCH]) == MISMATCH and worst([]) == MATCH


@pytest.mark.parametrize(("earliest", "deleted", "kept"), [
    (0, None, (10, 20)), (10, None, (10, 20)), (15, (10, 15), (15, 20)),
    (20, (10, 20), None), (99, (10, 20), None)])
def test_retained_splits_a_range_at_the_earliest_offset(earliest, deleted, kept):
    d, k = retained(OffsetRange("t", 0, 10, 20), earliest)
    assert (d and (d.from_offset, d.until_offset)) == (deleted and deleted)
    assert (k and (k.from_offset, k.until_offset)) == (kept and kept)


@pytest.mark.parametrize(("sink", "says"), [
    ({"mode": "upsert", "key": ["order_id"]}, "reconciles append sinks offset by offset"),
    ({"mode": "aggregate", "group_by": ["customer"], "aggregates": {"n": "count(*)"}},
     "verify_state.py recomputes it"),
    ({"mode": "upsert", "key": ["order_id"], "tombstones": "dead_letter",
      "transform": "tests.integration.transforms.identity:transform"},
     "cannot recompute an upsert table made by the .sink. transform")])
def test_verify_refuses_the_sinks_it_cannot_prove_yet_with_exit_2(sink, says):
    from pipeline.driver.verify import check_supported
    from pipeline.errors import ConfigError
    from tests.helpers import make_settings

    with pytest.raises(ConfigError, match=says) as e:
        check_supported(make_settings("p", ["t"], sink=sink))
    assert e.value.exit_code == 2


def test_verify_takes_an_append_sink_with_a_transform():
    from pipeline.driver.verify import check_supported
    from tests.helpers import make_settings

    check_supported(make_settings(
        "p", ["t"], sink={"transform": "tests.integration.transforms.identity:transform"}))


def test_verify_accepts_an_append_sink():
    from pipeline.driver.verify import check_supported
    from tests.helpers import make_settings

    check_supported(make_settings("p", ["t"]))
