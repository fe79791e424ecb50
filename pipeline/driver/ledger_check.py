"""``pipeline verify`` against the ledger (pipeline_ranges): for each published range, what
Kafka holds now vs what was published (records and content hash), and what the tables
hold now vs the ledger's counts.

A range Kafka still holds whole is re-read and hashed (content_hash.py); one whose start
retention has deleted, or (in a compacted topic) that holds fewer records than were
published, is checked against the ledger only (the tables' counts), and said so: its
records cannot be compared. Consecutive ranges of a partition are read with one consumer,
a span of at most SPAN_ROWS ledger rows at a time, so memory stays bounded whatever the
ledger holds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from pipeline.executor.range_hash import Hashed, Reader, hash_span
from pipeline.plan.offsets import OffsetRange, PartitionOffsets
from pipeline.store.ledger import LedgerRow

SPAN_ROWS = 1000  # ledger rows read with one consumer, at most
KEPT = 100  # mismatches and ledger-only ranges listed per partition (all are counted)


@dataclass
class LedgerFindings:
    """One partition's ledger rows checked: how many against Kafka and the tables
    (``hashed``), against the tables only (``ledger_only``, with why), and the mismatches
    (each names its range and run)."""

    checked: int = 0
    hashed: int = 0
    ledger_only: list[dict] = field(default_factory=list)  # the first KEPT
    mismatches: list[dict] = field(default_factory=list)  # the first KEPT
    mismatched: int = 0  # all of them (a recreated topic makes every row one)
    ledger_only_count: int = 0

    def mismatch(self, row: LedgerRow, kind: str, what: str) -> None:
        self.mismatched += 1
        if len(self.mismatches) < KEPT:
            r = row.range
            self.mismatches.append({"topic": r.topic, "partition": r.partition,
                                    "offset": r.from_offset, "until": r.until_offset,
                                    "run_id": row.run_id, "kind": kind, "what": what})

    def only_ledger(self, row: LedgerRow, why: str) -> None:
        self.ledger_only_count += 1
        if len(self.ledger_only) < KEPT:
            self.ledger_only.append({**row.range.as_dict(count=False), "run_id": row.run_id,
                                     "why": why})


# Spans of ledger rows -> each span with its ranges' (records, digest), in order: on the
# driver (local_hashes) or as Spark tasks (driver/verify_spark.py).
SpanHashes = Callable[[Iterator[list[LedgerRow]]], Iterator[tuple[list[LedgerRow],
                                                                  list[Hashed]]]]


def local_hashes(read: Reader) -> SpanHashes:
    def hashes(spans):
        for span in spans:
            yield span, hash_span([(row.range, row.hash_kind) for row in span], read)
    return hashes


def check_ledger(rows: Iterable[LedgerRow], read: Reader | None,
                 held: PartitionOffsets | None,
                 table_counts: Callable[[OffsetRange], tuple[int, int]], *,
                 hash_spans: SpanHashes | None = None,
                 span_offsets: int | None = None, compacted: bool = False) -> LedgerFindings:
    """``rows``: one partition's ledger rows, by from_offset; ``read``: how the driver reads
    a range, unless ``hash_spans`` hashes the spans elsewhere (Spark tasks, cut at
    ``span_offsets`` so a big range is several tasks); ``held``: its offsets in Kafka now
    (None: the partition is gone); ``compacted``: the topic compacts (records may be gone
    since they were published)."""
    hash_spans = hash_spans or local_hashes(read)
    f = LedgerFindings()

    def readable() -> Iterator[LedgerRow]:  # streamed: the ledger is never all in memory
        for row in rows:
            f.checked += 1
            _check_tables(f, row, table_counts(row.range))
            gone, why = _not_readable(row.range, held)
            if why is None:
                yield row
            elif gone:
                f.only_ledger(row, why)
            else:
                f.mismatch(row, "changed", why)

    for span, got in hash_spans(_spans(readable(), span_offsets)):
        for row, (records, digest) in zip(span, got, strict=True):
            if compacted and records < row.records:
                f.only_ledger(row, f"compacted since it was published ({records} of "
                              f"{row.records} records remain): checked against the ledger "
                              "only")
                continue
            f.hashed += 1
            if records != row.records:
                f.mismatch(row, "changed", f"Kafka holds {records} records here, the "
                           f"run published {row.records}")
            elif digest != row.content_hash:
                f.mismatch(row, "changed", "the records' content differs from what the run "
                           "published (a record changed, or the topic was recreated)")
    return f


def _check_tables(f: LedgerFindings, row: LedgerRow, now: tuple[int, int]) -> None:
    # Rows + dead letters together: a dead-letter replay turns dead letters into rows.
    rows, dead = now
    if rows + dead != row.rows + row.dead_letters:
        f.mismatch(row, "ledger", f"the tables hold {rows} rows + {dead} dead letters here, "
                   f"the run published {row.rows} + {row.dead_letters}")


def _not_readable(r: OffsetRange, held: PartitionOffsets | None) -> tuple[bool, str | None]:
    """(gone, why) for a range Kafka cannot return whole: ``gone`` when its records were
    deleted (fine: checked against the ledger only), else a log that now ends before the
    range does (a mismatch); (False, None) when Kafka holds it whole."""
    if held is None:
        return True, "partition no longer in Kafka: checked against the ledger only"
    if held.earliest > r.from_offset:
        return True, "deleted by retention: checked against the ledger only"
    if held.latest < r.until_offset:
        return False, (f"Kafka's log ends at offset {held.latest}, before this published "
                       "range ends (the topic was recreated or truncated)")
    return False, None


def _spans(rows: Iterable[LedgerRow], max_offsets: int | None = None
           ) -> Iterator[list[LedgerRow]]:
    """Runs of overlapping or adjacent ranges, at most SPAN_ROWS each (and, given
    ``max_offsets``, no longer started once they span that many offsets)."""
    span: list[LedgerRow] = []
    end = -1
    for row in rows:
        if span and (row.range.from_offset > end or len(span) >= SPAN_ROWS or (
                max_offsets and end - span[0].range.from_offset >= max_offsets)):
            yield span
            span, end = [], -1
        span.append(row)
        end = max(end, row.range.until_offset)
    if span:
        yield span
