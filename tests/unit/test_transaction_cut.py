"""The cut at whole source transactions (plan/transactions.py): pure, no Kafka."""

from __future__ import annotations

import pytest

from pipeline.errors import DataError
from pipeline.plan.offsets import OffsetRange
from pipeline.plan.transactions import (
    ReadPartition,
    Segment,
    TransactionEnd,
    collection_topics,
    cut_at_transactions,
)

ORDERS, LINES = "shop.public.orders", "shop.public.order_lines"


def topic_of(collection: str) -> str | None:
    return {"public.orders": ORDERS, "public.order_lines": LINES}.get(collection)


def part(topic, partition, start, until, *segments, events=None):
    """A read partition; ``segments``: (tx, first, last); ``events``: tx -> distinct
    events (default: the offsets its segments span)."""
    segs = tuple(Segment(*s) for s in segments)
    if events is None:
        events = {}
        for s in segs:
            if s.tx is not None:
                events[s.tx] = events.get(s.tx, 0) + s.last_offset - s.first_offset + 1
    return ReadPartition(OffsetRange(topic, partition, start, until), segs, events)


def end(tx, offset, orders=0, lines=0, **other):
    events = {"public.orders": orders, "public.order_lines": lines, **other}
    return TransactionEnd(tx, offset, {k: v for k, v in events.items() if v})


def test_complete_transactions_are_published_whole():
    read = [part(ORDERS, 0, 0, 2, ("1", 0, 0), ("2", 1, 1)),
            part(LINES, 0, 0, 5, ("1", 0, 2), ("2", 3, 4))]
    cut = cut_at_transactions([end("1", 10, 1, 3), end("2", 12, 1, 2)], read, topic_of)
    assert cut.until == {(ORDERS, 0): 2, (LINES, 0): 5}
    assert cut.included == ("1", "2")
    assert cut.metadata_next == 13
    assert cut.blocked is None


def test_a_transaction_missing_an_event_cuts_every_partition_at_its_first_event():
    # Transaction 2 wrote 3 lines; the planned range of lines[1] ended after one of them.
    read = [part(ORDERS, 0, 0, 2, ("1", 0, 0), ("2", 1, 1)),
            part(LINES, 0, 10, 14, ("1", 10, 11), ("2", 12, 13)),
            part(LINES, 1, 20, 22, ("1", 20, 20), ("2", 21, 21))]
    cut = cut_at_transactions([end("1", 0, 1, 3), end("2", 1, 1, 4)], read, topic_of)
    assert cut.until == {(ORDERS, 0): 1, (LINES, 0): 12, (LINES, 1): 21}
    assert cut.included == ("1",)
    assert cut.metadata_next == 1
    assert cut.blocked.tx == "2" and cut.blocked.missing == {LINES: (3, 4)}
    assert "source transaction 2" in str(cut.blocked) and "has 3 of 4" in str(cut.blocked)


def test_the_cut_is_a_prefix_of_commit_order():
    # 2 committed after 1 and is whole, but 1 is not (its line, in the other partition of
    # the lines, is still to come): 2 waits, so the replica never holds a state the source
    # never had.
    read = [part(ORDERS, 0, 0, 1, ("1", 0, 0)),
            part(LINES, 0, 0, 2, ("2", 0, 1)), part(LINES, 1, 0, 0)]
    cut = cut_at_transactions([end("1", 5, 1, 1), end("2", 6, 0, 2)], read, topic_of)
    assert cut.included == ()
    assert cut.until == {(ORDERS, 0): 0, (LINES, 0): 0, (LINES, 1): 0}
    assert cut.metadata_next is None
    assert cut.blocked.tx == "1" and cut.blocked.missing == {LINES: (0, 1)}


def test_events_whose_end_is_not_read_yet_wait_for_the_next_run():
    read = [part(ORDERS, 0, 0, 3, ("1", 0, 0), ("2", 1, 2))]
    cut = cut_at_transactions([end("1", 0, 1)], read, topic_of)
    assert cut.until == {(ORDERS, 0): 1}
    assert cut.included == ("1",)
    assert cut.unended == ("2",)
    assert cut.blocked is None


def test_records_of_no_transaction_never_hold_the_cut_back():
    # A snapshot's reads and tombstones carry no transaction.
    read = [part(ORDERS, 0, 0, 6, (None, 0, 2), ("1", 3, 3), (None, 4, 4), ("2", 5, 5))]
    cut = cut_at_transactions([end("1", 0, 1)], read, topic_of)
    assert cut.until == {(ORDERS, 0): 5}
    only_snapshot = [part(ORDERS, 0, 0, 3, (None, 0, 2))]
    assert cut_at_transactions([], only_snapshot, topic_of).until == {(ORDERS, 0): 3}


