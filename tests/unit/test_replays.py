"""plan/replays.py: the one rule by which a run and verify tell a change Kafka Connect wrote
again (its transaction and order in its table met earlier in the partition) from its
original, the tombstone after a delete going with its delete."""

from __future__ import annotations

from pipeline.plan.replays import Identities, Replays

# (offset, key, tombstone, source): tx 5 deletes k1 (its tombstone after it) and updates k2;
# Connect restarts and writes 5 again; then 6, and a tombstone after no change of its key.
PARTITION = [(20, b"k1", False, ("5", 1)), (21, b"k1", True, None),
             (22, b"k2", False, ("5", 2)),
             (23, b"k1", False, ("5", 1)), (24, b"k1", True, None),
             (25, b"k2", False, ("5", 2)),
             (26, b"k3", False, ("6", 1)), (27, b"k4", True, None)]


def replays(records, starts=()) -> list[list[int]]:
    ids, first = Identities(starts), Replays()
    for offset, key, tombstone, source in records:
        first.add(offset, ids.of(offset, key, tombstone, source))
    return first.runs


def test_a_change_met_again_in_its_partition_is_a_replay_with_the_tombstone_after_it():
    assert replays(PARTITION) == [[23, 25]]


def test_a_tombstone_goes_with_the_change_right_before_it_of_its_key_only():
    ids = Identities()
    got = [ids.of(o, k, t, s) for o, k, t, s in
           [(0, b"a", False, ("7", 1)), (1, b"a", True, None),   # after its delete
            (2, b"a", True, None),                               # after a tombstone
            (3, b"b", False, ("7", 2)), (4, b"c", True, None),   # after another key's
            (5, b"d", False, None), (6, b"d", True, None)]]      # after a snapshot read
    assert got == [("7", 1, -1), ("7", 1, 0), None, ("7", 2, -1), None, None, None]
    # A tombstone is a replay when its change is, whatever tombstones came before.
    first = Replays()
    assert [first.add(o, i) for o, i in [(0, ("7", 1, -1)), (1, ("7", 1, 0)),
                                          (2, ("7", 1, -1)), (3, ("7", 1, 2)),
                                          (4, ("8", 1, -1)), (5, ("8", 1, 4))]] == [
        False, False, True, True, False, False]


def test_the_first_of_an_identity_wins_whatever_came_between():
    # 5's changes again after 6 (Connect wrote back to 5), then 6's again.
    records = PARTITION[:3] + [(23, b"k3", False, ("6", 1))] + [
        (24 + i, k, t, s) for i, (_, k, t, s) in enumerate(PARTITION[:3])] + [
        (27, b"k3", False, ("6", 1))]
    assert replays(records) == [[24, 27]]


def test_a_range_start_has_no_record_before_it():
    # A run's range starting at the tombstone: its read task never saw the delete, so the
    # tombstone goes with no change there, and verify (reading both runs' ranges) agrees.
    records = PARTITION[:3] + [(23, b"k1", False, ("5", 1)), (24, b"k1", True, None)]
    assert replays(records) == [[23, 24]]
    assert replays(records, starts=(20, 24)) == [[23, 23]]
    ids = Identities(starts=(24,))
    assert [ids.of(o, k, t, s) for o, k, t, s in records][-1] is None
    # ...and the tombstone of a change before a start is the same as that change.
    original = [(20, b"k1", False, ("5", 1)), (21, b"k1", True, None),
                (22, b"k1", False, ("5", 1)), (23, b"k1", True, None)]
    assert replays(original, starts=(21,)) == [[22, 23]]
