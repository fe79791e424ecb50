"""Planning is pure: these run without Spark, Kafka or Postgres."""

import pytest

from pipeline.errors import DataError
from pipeline.plan.offsets import (
    OffsetRange,
    PartitionOffsets,
    check_topic_ids,
    chunk_ranges,
    plan_backfill,
    plan_ranges,
    share_budget,
    subtract_ranges,
)


def k(topic, partition, earliest, latest):
    return PartitionOffsets(topic, partition, earliest, latest)


def test_range_starts_at_stored_next_offset_and_ends_at_latest():
    plan = plan_ranges({("t", 0): 10}, [k("t", 0, 0, 25)])
    assert plan.ranges == [OffsetRange("t", 0, 10, 25)]
    assert plan.offset_updates[0].stored == 10


def test_new_partition_starts_at_earliest_by_default():
    plan = plan_ranges({("t", 0): 5}, [k("t", 0, 0, 5), k("t", 1, 3, 9)])
    assert plan.ranges == [OffsetRange("t", 1, 3, 9)]
    assert plan.offset_updates[0].stored is None


def test_new_empty_partition_is_not_written_under_earliest():
    plan = plan_ranges({}, [k("t", 0, 4, 4)])
    assert plan.is_empty


def test_new_partition_can_start_at_latest():
    plan = plan_ranges({}, [k("t", 0, 3, 9)], starting_offsets="latest")
    assert plan.ranges == []
    # The first run still records where the partition starts.
    assert [u.range.until_offset for u in plan.offset_updates] == [9]


def test_every_topic_and_partition_is_planned_independently():
    plan = plan_ranges({("a", 0): 2, ("b", 1): 7},
                       [k("a", 0, 0, 4), k("a", 1, 0, 3), k("b", 0, 0, 0), k("b", 1, 0, 9)])
    assert plan.ranges == [OffsetRange("a", 0, 2, 4), OffsetRange("a", 1, 0, 3),
                           OffsetRange("b", 1, 7, 9)]


def test_cap_limits_records_per_partition_per_run():
    plan = plan_ranges({("t", 0): 100}, [k("t", 0, 0, 1000)], max_records_per_partition=50)
    assert plan.ranges == [OffsetRange("t", 0, 100, 150)]


def test_the_run_cap_is_shared_fairly_and_a_quiet_partition_is_not_starved():
    plan = plan_ranges({("t", 0): 0, ("t", 1): 0, ("t", 2): 0},
                       [k("t", 0, 0, 1000), k("t", 1, 0, 10), k("t", 2, 0, 1000)],
                       max_records_per_run=101)
    # 10 for the quiet partition, the rest split between the busy ones (remainder first).
    assert plan.ranges == [OffsetRange("t", 0, 0, 46), OffsetRange("t", 1, 0, 10),
                           OffsetRange("t", 2, 0, 45)]
    assert plan.offset_span == 101


@pytest.mark.parametrize("counts,budget", [
    ([5, 0, 7, 1000, 3], 100), ([1, 1, 1], 2), ([0, 0], 10), ([10**9] * 4, 7), ([3, 4], 1000),
])
def test_share_budget_spends_the_budget_or_everything_and_no_more(counts, budget):
    shares = share_budget(counts, budget)
    assert sum(shares) == min(budget, sum(counts))
    assert all(0 <= s <= c for s, c in zip(shares, counts, strict=True))
    # Max-min fair: a partition below another's share got everything it had.
    for s, c in zip(shares, counts, strict=True):
        assert s == c or s >= max(shares) - 1


def test_a_backlog_is_drained_exactly_by_successive_capped_plans():
    stored: dict = {}
    kafka = [k("t", p, 0, n) for p, n in enumerate([700, 5, 300])]
    read = {p: [] for p in range(3)}
    runs = 0
    while not (plan := plan_ranges(stored, kafka, max_records_per_partition=60,
                                   max_records_per_run=100)).is_empty:
        runs += 1
        assert runs < 50 and plan.offset_span <= 100
        for r in plan.ranges:
            assert r.count <= 60
            read[r.partition].append((r.from_offset, r.until_offset))
        stored.update({u.range.tp: u.range.until_offset for u in plan.offset_updates})
    assert runs >= 12  # 700 records of partition 0, at most 60 a run
    for p, n in enumerate([700, 5, 300]):
        assert read[p][0][0] == 0 and read[p][-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(read[p], read[p][1:], strict=False))


