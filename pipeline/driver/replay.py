"""``pipeline dead-letters replay`` on the driver: re-decode chosen dead letters with the
current ``[sink]`` and, in ONE Postgres transaction, land the rows that now succeed through
the pipeline's sink (append: insert; upsert: the newest-wins merge; aggregate: added to the
totals), move their dead letters to pipeline_dead_letters_replayed, give the ones that still
fail their new reason, and write the run row (kind 'replay').

Exactly once: the dead letters are locked (FOR UPDATE) and leave the table in the very
transaction that writes their rows, so a second replay finds only what still fails, and a
crash before COMMIT leaves everything as it was. The run holds the pipeline's ingest and
backfill locks (store/run.py FAMILIES): it takes turns with the scheduled ingest and with
backfills, which also write rows and dead letters of old offsets. Columns sink.evolve adds
come first, in a short transaction of their own (store/evolve.py).

A dry run takes no lock and changes nothing: it reads the chosen dead letters without FOR
UPDATE, and merges into private copies of the rows the merge would meet (store/shadow.py),
with the columns evolve would add; then rolls back. Its counts are the real run's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import groupby
from typing import Any

from psycopg import sql
from sqlalchemy.schema import CreateTable

from pipeline import faults
from pipeline.config import Settings
from pipeline.driver.replay_records import decode, refusal
from pipeline.driver.report import Timer
from pipeline.driver.schema_probe import table_columns
from pipeline.errors import ConfigError
from pipeline.plan.offsets import OffsetRange
from pipeline.sinks import Sink, for_settings
from pipeline.store import Store, tables
from pipeline.store.copy_in import copy_in
from pipeline.store.dead_letters import DeadLetterFilter
from pipeline.store.evolve import Addition
from pipeline.store.identifiers import identifiers
from pipeline.store.replay import REFAILED
from pipeline.store.run import Kind, Run

log = logging.getLogger("pipeline")

ROWS = "_replay_rows"  # temp table: the replayed rows, merged by the sink
# The locks a replay holds: the ingest's and the backfills' (both write rows and dead letters).
REPLAY_FAMILIES = ("ingest", "backfill")


@dataclass
class ReplayReport:
    pipeline: str
    run_id: int | None
    dry_run: bool
    chosen: int = 0
    columns_added: list[str] = field(default_factory=list)  # sink.evolve (would add)
    replayed: int = 0
    still_failing: int = 0
    reasons_changed: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    per_partition: dict[str, dict[str, int]] = field(default_factory=dict)
    still_failing_by_type: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _DryRun(Exception):
    """Rolls a dry run's transaction back once its counts are known."""


def run_replay(settings: Settings, f: DeadLetterFilter, *, dry_run: bool = False
               ) -> ReplayReport:
    if why := refusal(settings):
        raise ConfigError(why)
    timer = Timer()
    settings = table_columns(settings)  # sink.columns = "schema": the table's
    sink = for_settings(settings)
    with Store(settings) as store:
        store.schema.check([sink])
        # The fixed config's columns must be the table's.
        additions = store.schema.check_results_tables([sink])
        if dry_run:  # no lock, no run row, no ALTER: computed, then rolled back
            run = Run(0, Kind.REPLAY, settings.name, settings.schema)
            report = ReplayReport(settings.name, None, True)
            try:
                _replay(store, sink, settings, run, f, report, timer, additions)
            except _DryRun:  # as the replay: columns only if it has dead letters to replay
                report.columns_added = [a.column for a in store.evolution.missing(additions)]
            return report
        store.locks.lock_or_fail("dead-letter replay", families=REPLAY_FAMILIES)
        store.runs.abandon_stale(REPLAY_FAMILIES)
        run = store.runs.start(Kind.REPLAY, details={"filters": f.as_dict()})
        report = ReplayReport(settings.name, run.id, False)
        try:
            if additions and store.dead_letters.counts(f):  # sink.evolve, on its own
                report.columns_added = store.evolution.add_columns(run.id, additions)
            _replay(store, sink, settings, run, f, report, timer, additions)
        except BaseException as e:
            try:
                store.runs.fail(run, getattr(e, "message", None) or f"{type(e).__name__}: {e}",
                                getattr(e, "exit_code", 1), timer.as_dict())
            except Exception:  # noqa: BLE001 - the database may be what failed
                log.debug("could not record the failure of run %s", run.id, exc_info=True)
            raise
    log.info("run %s replay: %d dead letters chosen, %d replayed into %d rows, %d still "
             "failing (%d with a new reason)", run.id, report.chosen, report.replayed,
             report.rows_written, report.still_failing, report.reasons_changed,
             extra={"event": "replay.done", "run_id": run.id, "chosen": report.chosen,
                    "replayed": report.replayed, "still_failing": report.still_failing})
    return report


