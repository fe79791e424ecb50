"""``pipeline verify`` on the driver: re-read every range the pipeline published from Kafka
(the pipeline's isolation level, read_committed by default) and reconcile it with the
results and dead-letter tables, partition by partition.

The run rows and the tables are read in one REPEATABLE READ snapshot, so a run publishing
meanwhile is either wholly seen or not at all. Kafka is read a batch at a time and the
tables a page at a time; the pure merge (driver/reconcile.py) keeps only counts and the
first mismatching offsets, so memory does not grow with the ranges."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from pipeline import faults
from pipeline.config import Settings
from pipeline.driver.kafka_records import batches
from pipeline.driver.ledger_check import LedgerFindings, check_ledger
from pipeline.driver.reconcile import (
    KEEP,
    Findings,
    clip,
    offset_unexplained,
    published,
    reconcile,
    retained,
)
from pipeline.errors import ConfigError, DataError
from pipeline.plan.offsets import OffsetRange, PartitionOffsets

log = logging.getLogger(__name__)

NO_END = 2**63 - 1  # Postgres bigint's maximum: "no --to"


@dataclass
class Filters:
    topic: str | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None  # exclusive

    def window(self, topic: str, partition: int) -> OffsetRange:
        return OffsetRange(topic, partition, self.from_offset or 0,
                           NO_END if self.to_offset is None else self.to_offset)


@dataclass
class PartitionReport:
    topic: str
    partition: int
    ranges: list[dict] = field(default_factory=list)  # the published ranges verified
    expected: int = 0
    rows: int = 0
    dead_letters: int = 0
    missing: int = 0
    unexpected: int = 0
    duplicates: int = 0
    unpublished: int = 0  # rows or dead letters no succeeded run's range covers
    not_verifiable: list[dict] = field(default_factory=list)  # {from, until, why}
    mismatches: list[dict] = field(default_factory=list)  # the first few: {offset, kind, ...}
    # The ledger (ledger_check.py): its rows checked, those re-read and hashed, those
    # checked against the tables only (Kafka no longer holds them), and the mismatches.
    ledger_ranges: int = 0
    ledger_hashed: int = 0
    ledger_only: list[dict] = field(default_factory=list)  # {from, until, run_id, why}
    ledger_mismatches: int = 0
    # A [sink] transform's pipeline: records in neither table are what it filtered out
    # (counted here; the ledger's counts and hash say whether they were what Kafka holds).
    transform: bool = False
    filtered: int = 0
    # Offsets of the published ranges with no record to verify, by why (SKIP_KINDS).
    skipped: dict[str, int] = field(default_factory=dict)
    # The stored offset, when the run it names did not set it (reconcile.offset_unexplained).
    stored_offset: str | None = None

    def skip(self, kind: str, n: int) -> None:
        if n > 0:
            self.skipped[kind] = self.skipped.get(kind, 0) + n

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicates or self.unpublished
                    or self.ledger_mismatches or self.stored_offset)

    def add_ledger(self, f: LedgerFindings) -> None:
        self.ledger_ranges, self.ledger_hashed = f.checked, f.hashed
        self.ledger_only = f.ledger_only
        self.ledger_mismatches = f.mismatched
        # After the offsets' mismatches (they name single records), the first few ranges.
        self.mismatches += f.mismatches[:KEEP]

    def add(self, f: Findings) -> None:
        for name in ("expected", "rows", "dead_letters", "missing", "unexpected",
                     "duplicates"):
            setattr(self, name, getattr(self, name) + getattr(f, name))
        if self.transform:  # a record in neither table: filtered out, not lost
            self.filtered += f.missing
            self.missing -= f.missing
        for kind, offsets, what in (
                ("missing", [] if self.transform else f.missing_offsets,
                 "a record in Kafka, in neither table"),
                ("unexpected", f.unexpected_offsets, "in a table, but no record in Kafka "
                 "(a forged row, or an aborted, compacted or transaction-marker offset)"),
                ("duplicate", f.duplicate_offsets, "in both the results and the dead-letter "
                 "table")):
            for o in offsets:
                self.mismatch(o, kind, what)

    def mismatch(self, offset: int, kind: str, what: str) -> None:
        if len(self.mismatches) < KEEP:
            self.mismatches.append({"topic": self.topic, "partition": self.partition,
                                    "offset": offset, "kind": kind, "what": what})

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


@dataclass
class VerifyReport:
    pipeline: str
    partitions: list[PartitionReport]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions)

    def first_mismatches(self, n: int = 5) -> list[dict]:
        return [m for p in self.partitions for m in p.mismatches][:n]

    def as_dict(self) -> dict:
        return {"pipeline": self.pipeline, "ok": self.ok,
                "partitions": [p.as_dict() for p in self.partitions]}


# Why an offset of a published range holds no record verify can check: read_committed
# skips an aborted transaction's records (a read_uncommitted read returns them) and the
# transaction markers (no read returns them); compaction removes records too, which no read
# tells from a marker: in a compacted topic the two are counted together.
SKIP_KINDS = {"aborted": "records of aborted transactions",
              "transaction_marker": "transaction markers",
              "compacted_or_marker": "compacted away or transaction markers",
              "retention_deleted": "deleted by retention"}


def check_supported(settings: Settings) -> None:
    if settings.sink.transform and settings.sink.mode != "append":
        raise ConfigError(
            f"pipeline '{settings.name}': verify cannot recompute an {settings.sink.mode} "
            f"table made by the [sink] transform {settings.sink.transform!r} without running "
            "the transform (it may change and filter rows); it verifies append sinks with a "
            "transform against the ledger")
    if settings.sink.mode != "append":
        raise ConfigError(
            f"pipeline '{settings.name}': this reconciles append sinks offset by offset "
            f"(sink.mode = '{settings.sink.mode}' is state made from many records: "
            "driver/verify_state.py recomputes it)")


def run_verify(settings: Settings, filters: Filters, spark: str = "auto") -> VerifyReport:
    """``spark``: where the ledger's ranges are re-read and hashed (verify_spark.use_spark:
    always, never, auto = on executors when the ranges are big and the master a cluster)."""
    from pipeline.driver import verify_spark
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.executor.consume import reader_config
    from pipeline.store import Store

    check_supported(settings)
    k = settings.kafka
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-verify")
    # Counts the aborted records among the skipped offsets (not needed when the pipeline
    # itself reads them).
    uncommitted = None if k.isolation_level == "read_uncommitted" else reader_config(
        k.client_config(), "read_uncommitted", f"{settings.name}-verify")
    meta = KafkaMeta(k)
    reports = []
    with Store(settings) as store:
        store.check_schema()
        with store.snapshot():
            plans = store.published_plans()
            archived = store.archiving_runs()
            ranges = published([p for _, p in plans], archived,
                               [run_id for run_id, _ in plans])
            selected = {tp: rs for tp, rs in ranges.items()
                        if filters.topic in (None, tp[0])
                        and filters.partition in (None, tp[1])}
            held = kafka_offsets(meta, sorted({t for t, _ in selected}))
            compacted = meta.compacted(sorted({t for t, _ in selected})) if selected else {}
            offsets = sum(r.count for tp, rs in selected.items()
                          for r in clip(rs, filters.window(*tp).from_offset,
                                        filters.window(*tp).until_offset))  # to verify
            hash_spans, span_offsets = verify_spark.hashing(settings, spark, offsets, reader)
            stored = store.stored_offsets()
            writers = store.offset_writers([w for _, w in stored.values() if w is not None])
            for i, ((topic, partition), rs) in enumerate(selected.items(), 1):
                faults.inject("verify_chunk")
                report = verify_partition(store, (reader, uncommitted), k.timeout_seconds,
                                          topic, partition, rs, filters,
                                          held.get((topic, partition)),
                                          bool(settings.sink.transform),
                                          compacted.get(topic) is not False)
                after = archived.get(topic, -1)  # the ledger of an archived topic is history
                report.add_ledger(check_ledger(
                    (row for row in store.ledger_rows(topic, partition,
                                                      filters.window(topic, partition))
                     if row.run_id > after),
                    lambda r: batches(reader, r, k.timeout_seconds),
                    held.get((topic, partition)), store.table_counts,
                    hash_spans=hash_spans, span_offsets=span_offsets))
                if (topic, partition) in stored:
                    next_offset, writer = stored[(topic, partition)]
                    report.stored_offset = offset_unexplained(
                        (topic, partition), next_offset, writer, writers.get(writer))
                    if report.stored_offset:
                        report.mismatch(next_offset, "stored_offset", report.stored_offset)
                reports.append(report)
                log.info("verify %s[%d] (%d/%d): %d records, %d rows, %d dead letters: %s",
                         topic, partition, i, len(selected), report.expected, report.rows,
                         report.dead_letters, "match" if report.ok else "MISMATCH",
                         extra={"event": "verify.partition", "topic": topic,
                                "partition": partition, "ok": report.ok})
    return VerifyReport(settings.name, reports)


def kafka_offsets(meta, topics: list[str]) -> dict[tuple[str, int], PartitionOffsets | None]:
    """Each partition's earliest and latest offsets; a topic gone from Kafka holds none."""
    out: dict[tuple[str, int], PartitionOffsets | None] = {}
    for topic in topics:
        try:
            out.update({(o.topic, o.partition): o for o in meta.topic_offsets([topic])})
        except DataError:  # the topic no longer exists: nothing of it can be verified
            continue
    return out


