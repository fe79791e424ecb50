"""One run, start to end: lock, topics, plan, routes, tables, read, stage, publish, report.

Every entry point (CLI, spark-submit, Airflow) ends up here; a backfill is a sequence of these
runs (driver/backfill.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pipeline import faults
from pipeline.config import Settings
from pipeline.driver.kafka_meta import KafkaMeta
from pipeline.driver.publish import Publisher
from pipeline.driver.report import RunResult, Seen, Timer, describe, reported
from pipeline.driver.routing import (
    RunRoutes,
    RunTable,
    resolve_routes,
    run_topics,
    stored_elsewhere,
)
from pipeline.driver.schema_probe import with_schema_columns
from pipeline.driver.signals import StopSignals, overlapped
from pipeline.driver.transaction_cut import NeedsUncapped, check_transaction_topic, decide_cut
from pipeline.driver.transaction_prefetch import TransactionPrefetch
from pipeline.errors import DataError
from pipeline.plan.offsets import (
    OffsetRange,
    Plan,
    PlannedPartition,
    check_topic_ids,
    plan_ranges,
)
from pipeline.sinks.upsert import partitions_added
from pipeline.spark import errors as spark_errors
from pipeline.spark.launch import start_spark
from pipeline.store import Store
from pipeline.store.evolve import Addition
from pipeline.store.run import Kind, Run
from pipeline.store.schema import unresolved

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class TransactionPlan:
    """[sink] transactions: what the cut needs of the plan. ``partitions``: every planned
    partition (empty ranges too); ``capped``: a range ends before the partition's latest
    offset (kafka.max_records_per_*); ``uncapped``: the plan again without the caps."""

    partitions: tuple[PlannedPartition, ...]
    capped: bool
    uncapped: Callable[[], Plan]


def run_ingest(settings: Settings, *, dry_run: bool = False,
               signals: StopSignals | None = None) -> RunResult:
    """The scheduled run: read every partition from its stored next offset. It exports
    its metrics ([metrics]), whatever its outcome; a dry run does not."""
    timer, seen = Timer(), Seen()
    with reported(settings, "ingest", timer, seen, export_metrics=not dry_run,
                  dry_run=dry_run):
        seen.result = _ingest(settings, dry_run, signals, timer, seen)
    return seen.result


def _ingest(settings: Settings, dry_run: bool, signals: StopSignals | None, timer: Timer,
            seen: Seen) -> RunResult:
    meta = KafkaMeta(settings.kafka)
    store = Store(settings)
    pattern = settings.kafka.topic_pattern is not None
    try:
        # A list of topics: the tables are the config's, checked before the lock as always.
        # A pattern: the topics (and so the tables) are known once the lock is held.
        routes = None if pattern else resolve_routes(settings, settings.kafka.topics)
        if routes is not None:
            additions = store.ready_for("run", routes.sinks, lock=not dry_run)
        elif dry_run:
            store.schema.check([])
        else:
            store.lock_for("run")
        topics = run_topics(settings, meta)
        stored = store.offsets.load(topics)
        kafka = meta.topic_offsets(topics)
        seen.latest = {(k.topic, k.partition): k.latest for k in kafka}
        def plan_of(capped: bool = True) -> Plan:
            k = settings.kafka
            return plan_ranges(
                stored, kafka, stored_topic_ids=store.offsets.topic_ids(topics),
                starting_offsets=k.starting_offsets,
                max_records_per_partition=k.max_records_per_partition if capped else None,
                max_records_per_run=k.max_records_per_run if capped else None,
                on_data_loss=k.on_data_loss)

        plan = plan_of()
        timer.lap("plan")
        seen.plan = plan
        planned = [p.as_dict() for p in plan.partitions]
        lost = [r.as_dict() for r in plan.lost_ranges]
        log.info("plan: %s", describe(plan.ranges),
                 extra={"event": "plan", "ranges": [r.as_dict() for r in plan.ranges],
                        "partitions": len(plan.partitions), "offsets": plan.offset_span,
                        "duration": timer.stages["plan"]})
        for gap in plan.lost_ranges:
            log.warning("data loss skipped (on_data_loss=skip): %s was deleted before it was read",
                        gap, extra={"event": "plan.data_loss_skipped", **gap.as_dict()})
        if routes is None:
            routes = resolve_routes(settings, topics)
            _report_topics(settings, store, topics, routes)
            # Every table of the run's topics, checked (and its columns to add planned)
            # before anything is read; a new topic's table is made first.
            additions = _pattern_tables_ready(store, routes, dry_run)
        for topic, (had, added) in partitions_added(stored, kafka).items():
            log.info("topic %s grew: partitions %s are new to the pipeline (it had read %s)%s",
                     topic, added, had, routes.table_of(topic).sink.growth_note(),
                     extra={"event": "plan.partitions_added", "topic": topic, "added": added})
        faults.inject("after_plan")
        if dry_run:
            return RunResult("ingest", "planned", None, planned, lost,
                             tables=routes.as_dict())
        if plan.is_empty:
            # Nothing to read, no offset to move: no Spark, no write transaction.
            run_id = store.runs.record_noop(Kind.INGEST, plan.partitions, timer.as_dict())
            seen.started(run_id)
            log.info("run %s: nothing new to read", run_id, extra={"event": "run.noop"})
            return RunResult("ingest", "noop", run_id, planned, timings=timer.as_dict())
        if settings.sink.columns_from_schema:
            # sink.columns = "schema" (a pipeline of one table: settings/document.py): the
            # columns and key from the writer's schema of the planned ranges, then the table
            # made or checked (driver/schema_probe.py).
            settings, _, additions = with_schema_columns(settings, store, plan.ranges)
            routes = resolve_routes(settings, topics)
        whole = None
        if settings.sink.transactions is not None:
            check_transaction_topic(settings, meta, store)  # before anything is read
            whole = TransactionPlan(
                plan.partitions,
                any(p.range.until_offset < seen.latest.get(p.range.tp, 0)
                    for p in plan.partitions), lambda: plan_of(capped=False))
        run = store.runs.start(Kind.INGEST, plan.partitions, {"topic_ids": plan.topic_ids})
        seen.started(run.id)
        result = execute_ranges(settings, store, routes, meta, run, plan.ranges,
                                plan.offset_updates, timer, signals, topic_ids=plan.topic_ids,
                                additions=additions, transactions=whole)
        result.plan, result.lost = planned, lost
        return result
    finally:
        store.close()


def _pattern_tables_ready(store: Store, routes: RunRoutes,
                          dry_run: bool) -> tuple[Addition, ...]:
    """A pattern's run: its tables as its routes say (Store.tables_ready), a table not
    there yet made (a dry run only says it would be)."""
    # sink.columns = "schema": a table no run has read the columns of is made by
    # with_schema_columns once the plan is known.
    sinks = [s for s in routes.sinks if not unresolved(s)]
    if not dry_run:
        return store.tables_ready(sinks, create=True)
    missing = store.schema.missing_tables(sinks)
    for name in missing:
        log.info("dry run: table %s would be created", name,
                 extra={"event": "tables.would_create", "table": name})
    return store.tables_ready([s for s in sinks if s.results.name not in missing])


def _report_topics(settings: Settings, store: Store, topics: Sequence[str],
                   routes: RunRoutes) -> None:
    """A pattern's topics this run, and stored ones it no longer finds (their offsets stay,
    unread)."""
    log.info("kafka.topic_pattern = %r: %d topics (%s)", settings.kafka.topic_pattern,
             len(topics), routes.describe(),
             extra={"event": "plan.topics", "topics": list(topics),
                    "tables": routes.as_dict()})
    # The transaction topic's offset ([sink] transactions) is stored beside the data's.
    stored = {t for t, _ in store.offsets.load()} - {settings.sink.transactions}
    gone = stored_elsewhere(stored, topics)
    if gone:
        log.warning("topics %s have stored offsets but are not on the broker or no longer "
                    "match kafka.topic_pattern: not read ('pipeline offsets reset' forgets a "
                    "deleted one)", ", ".join(gone),
                    extra={"event": "plan.topics_gone", "topics": gone})


def execute_ranges(settings: Settings, store: Store, routes: RunRoutes, meta: KafkaMeta,
                   run: Run, ranges: Sequence[OffsetRange],
                   offset_updates: Sequence[PlannedPartition], timer: Timer,
                   signals: StopSignals | None, topic_ids: dict[str, str] | None = None,
                   additions: Sequence[Addition] = (),
                   transactions: TransactionPlan | None = None) -> RunResult:
    """Read and stage ``ranges``, then publish them into their topics' tables (``routes``)
    with ``offset_updates``, in one transaction; ``topic_ids``: the Kafka topic IDs the
    ranges were planned on, checked again after the read; ``additions``: the columns
    sink.evolve adds first (Store.tables_ready planned them); ``transactions``: [sink]
    transactions' plan, the run is cut at whole source transactions
    (driver/transaction_cut.py)."""
    signals = signals or StopSignals()
    run_id, kind = run.id, str(run.kind)
    tables = routes.reading(ranges)
    prefetch = None
    try:
        if ranges and additions:
            # sink.evolve: before anything is read, in short transactions of their own, so
            # that readers of the table never queue behind a publishing transaction
            # (store/evolve.py).
            store.evolution.add_columns(run_id, additions)
        store.staging.create(run)
        sc = None
        if ranges and transactions is not None:
            # The transaction topic's ENDs are read while Spark starts and reads the data
            # (from where they stand now), not after the read: the cut keeps them
            # (driver/transaction_prefetch.py).
            prefetch = TransactionPrefetch.start(
                settings, meta, lambda: store.offsets.load([settings.sink.transactions]))
        if ranges:
            sc = start_spark(settings, sum(r.count for r in ranges))
            signals.sc = sc
            timer.lap("spark_start")
            log.info("Spark started in %.1f s", timer.stages["spark_start"],
                     extra={"event": "spark.start", "duration": timer.stages["spark_start"]})
        while True:
            try:
                published, offset_updates = _read_and_publish(
                    settings, store, routes, meta, run, sc, tables, ranges, offset_updates,
                    timer, signals, topic_ids, transactions, prefetch)
                break
            except NeedsUncapped as blocked:
                # A source transaction larger than the run's budget: read to the latest
                # offsets (the plan without kafka.max_records_per_*), so it is published whole.
                plan = transactions.uncapped()
                log.info("run %s: nothing could be published whole within the planned ranges "
                         "(%s): planning again without kafka.max_records_per_partition/"
                         "per_run, %s", run_id, blocked, describe(plan.ranges),
                         extra={"event": "transactions.uncapped",
                                "ranges": [r.as_dict() for r in plan.ranges]})
                transactions = replace(transactions, partitions=plan.partitions, capped=False)
                ranges, offset_updates = plan.ranges, plan.offset_updates
                tables = routes.reading(ranges)
                store.runs.set_planned(run_id, ranges)
                store.staging.drop(run)
                store.staging.create(run)
        timer.lap("publish")
        log.info("run %s %s: published %d rows (%d deleted), %d dead letters from %d records "
                 "into %s; offsets %s", run_id, kind, published.rows_written,
                 published.rows_deleted, published.dead_letters, published.records_read,
                 ", ".join(published.tables) or "no table",
                 ", ".join(f"{u.range.topic}[{u.range.partition}] -> {u.range.until_offset}"
                           for u in offset_updates) or "unchanged",
                 extra={"event": "publish.done", "records": published.records_read,
                        "rows": published.rows_written,
                        "rows_deleted": published.rows_deleted,
                        "dead_letters": published.dead_letters,
                        "tables": published.tables,
                        "offsets": [u.range.as_dict(count=False) for u in offset_updates],
                        "duration": timer.stages["publish"]})
    except BaseException as caught:
        if prefetch is not None:
            prefetch.close()
        with signals.held():
            e = signals.stop_error(caught)
            try:
                message = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
                store.runs.fail(run, message, getattr(e, "exit_code", 1), timer.as_dict())
                store.staging.drop(run)
            except Exception:  # noqa: BLE001 - the database may be the thing that failed
                log.debug("could not record the failure of run %s", run_id, exc_info=True)
        if e is caught:
            raise
        raise e from caught
    faults.inject("after_commit")
    if settings.kafka.mirror_group and offset_updates:
        meta.mirror_offsets(settings.kafka.mirror_group,
                            {u.range.tp: u.range.until_offset for u in offset_updates})
    return RunResult(kind, "succeeded", run_id, [r.as_dict() for r in ranges],
                     **published.counts(), timings=timer.as_dict())


def _read_and_publish(settings: Settings, store: Store, routes: RunRoutes, meta: KafkaMeta,
                      run: Run, sc, tables: Sequence[RunTable], ranges: Sequence[OffsetRange],
                      offset_updates: Sequence[PlannedPartition], timer: Timer,
                      signals: StopSignals, topic_ids: dict[str, str] | None,
                      transactions: TransactionPlan | None,
                      prefetch: TransactionPrefetch | None = None):
    """execute_ranges' read, stage and publishing transaction: (Published, the offset
    updates committed); ``prefetch``: the transaction topic's ENDs being read meanwhile."""
    run_id = run.id
    with Publisher(store, tables, run, ranges,
                   whole_transactions=transactions is not None) as publisher:
        if sc is not None:
            overlapped(lambda: publisher.expect_readers(
                stage(sc, settings, routes, run, ranges, publisher.choose_wire)),
                publisher.take, signals)
            timer.lap("read_and_stage")
        # What one attempt of each task staged: a retried task is not counted twice.
        staged = publisher.staged()
        staged_dead = sum(v["dead"] for v in staged.values())
        if sc is not None:
            records = publisher.records_read(staged)
            log.info("read and staged %d records of %s in %.1f s", records,
                     describe(ranges), timer.stages["read_and_stage"],
                     extra={"event": "read.done", "records": records,
                            "dead_letters": staged_dead, "tasks": len(publisher.parts),
                            "ranges": [r.as_dict() for r in ranges],
                            "duration": timer.stages["read_and_stage"]})
        for t in tables:
            _check_bad_records(run_id, t, ranges, staged, several=len(tables) > 1)
        faults.inject("after_stage")
        if topic_ids and ranges:
            # A topic recreated after the plan: what was read may be either topic's.
            check_topic_ids({t: {i} for t, i in topic_ids.items()},
                            meta.topic_ids(list(topic_ids)), "the planned ranges")
        cut = None
        if transactions is not None:
            cut = decide_cut(settings, store, meta, publisher.segments(),
                             transactions.partitions, run_id, transactions.capped, prefetch)
            offset_updates = cut.offset_updates(offset_updates)
        with signals.shielded():
            published = publisher.finish(offset_updates, timer.as_dict(), topic_ids,
                                         cut=cut)
    return published, offset_updates