def drain(stored: dict, kafka, **caps) -> list[set[int]]:
    """Plan and 'commit' successive runs purely; per run, the partitions that advanced."""
    advanced = []
    while not (plan := plan_ranges(stored, kafka, **caps)).is_empty:
        assert len(advanced) < 1000
        advanced.append({r.partition for r in plan.ranges})
        stored.update({u.range.tp: u.range.until_offset for u in plan.offset_updates})
    return advanced


def test_a_run_cap_below_the_backlogged_partitions_starves_none_of_them():
    """4 partitions x 10 records, 2 records a run: every partition advances within
    ceil(4 / 2) = 2 runs, and after 8 runs every partition holds 4 (not 0=8, 1=8)."""
    stored: dict = {}
    kafka = [k("t", p, 0, 10) for p in range(4)]
    advanced = drain(stored, kafka, max_records_per_run=2)
    assert len(advanced) == 20 and stored == {("t", p): 10 for p in range(4)}
    for i in range(len(advanced) - 1):
        assert advanced[i] | advanced[i + 1] == {0, 1, 2, 3}, (i, advanced)
    after_8: dict = {}
    for _ in range(8):
        plan = plan_ranges(after_8, kafka, max_records_per_run=2)
        after_8.update({u.range.tp: u.range.until_offset for u in plan.offset_updates})
    assert after_8 == {("t", p): 4 for p in range(4)}


