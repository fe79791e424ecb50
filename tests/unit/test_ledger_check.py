"""verify against the ledger, without I/O: ranges Kafka holds whole are re-read and
hashed (one read per span of adjacent or overlapping ranges), the tables' counts are
compared with the ledger's, ranges retention deleted are checked against the ledger only,
and a log that ends before a published range does is a mismatch."""

from __future__ import annotations

import pytest

from pipeline.driver import ledger_check
from pipeline.driver.ledger_check import check_ledger
from pipeline.executor.content_hash import ContentHash
from pipeline.plan.offsets import OffsetRange, PartitionOffsets
from pipeline.store.ledger import LedgerRow
from tests.unit.test_content_hash import Record

T = "orders"
KAFKA = {o: Record(o, b"k", b"v%d" % o) for o in range(100) if o not in (10, 11)}


def read_from(kafka: dict, reads: list | None = None, batch: int = 7):
    def read(r: OffsetRange):
        if reads is not None:
            reads.append((r.from_offset, r.until_offset))
        got = [kafka[o] for o in range(r.from_offset, r.until_offset) if o in kafka]
        for i in range(0, len(got), batch):
            yield got[i:i + batch]
    return read


def row(start: int, until: int, run_id: int = 1, kafka: dict = KAFKA,
        dead: int = 0) -> LedgerRow:
    records = [kafka[o] for o in range(start, until) if o in kafka]
    h = ContentHash()
    h.add(records)
    return LedgerRow(run_id, OffsetRange(T, 0, start, until), len(records),
                     len(records) - dead, dead, 0, until - start - len(records), h.digest())


def counts_from(rows: list[LedgerRow]):
    """The tables as the ledger says they are."""
    def counts(r: OffsetRange) -> tuple[int, int]:
        (match,) = [x for x in rows if x.range == r]
        return match.rows, match.dead_letters
    return counts


HELD = PartitionOffsets(T, 0, 0, 100)


def test_an_exact_ledger_checks_clean_with_one_read_per_span():
    rows = [row(0, 30), row(30, 60, 2, dead=3), row(20, 50, 3), row(80, 90, 4)]
    rows.sort(key=lambda r: r.range.from_offset)
    reads: list = []
    f = check_ledger(rows, read_from(KAFKA, reads), HELD, counts_from(rows))
    assert (f.checked, f.hashed, f.mismatches, f.ledger_only) == (4, 4, [], [])
    assert reads == [(0, 60), (80, 90)]  # overlapping and adjacent: one read


def test_a_changed_record_is_named_by_range_and_run():
    rows = [row(0, 30), row(30, 60, 2)]
    changed = {**KAFKA, 42: Record(42, b"k", b"other")}
    f = check_ledger(rows, read_from(changed), HELD, counts_from(rows))
    assert [(m["offset"], m["until"], m["run_id"], m["kind"]) for m in f.mismatches] == [
        (30, 60, 2, "changed")]


def test_a_record_gone_or_added_is_a_count_mismatch():
    rows = [row(0, 30)]
    fewer = {o: r for o, r in KAFKA.items() if o != 5}
    (m,) = check_ledger(rows, read_from(fewer), HELD, counts_from(rows)).mismatches
    assert m["kind"] == "changed" and "holds 27 records here, the run published 28" in m["what"]


def test_tables_that_differ_from_the_ledger_are_named():
    rows = [row(0, 30), row(30, 60, 2, dead=2)]
    (m,) = check_ledger(rows, read_from(KAFKA), HELD,
                        lambda r: (28, 0) if r.from_offset == 0 else (28, 1)).mismatches
    assert (m["offset"], m["until"], m["kind"]) == (30, 60, "ledger")
    assert "29 dead letters" not in m["what"] and "28 rows + 1 dead letters" in m["what"]


def test_replayed_dead_letters_that_became_rows_still_match():
    rows = [row(0, 30, dead=5)]
    f = check_ledger(rows, read_from(KAFKA), HELD, lambda r: (28, 0))
    assert f.mismatches == []