def _check_bad_records(run_id: int, table: RunTable, ranges: Sequence[OffsetRange],
                       staged: dict[tuple[str, int], dict[str, int]], *,
                       several: bool) -> None:
    """sink.max_bad_records, per table: the dead letters of its topics in this run
    (``several``: the run writes several tables, the message names this one)."""
    limit = table.route.max_bad_records
    dead = sum(v["dead"] for (topic, _), v in staged.items() if topic in table.topics)
    if limit >= 0 and dead > limit:
        mine = [r for r in ranges if r.topic in table.topics]
        where = f" (table {table.name})" if several else ""
        raise DataError(
            f"run {run_id}: {dead} bad records in {describe(mine)}{where} "
            f"exceed sink.max_bad_records = {limit}; nothing committed - inspect the topic "
            "or raise the limit")


def stage(sc, settings: Settings, routes: RunRoutes, run: Run, ranges: Sequence[OffsetRange],
          choose_wire: Callable[[bool], None] = lambda binary: None) -> int:
    """Executors read the planned ranges and store them as COPY rows, one blob per batch,
    in this run's staging table; nothing is collected on the driver but one tiny summary
    row per task. The built-in sinks read with confluent-kafka inside Spark tasks
    (stage_ranges); a user transform gets a DataFrame fed by the same reading
    (stage_transformed), whose rows' wire it tells ``choose_wire`` before its job. Returns
    the read tasks a transform's run staged summaries for under their own parts (0 for the
    built-in sinks, whose tasks stage both)."""
    sc.setJobGroup(f"run-{run.id}", f"{settings.name} run {run.id}: {describe(ranges)}",
                   interruptOnCancel=True)
    try:
        if settings.sink.transform:
            from pipeline.driver.transform_job import stage_transformed

            # A transform writes one table (settings/routes.py): its route is [sink] with
            # the table resolved.
            (table,) = routes.tables
            return stage_transformed(sc, replace(settings, sink=table.route), run, ranges,
                                     choose_wire)
        stage_ranges(sc, settings, routes, run, ranges)
        return 0
    except Exception as e:
        raise spark_errors.classify_spark_error(e, settings, ranges) from None


