"""``pipeline verify`` on the driver: re-read every range the pipeline published from Kafka
(the pipeline's isolation level, read_committed by default) and reconcile it with the
results and dead-letter tables, partition by partition.

A short snapshot finds the partitions to verify: those succeeded runs published and those
the tables hold rows of (a row no run published is a mismatch too). Each partition is then
verified a window of at most WINDOW_OFFSETS published offsets at a time, each window in a
read-only REPEATABLE READ snapshot of its own that holds everything compared there (the
run rows' ranges, the rows and dead letters, the ledger rows, the stored offset): a run
publishing meanwhile is wholly seen or not at all by each window, and no snapshot outlives
one window's re-read (a long one holds back vacuum on the whole database). Kafka is read a
batch at a time and the tables a page at a time; the pure merge (driver/reconcile.py)
keeps only counts and the first mismatching offsets, so memory does not grow with the
ranges.

What Kafka no longer holds (retention, a compacted record, a partition gone) is not
compared, and says so: the partition's verdict is "incomplete" (driver/verdict.py), unless
the user left it out of the scope (--skip-lost)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline import faults
from pipeline.config import Settings
from pipeline.driver.kafka_records import batches
from pipeline.driver.ledger_check import LedgerFindings, check_ledger
from pipeline.driver.reconcile import (
    KEEP,
    Findings,
    chunk_windows,
    clip,
    offset_unexplained,
    published,
    reconcile,
    retained,
)
from pipeline.driver.verdict import MATCH, verdict, worst
from pipeline.errors import ConfigError, DataError, TransientError
from pipeline.plan.offsets import OffsetRange, PartitionOffsets

log = logging.getLogger(__name__)

NO_END = 2**63 - 1  # Postgres bigint's maximum: "no --to"
# Published offsets verified per snapshot: a snapshot held open while a window is re-read
# holds back vacuum on the whole database, so it lasts one window, not the whole verify.
WINDOW_OFFSETS = 1_000_000
# Windows verified again when retention deleted records while verify read them.
RETENTION_TRIES = 3


@dataclass
class Filters:
    topic: str | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None  # exclusive
    # The table's topics, for a pipeline of several tables (None: every topic published).
    topics: tuple[str, ...] | None = None

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
    # What could not be compared, the first KEEP: ranges Kafka no longer holds, offsets of
    # rows whose record a compacted topic no longer holds ({from, until, why}); and how
    # many offsets in all.
    not_compared: list[dict] = field(default_factory=list)
    not_compared_offsets: int = 0
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
    # --skip-lost: what Kafka no longer holds is out of the scope (listed, not a verdict).
    skip_lost: bool = False

    def skip(self, kind: str, n: int) -> None:
        if n > 0:
            self.skipped[kind] = self.skipped.get(kind, 0) + n

    def not_compare(self, start: int, until: int, why: str) -> None:
        self.not_compared_offsets += until - start
        if len(self.not_compared) < KEEP:
            self.not_compared.append({"from": start, "until": until, "why": why})

    @property
    def differs(self) -> bool:
        return bool(self.missing or self.unexpected or self.duplicates or self.unpublished
                    or self.ledger_mismatches or self.stored_offset)

    @property
    def verdict(self) -> str:
        return verdict(self.differs, bool(self.not_compared_offsets or self.ledger_only),
                       self.skip_lost)

    @property
    def ok(self) -> bool:
        return self.verdict == MATCH

    def add_ledger(self, f: LedgerFindings) -> None:
        self.ledger_ranges += f.checked
        self.ledger_hashed += f.hashed
        self.ledger_only += f.ledger_only[:KEEP - len(self.ledger_only)]
        self.ledger_mismatches += f.mismatched
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
                 "(a forged row, or an aborted or transaction-marker offset)"),
                ("duplicate", f.duplicate_offsets, "in both the results and the dead-letter "
                 "table")):
            for o in offsets:
                self.mismatch(o, kind, what)
        self.not_compared_offsets += f.gone - len(f.gone_offsets)
        for o in f.gone_offsets:
            self.not_compare(o, o + 1, "a row or dead letter whose record the compacted "
                             "topic no longer holds (compacted away since it was published)")

    def absorb(self, other: PartitionReport) -> None:
        """Add a later window's report of the same partition (run_verify's windows)."""
        for r in other.ranges:
            if self.ranges and self.ranges[-1]["until"] == r["from"]:
                self.ranges[-1] = {**self.ranges[-1], "until": r["until"]}
            else:
                self.ranges.append(r)
        for name in ("expected", "rows", "dead_letters", "missing", "unexpected",
                     "duplicates", "unpublished", "not_compared_offsets", "ledger_ranges",
                     "ledger_hashed", "ledger_mismatches", "filtered"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("not_compared", "mismatches", "ledger_only"):
            mine = getattr(self, name)
            mine += getattr(other, name)[:max(0, KEEP - len(mine))]
        for kind, n in other.skipped.items():
            self.skip(kind, n)
        self.stored_offset = self.stored_offset or other.stored_offset

    def mismatch(self, offset: int, kind: str, what: str) -> None:
        if len(self.mismatches) < KEEP:
            self.mismatches.append({"topic": self.topic, "partition": self.partition,
                                    "offset": offset, "kind": kind, "what": what})

    def as_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict, "ok": self.ok}


@dataclass
class VerifyReport:
    pipeline: str
    partitions: list[PartitionReport]
    skip_lost: bool = False

    @property
    def verdict(self) -> str:
        return worst(p.verdict for p in self.partitions)

    @property
    def ok(self) -> bool:
        return self.verdict == MATCH

    def first_mismatches(self, n: int = 5) -> list[dict]:
        return [m for p in self.partitions for m in p.mismatches][:n]

    def as_dict(self) -> dict:
        return {"pipeline": self.pipeline, "verdict": self.verdict, "ok": self.ok,
                "skip_lost": self.skip_lost,
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


def run_verify(settings: Settings, filters: Filters, spark: str = "auto",
               skip_lost: bool = False, window_offsets: int = WINDOW_OFFSETS) -> VerifyReport:
    """``spark``: where the ledger's ranges are re-read and hashed (verify_spark.use_spark:
    always, never, auto = on executors when the ranges are big and the master a cluster).
    ``skip_lost``: what Kafka no longer holds is out of the scope (listed, not a verdict).
    ``window_offsets``: the published offsets verified per snapshot."""
    from pipeline.driver import verify_spark
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.executor.consume import reader_config
    from pipeline.sinks import for_settings
    from pipeline.store import Store

    check_supported(settings)
    sink = for_settings(settings)
    k = settings.kafka
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-verify")
    # Counts the aborted records among the skipped offsets (not needed when the pipeline
    # itself reads them).
    uncommitted = None if k.isolation_level == "read_uncommitted" else reader_config(
        k.client_config(), "read_uncommitted", f"{settings.name}-verify")
    meta = KafkaMeta(k)
    reports = []
    with Store(settings) as store:
        store.schema.check([sink])
        with store.snapshot():  # what to verify: the windows re-read it in their snapshots
            ranges, _ = published_ranges(store)
            in_tables = store.verification.table_partitions([sink.results])
        selected = {tp: ranges.get(tp, []) for tp in sorted(set(ranges) | in_tables)
                    if filters.topic in (None, tp[0]) and filters.partition in (None, tp[1])
                    and (filters.topics is None or tp[0] in filters.topics)}
        compacted = meta.compacted(sorted({t for t, _ in selected})) if selected else {}
        offsets = sum(r.count for tp, rs in selected.items()
                      for r in clip(rs, filters.window(*tp).from_offset,
                                    filters.window(*tp).until_offset))  # to verify
        hash_spans, span_offsets = verify_spark.hashing(settings, spark, offsets, reader)
        check = WindowCheck(store, sink.results, meta, reader, uncommitted, k.timeout_seconds,
                            bool(settings.sink.transform), hash_spans, span_offsets)
        for i, ((topic, partition), rs) in enumerate(selected.items(), 1):
            window = filters.window(topic, partition)
            report = PartitionReport(topic, partition, transform=check.transform,
                                     skip_lost=skip_lost)
            cuts = chunk_windows(list(clip(rs, window.from_offset, window.until_offset)),
                                 window.from_offset, window.until_offset, window_offsets)
            for n, (lo, hi) in enumerate(cuts):
                faults.inject("verify_chunk")
                report.absorb(check.verified(
                    OffsetRange(topic, partition, lo, hi), window, first=n == 0,
                    last=n == len(cuts) - 1, compacted=compacted.get(topic) is not False))
            reports.append(report)
            log.info("verify %s[%d] (%d/%d): %d records, %d rows, %d dead letters: %s",
                     topic, partition, i, len(selected), report.expected, report.rows,
                     report.dead_letters, report.verdict,
                     extra={"event": "verify.partition", "topic": topic,
                            "partition": partition, "verdict": report.verdict})
    return VerifyReport(settings.name, reports, skip_lost)


def published_ranges(store, tp: tuple[str, int] | None = None
                     ) -> tuple[dict[tuple[str, int], list[OffsetRange]], dict[str, int]]:
    """In the open snapshot: what succeeded runs published (of ``tp`` only, if given), and
    the runs that archived a recreated topic."""
    plans = store.verification.published_plans(tp)
    archived = store.verification.archiving_runs()
    return published([p for _, p in plans], archived, [run_id for run_id, _ in plans]), archived


def partition_offsets(meta, topic: str, partition: int) -> PartitionOffsets | None:
    """The partition's earliest and latest offsets now; None when Kafka no longer has it
    (or never had: a row of a partition no run published)."""
    try:
        if partition not in meta.describe([topic])[topic][1]:
            return None
        (held,) = meta.offsets([(topic, partition)])
    except DataError:  # the topic does not exist
        return None
    return held


@dataclass
class WindowCheck:
    """What verifying one window of a partition needs (run_verify's context)."""

    store: Any
    results: Any  # the results table (a SQLAlchemy Table)
    meta: Any
    reader: dict
    uncommitted: dict | None  # a read_uncommitted reader (None: the pipeline's is)
    timeout: float
    transform: bool
    hash_spans: Any = None  # verify_spark's, or None: the driver hashes
    span_offsets: int | None = None

    def verified(self, w: OffsetRange, window: OffsetRange, *, first: bool, last: bool,
                 compacted: bool) -> PartitionReport:
        """Window ``w`` of the partition's ``window`` verified in a snapshot of its own.
        Retention deleting records while they are read moves the partition's start: the
        window is verified again from there (what it took is then not compared)."""
        for attempt in range(1, RETENTION_TRIES + 1):
            with self.store.snapshot():
                ranges, archived = published_ranges(self.store, w.tp)
                # Asked after the snapshot began: every range it holds is below the end.
                held = partition_offsets(self.meta, w.topic, w.partition)
                try:
                    return self.check(w, window, ranges.get(w.tp, []), held,
                                      archived.get(w.topic, -1), first=first, last=last,
                                      compacted=compacted)
                except TransientError as e:
                    now = partition_offsets(self.meta, w.topic, w.partition)
                    if held is None or now is None or now.earliest <= held.earliest:
                        raise
                    error = e
                    log.info("verify %s[%d]: retention deleted offsets [%d, %d) while "
                             "verify read them; verifying [%d, %d) again (%d/%d)", w.topic,
                             w.partition, held.earliest, now.earliest, w.from_offset,
                             w.until_offset, attempt, RETENTION_TRIES)
        raise TransientError(
            f"verify: retention deleted records of {w.topic}[{w.partition}] while verify read "
            f"them, {RETENTION_TRIES} times over ({error.message}); verify again later, or "
            f"leave the partition's oldest offsets out with --from (offsets {now.earliest} "
            "and later are still held)")

    def check(self, w: OffsetRange, window: OffsetRange, ranges: list[OffsetRange],
              held: PartitionOffsets | None, archived_by: int, *, first: bool, last: bool,
              compacted: bool) -> PartitionReport:
        """In the open snapshot: the published ``ranges`` inside ``w`` reconciled with the
        tables, rows in ``w`` no range covers, the ledger rows that start in ``w`` (the
        first window: also those that start before ``window``), and, in the last window,
        the stored offset."""
        from pipeline.store.tables import dead_letters

        store, topic, partition = self.store, w.topic, w.partition
        reads, results = store.verification, self.results
        report = PartitionReport(topic, partition, transform=self.transform)
        in_window = list(clip(ranges, w.from_offset, w.until_offset))
        faults.inject("verify_read")
        for r in in_window:
            report.ranges.append(r.as_dict(count=False))
            if held is None:
                report.not_compare(r.from_offset, r.until_offset,
                                   "partition no longer in Kafka")
                continue
            deleted, kept = retained(r, held.earliest)
            if deleted:
                report.not_compare(deleted.from_offset, deleted.until_offset,
                                   "deleted by retention")
                report.skip("retention_deleted", deleted.count)
            if kept:
                # Past the log's end (a truncated log) Kafka returns nothing: rows there are
                # unexpected, which is what they are.
                readable = OffsetRange(topic, partition, kept.from_offset, max(
                    kept.from_offset, min(kept.until_offset, held.latest)))
                found = reconcile(kept, records(self.reader, readable, self.timeout),
                                  reads.offsets_in(results, kept),
                                  reads.offsets_in(dead_letters, kept), compacted=compacted)
                report.add(found)
                if gaps := readable.count - found.expected:
                    aborted = 0 if self.uncommitted is None else sum(
                        1 for _ in records(self.uncommitted, readable, self.timeout)
                    ) - found.expected
                    report.skip("aborted", aborted)
                    report.skip("compacted_or_marker" if compacted else "transaction_marker",
                                gaps - aborted)
        for table, what in ((results, f"a row of {results.name}"),
                            (dead_letters, "a dead letter")):
            count, offsets = reads.outside(table, w, in_window, KEEP)
            report.unpublished += count
            for o in offsets:
                report.mismatch(o, "unpublished", f"{what} at an offset no succeeded run "
                                "published")
        # The ledger of an archived topic before its recreation is history.
        starts = window.from_offset if first else w.from_offset
        report.add_ledger(check_ledger(
            (row for row in store.ledger.rows(topic, partition, OffsetRange(
                topic, partition, starts, w.until_offset))
             if row.run_id > archived_by and (first or row.range.from_offset >= starts)),
            lambda r: batches(self.reader, r, self.timeout), held,
            lambda r: store.ledger.table_counts(results, r),
            hash_spans=self.hash_spans, span_offsets=self.span_offsets, compacted=compacted))
        if last and (stored := reads.stored_offsets(w.tp).get(w.tp)):
            next_offset, writer = stored
            writers = reads.offset_writers([writer] if writer is not None else [])
            report.stored_offset = offset_unexplained(w.tp, next_offset, writer,
                                                      writers.get(writer))
            if report.stored_offset:
                report.mismatch(next_offset, "stored_offset", report.stored_offset)
        return report


def kafka_offsets(meta, topics: list[str]) -> dict[tuple[str, int], PartitionOffsets | None]:
    """Each partition's earliest and latest offsets; a topic gone from Kafka holds none."""
    out: dict[tuple[str, int], PartitionOffsets | None] = {}
    for topic in topics:
        try:
            out.update({(o.topic, o.partition): o for o in meta.topic_offsets([topic])})
        except DataError:  # the topic no longer exists: nothing of it can be verified
            continue
    return out


def records(reader: dict, r: OffsetRange, timeout: float) -> Iterator[int]:
    """The offsets of the records Kafka returns for ``r``, a batch at a time."""
    for batch in batches(reader, r, timeout):
        for m in batch:
            yield m.offset()
