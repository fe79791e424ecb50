"""A backfill or reprocess: explicit ranges re-read as a sequence of bounded runs (chunks),
each one transaction within an ingest run's caps, resumable after an interruption.

The stored offsets never move here; each chunk is published by driver/job.execute_ranges.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.config import Settings
from pipeline.driver.job import execute_ranges
from pipeline.driver.kafka_meta import KafkaMeta
from pipeline.driver.report import RunResult, Seen, Timer, describe, reported
from pipeline.driver.routing import resolve_routes
from pipeline.driver.schema_probe import table_columns
from pipeline.driver.signals import StopSignals
from pipeline.errors import ConfigError, PipelineError, Terminated
from pipeline.plan.offsets import OffsetRange, check_topic_ids, chunk_ranges, subtract_ranges
from pipeline.store import Store

log = logging.getLogger("pipeline")


@dataclass
class BackfillResult(RunResult):
    """A backfill or reprocess: a sequence of bounded runs (chunks), summed up. ``run_id``
    is the last chunk's run, ``plan`` every range asked for."""
    sequence: str | None = None  # the sequence's id, in each chunk run's details
    resumed: int = 0  # chunks an earlier, interrupted invocation of it had committed
    chunks: list = field(default_factory=list)  # per chunk: chunk, of, run_id, ranges, counts


@dataclass(frozen=True)
class BackfillPlan:
    """What a backfill will do: the ranges asked for, cut into chunks of one transaction
    each (offsets.chunk_ranges); on a rerun, only what its interrupted sequence left."""
    sequence: str
    key: dict  # what makes a rerun "the same backfill" (details.sequence.key)
    ranges: list[OffsetRange]
    done: list[OffsetRange]  # committed by an earlier invocation of this sequence
    done_chunks: int
    chunks: list[list[OffsetRange]]

    @property
    def total_chunks(self) -> int:
        return self.done_chunks + len(self.chunks)

    def chunk_dicts(self) -> list[dict]:
        return [{"chunk": self.done_chunks + i, "of": self.total_chunks,
                 "ranges": [r.as_dict() for r in chunk],
                 "offsets": sum(r.count for r in chunk)}
                for i, chunk in enumerate(self.chunks, start=1)]


def run_backfill(settings: Settings, ranges: Sequence[OffsetRange], *, reprocess: bool = False,
                 signals: StopSignals | None = None, requested: dict | None = None,
                 resume_key: dict | None = None, restart: bool = False,
                 dry_run: bool = False) -> BackfillResult:
    """Re-read explicit ranges; results are written idempotently (or replaced with
    reprocess); the stored offsets do not move. ``requested``: what the operator asked
    for (offsets or times), kept in the run rows' details. No metrics: they describe the
    scheduled ingest (a backfill is in pipeline_runs).

    The ranges run as a sequence of bounded transactions, each within the caps of an
    ingest run (kafka.max_records_per_partition / max_records_per_run): one run row,
    staging table and publish per chunk, all under the backfill lock. A rerun with the
    same ``resume_key`` (default: the ranges) after an interruption resumes with what
    that sequence has not committed (``restart``: from the beginning). ``dry_run``: the
    plan only, no lock, no Spark, nothing written."""
    timer, seen = Timer(), Seen()
    kind = "reprocess" if reprocess else "backfill"
    key = resume_key if resume_key is not None else {
        "ranges": [r.as_dict(count=False) for r in sorted(ranges)]}
    with reported(settings, kind, timer, seen, export_metrics=False, dry_run=dry_run):
        seen.result = _backfill(settings, ranges, kind, signals, requested, timer, seen,
                                key=key, restart=restart, dry_run=dry_run)
    return seen.result