def _replay(store: Store, sink: Sink, settings: Settings, run: Run, f: DeadLetterFilter,
            report: ReplayReport, timer: Timer, additions: Sequence[Addition]) -> None:
    from pipeline.errors import TaskError
    from pipeline.executor.task import EncoderSettings
    from pipeline.spark.errors import task_error

    dry, replay = report.dry_run, store.replay
    # The executors' encoder, built as job.stage_ranges builds it: the same rows.
    encoder = EncoderSettings.for_settings(settings, run.id).encoder()
    with store.transaction() as conn:
        store.set_timeouts(conn)
        report.chosen = replay.choose(f, lock=not dry)
        if not report.chosen:
            log.info("replay: no dead letter of pipeline '%s' matches %s", settings.name,
                     f.as_dict() or "(all)")
            if not dry:
                store.runs.finish_noop(run.id, timer.as_dict())
            return
        store.run(CreateTable(tables.record_batch(sink.settings, ROWS)))
        replay.refailed_table()
        cols = identifiers(c.name for c in tables.written(sink.records))
        spans: dict[tuple[str, int], list[int]] = {}
        for page in replay.chosen_pages():
            for (topic, partition), group in groupby(page, key=lambda r: (r[0], r[1])):
                rows = list(group)
                try:
                    d = decode(encoder, topic, partition, rows)
                except TaskError as e:  # the avro format's schema source failed as a whole
                    raise task_error(e) from None
                _copy(conn, ROWS, cols, d.rows, encoder.binary)
                _copy(conn, ROWS, identifiers(tables.tombstone_columns(sink.settings)),
                      d.tombstones)
                _copy(conn, REFAILED, identifiers(c.name for c in tables.DEAD_LETTER_FIELDS),
                      d.dead)
                name = f"{topic}[{partition}]"
                part = report.per_partition.setdefault(name, {"replayed": 0,
                                                              "still_failing": 0})
                part["replayed"] += len(d.replayed)
                part["still_failing"] += len(d.failing)
                span = spans.setdefault((topic, partition), [rows[0][2], rows[-1][2]])
                span[1] = rows[-1][2]
                log.info("replay %s offsets %d-%d: %d decode now, %d still fail", name,
                         rows[0][2], rows[-1][2], len(d.replayed), len(d.failing),
                         extra={"event": "replay.partition", "topic": topic,
                                "partition": partition, "from": rows[0][2],
                                "to": rows[-1][2], "replayed": len(d.replayed),
                                "still_failing": len(d.failing)})
        if dry:  # the sink's own merge, into private copies: the real run's counts
            merged = store.shadow.of(sink, conn, ROWS, additions).merge(conn, ROWS, run)
        else:  # the one lock order: merge lock, results, dead-letter lock, dead letters
            sink.lock_merges(conn)
            merged = sink.merge(conn, ROWS, run)
        report.rows_written, report.rows_deleted = merged.rows, merged.deleted
        report.still_failing_by_type = dict(conn.execute(sql.SQL(
            "SELECT error_type, count(*) FROM {} GROUP BY 1 ORDER BY 2 DESC").format(
                sql.Identifier(REFAILED))).fetchall())
        if dry:
            report.replayed = replay.count_replayed()
            report.reasons_changed = replay.count_refailed_changed()
            report.still_failing = report.chosen - report.replayed
            raise _DryRun
        store.dead_letters.lock(conn)
        report.replayed = replay.move_replayed(run.id)
        report.reasons_changed = replay.update_refailed()
        report.still_failing = report.chosen - report.replayed
        faults.inject("replay_before_commit")
        timer.lap("replay")
        store.runs.set_planned(run.id, [OffsetRange(t, p, lo, hi + 1)
                                        for (t, p), (lo, hi) in sorted(spans.items())])
        store.runs.add_details(run.id, {"replayed": report.replayed,
                                        "reasons_changed": report.reasons_changed,
                                        "still_failing_by_type": report.still_failing_by_type})
        # Last: its finished_at is the clock's as the transaction ends.
        store.runs.succeed(run, records_read=report.chosen, rows_written=merged.rows,
                           dead_letters=report.still_failing,
                           per_partition=report.per_partition, timings=timer.as_dict(),
                           rows_deleted=merged.deleted)
    # COMMIT: the rows, the moved and updated dead letters and the run row, at once.


def _copy(conn, table: str, cols, lines: list, binary: bool = False) -> None:
    if lines:
        with conn.cursor() as cur:
            copy_in(cur, sql.Identifier(table), cols, lines, binary)