@pytest.mark.parametrize("seed", range(40))
def test_every_backlogged_partition_advances_within_ceil_partitions_over_budget_runs(seed):
    """Property, on random backlogs, caps and stored offsets (records keep arriving): a
    partition with a backlog advances within ceil(partitions / budget) runs."""
    import random

    rnd = random.Random(seed)
    n = rnd.randint(1, 9)
    budget = rnd.randint(1, n + 2)
    per_partition = rnd.choice([0, 0, 1, 3])
    latest = [rnd.randint(0, 30) for _ in range(n)]
    stored = {("t", p): rnd.randint(0, latest[p]) for p in range(n) if rnd.random() < 0.8}
    bound = -(-n // budget)
    waiting: dict[int, int] = {}  # partition -> runs it has had a backlog without advancing
    for _ in range(200):
        if rnd.random() < 0.3:  # new records arrive
            latest[rnd.randrange(n)] += rnd.randint(1, 5)
        kafka = [k("t", p, 0, latest[p]) for p in range(n)]
        plan = plan_ranges(stored, kafka, max_records_per_run=budget,
                           max_records_per_partition=per_partition)
        moved = {r.partition for r in plan.ranges}
        for p in range(n):
            backlog = latest[p] > stored.get(("t", p), 0)
            waiting[p] = 0 if (p in moved or not backlog) else waiting.get(p, 0) + 1
            assert waiting[p] < bound, (p, waiting, n, budget)
        stored.update({u.range.tp: u.range.until_offset for u in plan.offset_updates})


def test_the_plan_is_the_same_for_the_same_stored_offsets():
    """The rotation derives from the stored state: a dry run shows the run that follows."""
    kafka = [k("t", p, 0, 10) for p in range(4)]
    stored = {("t", 0): 3, ("t", 1): 2, ("t", 2): 2, ("t", 3): 2}
    assert plan_ranges(stored, kafka, max_records_per_run=2) == \
        plan_ranges(dict(stored), kafka, max_records_per_run=2)


def test_nothing_new_is_an_empty_plan():
    plan = plan_ranges({("t", 0): 9, ("t", 1): 0}, [k("t", 0, 0, 9), k("t", 1, 0, 0)])
    assert plan.is_empty and plan.ranges == []


def test_retention_deleted_next_offset_fails_naming_the_lost_range():
    with pytest.raises(DataError, match=r"t\[2\] offsets \[5, 40\) were deleted"):
        plan_ranges({("t", 2): 5}, [k("t", 2, 40, 90)])


def test_skip_policy_starts_at_earliest_and_records_the_gap():
    plan = plan_ranges({("t", 2): 5}, [k("t", 2, 40, 90)], on_data_loss="skip")
    assert plan.ranges == [OffsetRange("t", 2, 40, 90)]
    assert plan.lost_ranges == [OffsetRange("t", 2, 5, 40)]
    # The compare-and-set still expects the stored value, not the new start.
    assert plan.offset_updates[0].stored == 5


def test_skip_policy_moves_offset_even_when_everything_was_deleted():
    plan = plan_ranges({("t", 0): 5}, [k("t", 0, 40, 40)], on_data_loss="skip")
    assert not plan.is_empty and plan.ranges == []
    assert plan.offset_updates[0].range.until_offset == 40


def test_stored_offset_beyond_latest_is_a_clear_error():
    with pytest.raises(DataError, match=r"beyond the latest offset 3.*offsets reset"):
        plan_ranges({("t", 0): 50}, [k("t", 0, 0, 3)])


def test_stored_partition_missing_from_metadata_is_an_error():
    with pytest.raises(DataError, match=r"no partition 4"):
        plan_ranges({("t", 4): 50}, [k("t", 0, 0, 3)])


def test_plan_uses_the_planned_end_not_max_offset_plus_one():
    # Transaction markers make the last record's offset + 1 smaller than the LSO; the
    # planner never looks at records, only at the resolved end.
    plan = plan_ranges({}, [k("t", 0, 0, 12)])
    assert plan.offset_updates[0].range.until_offset == 12


def test_backfill_range_must_lie_inside_what_kafka_holds():
    held = [k("t", 0, 10, 100)]
    assert plan_backfill(held, from_offsets={("t", 0): 10}, until_offsets={("t", 0): 20}) == [
        OffsetRange("t", 0, 10, 20)]
    with pytest.raises(DataError, match=r"outside what Kafka holds \[10, 100\)"):
        plan_backfill(held, from_offsets={("t", 0): 5}, until_offsets={("t", 0): 20})
    with pytest.raises(DataError, match="no such partition"):
        plan_backfill(held, from_offsets={("t", 3): 5}, until_offsets={("t", 3): 20})


def test_offset_range_rejects_negative_or_reversed_bounds():
    with pytest.raises(ValueError):
        OffsetRange("t", 0, 5, 4)
    with pytest.raises(ValueError):
        OffsetRange("t", 0, -1, 4)


def test_latest_applies_to_a_topics_first_run_only_added_partitions_start_at_earliest():
    # First run: every partition of the topic starts at latest (and is pinned there).
    first = plan_ranges({}, [k("t", 0, 3, 9), k("t", 1, 0, 4)], starting_offsets="latest")
    assert [(p.range.from_offset, p.pin_new) for p in first.partitions] == [(9, True),
                                                                            (4, True)]
    # Partition 2 was added after that run and got 5 records: none may be skipped.
    later = plan_ranges({("t", 0): 9, ("t", 1): 4}, [k("t", 0, 3, 9), k("t", 1, 0, 4),
                                                     k("t", 2, 0, 5)],
                        starting_offsets="latest")
    assert later.ranges == [OffsetRange("t", 2, 0, 5)]
    # Another topic in the same pipeline, read for the first time: latest again.
    other = plan_ranges({("t", 0): 9}, [k("t", 0, 3, 9), k("u", 0, 2, 7)],
                        starting_offsets="latest")
    assert other.ranges == [] and [p.range.from_offset for p in other.partitions] == [9, 7]


def test_a_recreated_topic_is_an_error_before_any_range_is_planned():
    # The new topic already holds more records than the stored offset: without the topic
    # ID this plan would read [30, 50) and skip the new topic's [0, 30).
    kafka = [PartitionOffsets("t", 0, 0, 50, topic_id="NEW")]
    with pytest.raises(DataError) as e:
        plan_ranges({("t", 0): 30}, kafka, stored_topic_ids={"t": {"OLD"}})
    assert e.value.exit_code == 3
    assert ("topic 't' was deleted and recreated: the stored offsets belong to topic ID OLD, "
            "Kafka's 't' is now NEW") in e.value.message
    assert "'pipeline offsets reset --topic t --to earliest'" in e.value.message


def test_the_same_topic_id_plans_as_usual_and_the_plan_carries_it():
    kafka = [PartitionOffsets("t", 0, 0, 50, topic_id="ID1"),
             PartitionOffsets("u", 0, 0, 5, topic_id="ID2")]
    plan = plan_ranges({("t", 0): 30}, kafka, stored_topic_ids={"t": {"ID1"}})
    assert plan.ranges == [OffsetRange("t", 0, 30, 50), OffsetRange("u", 0, 0, 5)]
    assert plan.topic_ids == {"t": "ID1", "u": "ID2"}


def test_offsets_stored_before_topic_ids_were_are_not_compared():
    plan = plan_ranges({("t", 0): 30}, [PartitionOffsets("t", 0, 0, 50, topic_id="NEW")],
                       stored_topic_ids={})
    assert plan.ranges == [OffsetRange("t", 0, 30, 50)]


def test_one_stale_id_among_a_topics_partitions_is_enough_to_stop():
    with pytest.raises(DataError, match="belong to topic ID OLD"):
        check_topic_ids({"t": {"OLD", "NEW"}}, {"t": "NEW"})


def test_the_one_dict_shape_of_a_range():
    r = OffsetRange("t", 2, 10, 25)
    assert r.as_dict() == {"topic": "t", "partition": 2, "from": 10, "until": 25, "offsets": 15}
    # What run rows store (sql/002_runs.sql): no count.
    assert r.as_dict(count=False) == {"topic": "t", "partition": 2, "from": 10, "until": 25}
    [planned] = plan_ranges({("t", 2): 10}, [k("t", 2, 0, 25)]).partitions
    assert planned.as_dict() == {**r.as_dict(), "stored": 10}


# ---- backfill chunks ------------------------------------------------------------------------

def test_a_backfill_without_caps_is_one_chunk():
    ranges = [OffsetRange("t", 0, 0, 10**9), OffsetRange("t", 1, 5, 6)]
    assert chunk_ranges(ranges) == [ranges]
    assert chunk_ranges([]) == [] and chunk_ranges([OffsetRange("t", 0, 3, 3)]) == []


def test_backfill_chunks_keep_the_caps_of_a_run():
    ranges = [OffsetRange("t", 0, 100, 130), OffsetRange("t", 1, 0, 5)]
    chunks = chunk_ranges(ranges, max_records_per_partition=10, max_records_per_run=12)
    # Max-min fair like a run: the small range is read whole, the big one gets the rest.
    assert chunks == [[OffsetRange("t", 0, 100, 107), OffsetRange("t", 1, 0, 5)],
                      [OffsetRange("t", 0, 107, 117)], [OffsetRange("t", 0, 117, 127)],
                      [OffsetRange("t", 0, 127, 130)]]


@pytest.mark.parametrize("seed", range(30))
def test_backfill_chunks_cover_every_offset_once_in_order_within_the_caps(seed):
    import random

    rnd = random.Random(seed)
    ranges = [OffsetRange(t, p, a, a + rnd.randint(0, 60)) for t in ("a", "b")
              for p in range(rnd.randint(1, 4)) for a in [rnd.randint(0, 100)]]
    per_partition, per_run = rnd.choice([0, 1, 7, 50]), rnd.choice([0, 1, 3, 20, 1000])
    chunks = chunk_ranges(ranges, max_records_per_partition=per_partition,
                          max_records_per_run=per_run)
    seen: dict = {}
    for chunk in chunks:
        assert chunk and all(r.count > 0 for r in chunk)
        assert not per_run or sum(r.count for r in chunk) <= per_run
        assert not per_partition or all(r.count <= per_partition for r in chunk)
        for r in chunk:
            assert seen.setdefault(r.tp, [r.from_offset])[-1] == r.from_offset  # contiguous
            seen[r.tp].append(r.until_offset)
    assert {tp: (v[0], v[-1]) for tp, v in seen.items()} == {
        r.tp: (r.from_offset, r.until_offset) for r in ranges if r.count}
    total = sum(r.count for r in ranges)
    if per_run and not per_partition:
        assert len(chunks) == -(-total // per_run)  # every chunk but the last is full


def test_what_an_interrupted_backfill_has_left():
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 50)]
    done = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 10), OffsetRange("t", 0, 10, 20),
            OffsetRange("t", 0, 40, 50), OffsetRange("u", 0, 0, 100)]
    assert subtract_ranges(ranges, done) == [
        OffsetRange("t", 0, 20, 40), OffsetRange("t", 0, 50, 100), OffsetRange("t", 1, 10, 50)]
    assert subtract_ranges(ranges, []) == ranges
    assert subtract_ranges(ranges, ranges) == []