def _backfill(settings: Settings, ranges: Sequence[OffsetRange], kind: str,
              signals: StopSignals | None, requested: dict | None, timer: Timer,
              seen: Seen, *, key: dict, restart: bool = False,
              dry_run: bool = False) -> BackfillResult:
    settings = table_columns(settings)  # sink.columns = "schema": the table's
    topics = sorted({r.topic for r in ranges})
    # Published as a run publishes: each topic's records into its route's table.
    routes = resolve_routes(settings, topics)
    for t in routes.tables:
        if refused := t.sink.refuses_reread(f"a {kind}"):
            raise ConfigError(refused)
    meta = KafkaMeta(settings.kafka)
    store = Store(settings)
    try:
        # One lock for the whole sequence: no second backfill between two chunks. A
        # pattern's topic whose table no run has made yet gets it (Store.tables_ready).
        additions = store.tables_ready(
            routes.sinks, create=settings.kafka.topic_pattern is not None and not dry_run)
        if not dry_run:
            store.lock_for(kind, ("backfill",))
        topic_ids = meta.topic_ids(topics)
        # Rows of a recreated topic that was not reset would mix two topics' records.
        check_topic_ids(store.offsets.topic_ids(topics), topic_ids,
                        f"this pipeline's offsets and rows of '{'/'.join(topics)}'")
        plan = plan_backfill_chunks(settings, store, kind, ranges, key, restart)
        timer.lap("plan")
        log.info("%s plan: %s in %d transactions%s", kind, describe(plan.ranges),
                 plan.total_chunks, f" ({plan.done_chunks} committed before, resuming "
                 f"sequence {plan.sequence})" if plan.done_chunks else "",
                 extra={"event": "backfill.plan", "sequence": plan.sequence,
                        "chunks": plan.total_chunks, "resumed": plan.done_chunks,
                        "ranges": [r.as_dict() for r in plan.ranges],
                        "offsets": sum(r.count for r in plan.ranges)})
        planned = [r.as_dict() for r in plan.ranges]
        if dry_run:
            return BackfillResult(kind, "planned", None, planned, sequence=plan.sequence,
                                  resumed=plan.done_chunks, chunks=plan.chunk_dicts())
        signals = signals or StopSignals()
        # A request that resolved to no offsets still leaves its (empty) run row.
        todo = plan.chunks or [[]]
        total = plan.done_chunks + len(todo)
        result = BackfillResult(kind, "succeeded", None, planned, sequence=plan.sequence,
                                resumed=plan.done_chunks)
        for i, chunk in enumerate(todo, start=plan.done_chunks + 1):
            run_id = None
            try:
                signals.check()  # a stop between two chunks: what committed stays
                log.info("%s chunk %d/%d: %s", kind, i, total, describe(chunk),
                         extra={"event": "backfill.chunk", "chunk": i, "chunks": total,
                                "ranges": [r.as_dict() for r in chunk]})
                details = {"topic_ids": topic_ids,
                           **({"requested": requested} if requested else {}),
                           "sequence": {"id": plan.sequence, "key": plan.key, "chunk": i,
                                        "chunks": total, "ranges": [
                                            r.as_dict(count=False) for r in plan.ranges]}}
                run = store.runs.start(kind, chunk, details)
                run_id = run.id
                seen.started(run_id)
                done = execute_ranges(settings, store, routes, meta, run, chunk, [], Timer(),
                                      signals, topic_ids=topic_ids, additions=additions)
            except BaseException as e:
                # A stop can reach us after the chunk's COMMIT (e.g. while it mirrors).
                committed = i - 1 + _chunk_committed(store, run_id)
                if committed == 0:  # nothing of the sequence committed: the error as it is
                    raise
                stopped = _sequence_stopped(e, kind, committed, total)
                if stopped is e:
                    raise
                raise stopped from e
            result.run_id = done.run_id
            for name in ("records_read", "rows_written", "rows_deleted", "dead_letters"):
                setattr(result, name, getattr(result, name) + getattr(done, name))
            for tp, counts in done.per_partition.items():
                merged = result.per_partition.setdefault(tp, {})
                for what, n in counts.items():
                    merged[what] = merged.get(what, 0) + n
            for table, counts in done.tables.items():
                merged = result.tables.setdefault(table, {})
                for what, n in counts.items():  # counts add up; mode and topics are kept
                    summed = type(n) is int and what in merged
                    merged[what] = merged[what] + n if summed else n
            result.chunks.append({"chunk": i, "of": total, "run_id": done.run_id,
                                  "ranges": done.plan, "records_read": done.records_read,
                                  "rows_written": done.rows_written,
                                  "rows_deleted": done.rows_deleted,
                                  "dead_letters": done.dead_letters})
            log.info("%s chunk %d/%d committed: run %s, %d records, %d rows written, %d dead "
                     "letters (%s)", kind, i, total, done.run_id, done.records_read,
                     done.rows_written, done.dead_letters, describe(chunk),
                     extra={"event": "backfill.chunk_done", "chunk": i, "chunks": total,
                            "records": done.records_read, "rows": done.rows_written,
                            "dead_letters": done.dead_letters})
        result.timings = timer.as_dict()
        return result
    finally:
        store.close()


def _chunk_committed(store: Store, run_id: int | None) -> int:
    """1 if the chunk run ``run_id`` published (its row says succeeded), else 0."""
    if run_id is None:
        return 0
    try:
        return int(store.runs.status(run_id) == "succeeded")
    except Exception:  # noqa: BLE001 - the database may be what failed: claim nothing
        return 0


def _sequence_stopped(e: BaseException, kind: str, committed: int, total: int
                      ) -> BaseException:
    """A chunk failed, or a stop came, after chunks of the sequence committed: the same
    error (same exit code), saying what is kept and how to go on."""
    if committed >= total:
        note = f"all {total} {kind} chunks are committed"
    else:
        note = (f"{kind} chunks 1-{committed} of {total} are committed and kept; rerun the "
                f"same command to resume at chunk {committed + 1}")
    log.warning("%s stopped after %d of %d chunks: %s", kind, committed, total, note,
                extra={"event": "backfill.stopped", "committed": committed, "chunks": total})
    if isinstance(e, Terminated):  # not "nothing committed": the chunks before it did
        return Terminated(f"{e.message.split(';')[0]}; {note}")
    if isinstance(e, PipelineError):
        return type(e)(f"{e.message}; {note}")
    return e


def plan_backfill_chunks(settings: Settings, store: Store, kind: str,
                         ranges: Sequence[OffsetRange], key: dict,
                         restart: bool = False) -> BackfillPlan:
    """Chunks for ``ranges``; or, when the newest sequence of this ``kind`` and ``key``
    did not finish (killed, stopped, failed), the chunks of what it has not committed
    (its committed chunk runs are in pipeline_runs: status succeeded, details.sequence).
    A finished sequence, or ``restart``, starts a new one."""
    k = settings.kafka

    def chunks_of(todo: Sequence[OffsetRange]) -> list[list[OffsetRange]]:
        return chunk_ranges(todo, max_records_per_partition=k.max_records_per_partition,
                            max_records_per_run=k.max_records_per_run)

    sequence = None if restart else store.runs.last_sequence(kind, key)
    if sequence is not None:
        asked = [OffsetRange.from_dict(d) for d in sequence["ranges"]]
        committed = store.runs.sequence_committed(kind, sequence["id"])
        done = [OffsetRange.from_dict(d) for planned in committed for d in planned]
        left = subtract_ranges(asked, done)
        if left and committed:
            return BackfillPlan(sequence["id"], key, asked, done, len(committed),
                                chunks_of(left))
    asked = sorted(r for r in ranges if r.count > 0)
    return BackfillPlan(uuid.uuid4().hex, key, asked, [], 0, chunks_of(asked))