def stage_ranges(sc, settings: Settings, routes: RunRoutes, run: Run,
                 ranges: Sequence[OffsetRange]) -> None:
    """Big ranges split into read tasks (split.split_ranges), small ones packed into a few
    Spark tasks (split.pack_ranges): each task reads its ranges exactly with one consumer
    (consume.read_ranges), encodes each topic's records by its route (encode.Encoder) and
    stages the lines in one transaction (stage.range_stager)."""
    from pipeline.executor.consume import reader_config
    from pipeline.executor.stage import range_stager
    from pipeline.executor.task import RangeStageTask, StagingTarget
    from pipeline.plan.split import pack_ranges, split_ranges

    slots = max(sc.defaultParallelism, settings.spark.min_partitions)
    # [sink] transactions: a partition's range is read whole by one task, whose summary by
    # source transaction counts a change written twice once (executor/segments.py).
    whole = settings.sink.transactions is not None
    tasks = pack_ranges(split_ranges(ranges, slots, whole=whole), slots)
    k = settings.kafka
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-reader")
    stager = range_stager(RangeStageTask(
        StagingTarget(settings.database_url, *run.staging_copy()), reader, k.timeout_seconds,
        routes.encodings(settings, run.id)), transactions=whole)
    log.info("run %s: %d read tasks for %s", run.id, len(tasks), describe(ranges),
             extra={"event": "read.start", "tasks": len(tasks),
                    "ranges": [r.as_dict() for r in ranges]})
    # One group per Spark partition: parallelize slices a list of n items into n partitions
    # of one item each.
    sc.parallelize(tasks, len(tasks)).mapPartitions(stager).collect()