def verify_partition(store, readers: tuple[dict, dict | None], timeout: float, topic: str,
                     partition: int, ranges: list[OffsetRange], filters: Filters,
                     held: PartitionOffsets | None, transform: bool = False,
                     compacted: bool = True) -> PartitionReport:
    """``readers``: the pipeline's reader and a read_uncommitted one (None: the pipeline's
    is); ``compacted``: the topic may be compacted (skipped offsets named accordingly)."""
    from pipeline.store.tables import dead_letters

    reader, uncommitted = readers
    report = PartitionReport(topic, partition, transform=transform)
    window = filters.window(topic, partition)
    in_window = list(clip(ranges, window.from_offset, window.until_offset))
    for r in in_window:
        report.ranges.append(r.as_dict(count=False))
        if held is None:
            report.not_verifiable.append({**r.as_dict(count=False),
                                          "why": "partition no longer in Kafka"})
            continue
        deleted, kept = retained(r, held.earliest)
        if deleted:
            report.not_verifiable.append({**deleted.as_dict(count=False),
                                          "why": "deleted by retention"})
            report.skip("retention_deleted", deleted.count)
        if kept:
            # Past the log's end (a truncated log) Kafka returns nothing: rows there are
            # unexpected, which is what they are.
            readable = OffsetRange(topic, partition, kept.from_offset,
                                   max(kept.from_offset, min(kept.until_offset, held.latest)))
            faults.inject("verify_read")
            found = reconcile(kept, records(reader, readable, timeout),
                              store.offsets_in(store.results, kept),
                              store.offsets_in(dead_letters, kept))
            report.add(found)
            if gaps := readable.count - found.expected:
                aborted = 0 if uncommitted is None else sum(
                    1 for _ in records(uncommitted, readable, timeout)) - found.expected
                report.skip("aborted", aborted)
                report.skip("compacted_or_marker" if compacted else "transaction_marker",
                            gaps - aborted)
    for table, what in ((store.results, "a result row"), (dead_letters, "a dead letter")):
        count, first = store.outside(table, window, in_window, KEEP)
        report.unpublished += count
        for o in first:
            report.mismatch(o, "unpublished", f"{what} at an offset no succeeded run "
                            "published")
    return report


def records(reader: dict, r: OffsetRange, timeout: float) -> Iterator[int]:
    """The offsets of the records Kafka returns for ``r``, a batch at a time."""
    for batch in batches(reader, r, timeout):
        for m in batch:
            yield m.offset()