def test_a_transaction_published_before_is_no_obstacle_when_it_comes_again():
    # A connector restarted: transaction 1's tail and its END were written again after a
    # run had published it.
    read = [part(ORDERS, 0, 5, 9, ("1", 5, 6), ("2", 7, 8), events={"1": 2, "2": 2})]
    cut = cut_at_transactions([end("1", 30, 3), end("2", 31, 2)], read, topic_of,
                              published={"1"})
    assert cut.until == {(ORDERS, 0): 9}
    assert cut.included == ("2",)
    assert cut.metadata_next == 32
    # ...and its changes are not applied again: after 2's they would take the replica back.
    assert cut.replays == {(ORDERS, 0): ((5, 6),)}


def test_changes_written_again_are_left_out_up_to_the_cut():
    # orders[0]: 1 (published by an earlier run) written again at 10-11, then 2 at 12-13,
    # 2 again at 14-15 (the read task marked them: read earlier in the range), then 3
    # (its END not read) at 16 and 1 again at 17: the cut at 16 leaves 17 out anyway.
    read = [part(ORDERS, 0, 10, 18, ("1", 10, 11), ("2", 12, 13), ("2", 14, 15), ("3", 16, 16),
                 ("1", 17, 17), events={"1": 2, "2": 2, "3": 1})]
    read[0] = ReadPartition(read[0].range, read[0].segments, read[0].events, ((14, 15),))
    cut = cut_at_transactions([end("1", 3, 2), end("2", 4, 2)], read, topic_of,
                              published={"1"})
    assert cut.included == ("2",) and cut.until == {(ORDERS, 0): 16}
    assert cut.replays == {(ORDERS, 0): ((10, 11), (14, 15))}
    # Nothing written again: nothing left out.
    fresh = cut_at_transactions([end("2", 4, 2)], [part(ORDERS, 0, 12, 14, ("2", 12, 13))],
                                topic_of)
    assert fresh.replays == {}


def test_an_end_written_twice_is_counted_once():
    read = [part(ORDERS, 0, 0, 1, ("1", 0, 0))]
    cut = cut_at_transactions([end("1", 3, 1), end("1", 4, 1)], read, topic_of)
    assert cut.included == ("1",)
    assert cut.metadata_next == 5


def test_tables_the_pipeline_does_not_read_do_not_count():
    read = [part(ORDERS, 0, 0, 1, ("1", 0, 0))]
    cut = cut_at_transactions([end("1", 0, 1, **{"public.audit": 7})], read, topic_of)
    assert cut.included == ("1",) and cut.until == {(ORDERS, 0): 1}


def test_more_events_than_the_end_names_is_a_data_error():
    read = [part(ORDERS, 0, 0, 3, ("1", 0, 2))]
    with pytest.raises(DataError, match=r"transaction 1: 3 distinct events read from topic "
                       r"shop.public.orders, more than the 1"):
        cut_at_transactions([end("1", 0, 1)], read, topic_of)


def test_cut_short_names_the_ranges_that_end_early():
    read = [part(ORDERS, 0, 0, 2, ("1", 0, 0), ("2", 1, 1)),
            part(LINES, 0, 0, 1, ("1", 0, 0))]
    cut = cut_at_transactions([end("1", 0, 1, 1)], read, topic_of)
    assert cut.cut_short([p.range for p in read]) == [OffsetRange(ORDERS, 0, 0, 2)]


def test_events_behind_the_ranges_do_not_block_a_transaction_a_later_one_follows():
    # Transaction 1's first order event was published by a run without the cut (before the
    # stored offset); the partition has moved on to transaction 2 since: 1 is "passed".
    read = [part(ORDERS, 0, 5, 7, ("1", 5, 5), ("2", 6, 6)),
            part(LINES, 0, 3, 5, ("2", 3, 4))]
    cut = cut_at_transactions([end("1", 0, 2), end("2", 1, 1, 2)], read, topic_of)
    assert cut.passed == ("1",) and cut.included == ("2",)
    assert cut.published == ("2", "1")
    assert cut.until == {(ORDERS, 0): 7, (LINES, 0): 5}
    assert cut.metadata_next == 2 and cut.blocked is None