def test_ranges_retention_deleted_are_checked_against_the_ledger_only():
    rows = [row(0, 30), row(30, 60, 2)]
    f = check_ledger(rows, read_from(KAFKA), PartitionOffsets(T, 0, 40, 100),
                     lambda r: (0, 0))
    assert f.hashed == 0 and [n["why"] for n in f.ledger_only] == [
        "deleted by retention: checked against the ledger only"] * 2
    assert [m["kind"] for m in f.mismatches] == ["ledger", "ledger"]


def test_a_compacted_topic_shrunk_since_publishing_is_checked_against_the_ledger_only():
    rows = [row(0, 30)]
    fewer = {o: r for o, r in KAFKA.items() if o != 5}
    f = check_ledger(rows, read_from(fewer), HELD, counts_from(rows), compacted=True)
    assert (f.hashed, f.mismatches) == (0, [])
    assert "compacted since it was published (27 of 28 records remain)" in f.ledger_only[0]["why"]
    # A record more than was published is no compaction: still a mismatch.
    more = {**KAFKA, 10: Record(10, b"k", b"new")}
    (m,) = check_ledger(rows, read_from(more), HELD, counts_from(rows), compacted=True).mismatches
    assert m["kind"] == "changed"


def test_a_gone_partition_is_checked_against_the_ledger_only():
    rows = [row(0, 30)]
    f = check_ledger(rows, read_from({}), None, counts_from(rows))
    assert f.mismatches == [] and "no longer in Kafka" in f.ledger_only[0]["why"]


def test_a_log_ending_before_a_published_range_is_a_mismatch():
    rows = [row(0, 30), row(30, 60, 2)]
    f = check_ledger(rows, read_from(KAFKA), PartitionOffsets(T, 0, 0, 50),
                     counts_from(rows))
    (m,) = f.mismatches
    assert (m["offset"], m["kind"]) == (30, "changed") and "ends at offset 50" in m["what"]


def test_a_span_holds_at_most_span_rows_ledger_rows(monkeypatch):
    monkeypatch.setattr(ledger_check, "SPAN_ROWS", 2)
    rows = [row(0, 10), row(10, 20), row(20, 30), row(30, 40)]
    reads: list = []
    f = check_ledger(rows, read_from(KAFKA, reads), HELD, counts_from(rows))
    assert f.mismatches == [] and reads == [(0, 20), (20, 40)]


def test_every_mismatch_is_counted_and_only_the_first_are_kept():
    # A recreated topic makes every ledger row a mismatch: a big ledger must not make an
    # equally big report.
    rows = [row(o, o + 1) for o in range(20, 20 + ledger_check.KEPT + 30)]
    other = {o: Record(o, b"k", b"other") for o in range(200)}
    f = check_ledger(iter(rows), read_from(other), PartitionOffsets(T, 0, 0, 200),
                     counts_from(rows))
    assert f.mismatched == ledger_check.KEPT + 30
    assert len(f.mismatches) == ledger_check.KEPT
    assert f.mismatches[0]["offset"] == 20


def test_spans_for_executors_are_cut_at_a_size_so_a_big_range_is_several_tasks():
    rows = [row(0, 30), row(30, 60, 2), row(60, 90, 3), row(90, 100, 4)]
    assert [[r.range.from_offset for r in span]
            for span in ledger_check._spans(rows, max_offsets=50)] == [[0, 30], [60, 90]]
    assert len(list(ledger_check._spans(rows))) == 1


@pytest.mark.parametrize(("choice", "offsets", "master", "spark"), [
    ("auto", 499_999, "spark://m:7077", False), ("auto", 500_000, "spark://m:7077", True),
    ("auto", 10**9, "local[2]", False), ("always", 1, "local[2]", True),
    ("never", 10**9, "yarn", False)])
def test_verify_uses_executors_for_big_ranges_on_a_cluster_or_when_told(choice, offsets,
                                                                        master, spark):
    from pipeline.driver.verify_spark import use_spark

    assert use_spark(choice, offsets, master) is spark