def test_a_transaction_whose_events_are_still_being_written_waits():
    # Nothing later than transaction 1 is in the lines partition yet: its missing line may
    # still come, so it waits (a run in steady state).
    read = [part(ORDERS, 0, 0, 1, ("1", 0, 0)), part(LINES, 0, 0, 1, ("1", 0, 0))]
    cut = cut_at_transactions([end("1", 0, 1, 2)], read, topic_of)
    assert cut.blocked.tx == "1" and cut.passed == () and cut.until[(LINES, 0)] == 0
    # A partition with none of its events and nothing later: waits too.
    quiet = [part(ORDERS, 0, 0, 1, ("1", 0, 0)), part(LINES, 0, 9, 9)]
    assert cut_at_transactions([end("1", 0, 1, 1)], quiet, topic_of).blocked.tx == "1"
    # A topic the run has no partition of tells nothing: waits.
    alone = [part(ORDERS, 0, 0, 1, ("1", 0, 0))]
    assert cut_at_transactions([end("1", 0, 1, 1)], alone, topic_of).blocked.tx == "1"


def test_a_published_transaction_written_again_is_no_evidence_of_a_later_one():
    # Transaction 1 was published; the connector restarted and wrote it again after 2's
    # order event, whose line is still to come: 2 waits.
    read = [part(ORDERS, 0, 0, 2, ("2", 0, 0), ("1", 1, 1)),
            part(LINES, 0, 0, 1, ("1", 0, 0))]
    cut = cut_at_transactions([end("1", 0, 1, 1), end("2", 1, 1, 1)], read, topic_of,
                              published={"1"})
    assert cut.blocked.tx == "2" and cut.until == {(ORDERS, 0): 0, (LINES, 0): 1}


def test_the_first_run_takes_partitions_without_a_transactions_events_as_past_it():
    # The transaction topic is read from its start; the data topics resume where a run
    # without the cut left them: transaction 1's events all lie before their ranges.
    read = [part(ORDERS, 0, 4, 5, ("2", 4, 4)), part(LINES, 0, 8, 8)]
    ends = [end("1", 0, 1, 2), end("2", 1, 1)]
    cut = cut_at_transactions(ends, read, topic_of, first_run=True)
    assert cut.passed == ("1",) and cut.included == ("2",) and cut.metadata_next == 2
    assert cut.until == {(ORDERS, 0): 5, (LINES, 0): 8}
    # The same outside the first run: 1 waits for its events.
    assert cut_at_transactions(ends, read, topic_of).blocked.tx == "1"


def test_a_new_pipelines_first_run_waits_for_events_beyond_a_capped_range():
    # A new pipeline reads every partition from its beginning, the lines' range capped
    # before transaction 1's lines: they are ahead, not behind (a replica with the order
    # and none of its lines until the next run).
    read = [part(ORDERS, 0, 0, 2, ("0", 0, 0), ("1", 1, 1)), part(LINES, 0, 0, 2, ("0", 0, 1))]
    ends = [end("0", 0, 1, 2), end("1", 1, 1, 3)]
    cut = cut_at_transactions(ends, read, topic_of, first_run=True, resumed=())
    assert cut.included == ("0",) and cut.passed == () and cut.blocked.tx == "1"
    assert cut.until == {(ORDERS, 0): 1, (LINES, 0): 2}
    # The lines resumed at a stored offset (a run without the cut read them): behind.
    resumed = cut_at_transactions(ends, read, topic_of, first_run=True, resumed={(LINES, 0)})
    assert resumed.passed == ("1",)


def test_the_first_run_passes_a_transaction_whose_end_retention_deleted():
    # Transaction 0's END is before the transaction topic's earliest offset; 1, which
    # follows it in the partition, has its END read.
    read = [part(ORDERS, 0, 0, 3, ("0", 0, 1), ("1", 2, 2))]
    cut = cut_at_transactions([end("1", 0, 1)], read, topic_of, first_run=True)
    assert cut.until == {(ORDERS, 0): 3} and cut.passed == ("0",) and cut.unended == ()
    # Followed by nothing ended: it may be a transaction whose END is still to come.
    tail = [part(ORDERS, 0, 0, 3, ("1", 0, 0), ("0", 1, 2))]
    cut = cut_at_transactions([end("1", 0, 1)], tail, topic_of, first_run=True)
    assert cut.until == {(ORDERS, 0): 1} and cut.unended == ("0",)


def test_collection_topics_maps_debeziums_default_topic_names():
    topic_of = collection_topics("shop.transaction", ["shop.public.orders", "other.x"])
    assert topic_of("public.orders") == "shop.public.orders"
    assert topic_of("public.carts") is None
