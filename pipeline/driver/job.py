"""One run, start to end: lock, plan, read, stage, publish, report.

Every entry point (CLI, spark-submit, Airflow) ends up here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline import faults
from pipeline.config import Settings
from pipeline.driver.kafka_meta import KafkaMeta
from pipeline.driver.publish import Publisher
from pipeline.driver.report import RunResult, Seen, Timer, describe, reported
from pipeline.driver.signals import StopSignals, overlapped
from pipeline.errors import ConfigError, DataError, PipelineError, Terminated
from pipeline.formats.registry import binary_rows
from pipeline.plan.offsets import OffsetRange, PlannedPartition, check_topic_ids, plan_ranges
from pipeline.sinks.merge import partitions_added
from pipeline.spark import errors as spark_errors
from pipeline.spark.launch import start_spark
from pipeline.store import Store

log = logging.getLogger("pipeline")


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
    try:
        store.check_schema()
        store.check_results_table()
        if not dry_run:
            store.lock_or_fail()
            store.abandon_stale_runs()
        stored = store.load_offsets(settings.kafka.topics)
        kafka = meta.topic_offsets(settings.kafka.topics)
        seen.latest = {(k.topic, k.partition): k.latest for k in kafka}
        plan = plan_ranges(
            stored, kafka, stored_topic_ids=store.load_topic_ids(settings.kafka.topics),
            starting_offsets=settings.kafka.starting_offsets,
            max_records_per_partition=settings.kafka.max_records_per_partition,
            max_records_per_run=settings.kafka.max_records_per_run,
            on_data_loss=settings.kafka.on_data_loss)
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
        for topic, (had, added) in partitions_added(stored, kafka).items():
            log.info("topic %s grew: partitions %s are new to the pipeline (it had read %s)%s",
                     topic, added, had, "; an upsert key found in two partitions keeps its "
                     "record with the latest Kafka timestamp" if settings.sink.mode == "upsert"
                     else "", extra={"event": "plan.partitions_added", "topic": topic,
                                     "added": added})
        faults.inject("after_plan")
        if dry_run:
            return RunResult("ingest", "planned", None, planned, lost)
        if plan.is_empty:
            # Nothing to read, no offset to move: no Spark, no write transaction.
            run_id = store.record_noop("ingest", plan.partitions, timer.as_dict())
            seen.started(run_id)
            log.info("run %s: nothing new to read", run_id, extra={"event": "run.noop"})
            return RunResult("ingest", "noop", run_id, planned, timings=timer.as_dict())
        run_id = store.start_run("ingest", plan.partitions, {"topic_ids": plan.topic_ids})
        seen.started(run_id)
        result = execute_ranges(settings, store, meta, run_id, "ingest", plan.ranges,
                                plan.offset_updates, timer, signals, topic_ids=plan.topic_ids)
        result.plan, result.lost = planned, lost
        return result
    finally:
        store.close()


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
    if settings.sink.mode == "aggregate":
        raise ConfigError(aggregate_refuses(settings, f"a {kind}"))
    meta = KafkaMeta(settings.kafka)
    store = Store(settings)
    reprocess = kind == "reprocess"
    try:
        store.check_schema()
        store.check_results_table()
        if not dry_run:
            # One lock for the whole sequence: no second backfill between two chunks.
            store.lock_or_fail(kind, families=("backfill",))
            store.abandon_stale_runs(("backfill",))
        topics = sorted({r.topic for r in ranges})
        topic_ids = meta.topic_ids(topics)
        # Rows of a recreated topic that was not reset would mix two topics' records.
        check_topic_ids(store.load_topic_ids(topics), topic_ids,
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
                run_id = store.start_run(kind, chunk, details)
                seen.started(run_id)
                done = execute_ranges(settings, store, meta, run_id, kind, chunk, [], Timer(),
                                      signals, overwrite=reprocess, topic_ids=topic_ids)
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
    from psycopg import sql

    if run_id is None:
        return 0
    try:
        row = store.execute(sql.SQL("SELECT status FROM {} WHERE run_id = %s").format(
            store.t("pipeline_runs")), (run_id,)).fetchone()
    except Exception:  # noqa: BLE001 - the database may be what failed: claim nothing
        return 0
    return int(row is not None and row[0] == "succeeded")


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
    import json
    import uuid

    from psycopg import sql

    from pipeline.plan.offsets import chunk_ranges, subtract_ranges

    k = settings.kafka

    def chunks_of(todo: Sequence[OffsetRange]) -> list[list[OffsetRange]]:
        return chunk_ranges(todo, max_records_per_partition=k.max_records_per_partition,
                            max_records_per_run=k.max_records_per_run)

    runs = store.t("pipeline_runs")
    row = None if restart else store.execute(sql.SQL(
        "SELECT details->'sequence' FROM {} WHERE pipeline = %s AND kind = %s "
        "AND details->'sequence'->'key' = %s::jsonb ORDER BY run_id DESC LIMIT 1")
        .format(runs), (store.pipeline, kind, json.dumps(key))).fetchone()
    if row is not None:
        sequence = row[0]
        asked = [OffsetRange(d["topic"], d["partition"], d["from"], d["until"])
                 for d in sequence["ranges"]]
        committed = [p for (p,) in store.execute(sql.SQL(
            "SELECT planned FROM {} WHERE pipeline = %s AND kind = %s AND status = "
            "'succeeded' AND details->'sequence'->>'id' = %s ORDER BY run_id").format(runs),
            (store.pipeline, kind, sequence["id"])).fetchall()]
        done = [OffsetRange(d["topic"], d["partition"], d["from"], d["until"])
                for planned in committed for d in planned]
        left = subtract_ranges(asked, done)
        if left and committed:
            return BackfillPlan(sequence["id"], key, asked, done, len(committed),
                                chunks_of(left))
    asked = sorted(r for r in ranges if r.count > 0)
    return BackfillPlan(uuid.uuid4().hex, key, asked, [], 0, chunks_of(asked))


def aggregate_refuses(settings: Settings, what: str) -> str:
    """Why an aggregate pipeline refuses to read a range twice."""
    return (f"pipeline '{settings.name}' aggregates (sink.mode = 'aggregate'): its totals in "
            f"{settings.sink.table} already count every committed record once, and {what} "
            "would count them again; refused, nothing changed - to rebuild the totals from "
            f"what Kafka still holds, empty {settings.sink.table} (TRUNCATE, as its owner) "
            "and rewind with 'pipeline offsets set --to earliest'; to recount a range, keep "
            "an append pipeline of the topic and derive the totals from it in SQL")


def execute_ranges(settings: Settings, store: Store, meta: KafkaMeta, run_id: int, kind: str,
                   ranges: Sequence[OffsetRange], offset_updates: Sequence[PlannedPartition],
                   timer: Timer, signals: StopSignals | None, overwrite: bool = False,
                   topic_ids: dict[str, str] | None = None) -> RunResult:
    """Read and stage ``ranges``, then publish them with ``offset_updates``; ``topic_ids``:
    the Kafka topic IDs the ranges were planned on, checked again after the read."""
    signals = signals or StopSignals()
    try:
        store.create_staging(run_id)
        sc = None
        if ranges:
            sc = start_spark(settings)
            signals.sc = sc
            timer.lap("spark_start")
            log.info("Spark started in %.1f s", timer.stages["spark_start"],
                     extra={"event": "spark.start", "duration": timer.stages["spark_start"]})
        binary = not settings.sink.transform and binary_rows(settings.sink.format)
        with Publisher(store, run_id, kind, ranges, overwrite=overwrite,
                       binary=binary) as publisher:
            if sc is not None:
                overlapped(lambda: stage(sc, settings, store, run_id, ranges),
                           publisher.take, signals)
                timer.lap("read_and_stage")
            # What one attempt of each task staged: a retried task is not counted twice.
            staged = publisher.staged()
            staged_dead = sum(v["dead"] for v in staged.values())
            if sc is not None:
                records = sum(sum(v.values()) for v in staged.values())
                log.info("read and staged %d records of %s in %.1f s", records,
                         describe(ranges), timer.stages["read_and_stage"],
                         extra={"event": "read.done", "records": records,
                                "dead_letters": staged_dead, "tasks": len(publisher.parts),
                                "ranges": [r.as_dict() for r in ranges],
                                "duration": timer.stages["read_and_stage"]})
            limit = settings.sink.max_bad_records
            if limit >= 0 and staged_dead > limit:
                raise DataError(
                    f"run {run_id}: {staged_dead} bad records in {describe(ranges)} exceed "
                    f"sink.max_bad_records = {limit}; nothing committed - inspect the topic "
                    "or raise the limit")
            faults.inject("after_stage")
            if topic_ids and ranges:
                # A topic recreated after the plan: what was read may be either topic's.
                check_topic_ids({t: {i} for t, i in topic_ids.items()},
                                meta.topic_ids(list(topic_ids)), "the planned ranges")
            with signals.shielded():
                published = publisher.finish(offset_updates, timer.as_dict(), topic_ids)
        timer.lap("publish")
        log.info("run %s %s: published %d rows (%d deleted), %d dead letters from %d records; "
                 "offsets %s", run_id, kind, published["rows_written"],
                 published["rows_deleted"], published["dead_letters"],
                 published["records_read"],
                 ", ".join(f"{u.range.topic}[{u.range.partition}] -> {u.range.until_offset}"
                           for u in offset_updates) or "unchanged",
                 extra={"event": "publish.done", "records": published["records_read"],
                        "rows": published["rows_written"],
                        "rows_deleted": published["rows_deleted"],
                        "dead_letters": published["dead_letters"],
                        "offsets": [{"topic": u.range.topic, "partition": u.range.partition,
                                     "from": u.range.from_offset,
                                     "until": u.range.until_offset} for u in offset_updates],
                        "duration": timer.stages["publish"]})
    except BaseException as caught:
        e = signals.stop_error(caught)
        try:
            message = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
            store.fail_run(run_id, message, getattr(e, "exit_code", 1), timer.as_dict())
            store.drop_staging(run_id)
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
                     records_read=published["records_read"],
                     rows_written=published["rows_written"],
                     rows_deleted=published["rows_deleted"],
                     dead_letters=published["dead_letters"],
                     per_partition=published["per_partition"], timings=timer.as_dict())


def stage(sc, settings: Settings, store: Store, run_id: int,
          ranges: Sequence[OffsetRange]) -> None:
    """Executors read the planned ranges and store them as COPY text, one blob per batch,
    in this run's staging table; nothing is collected on the driver but one tiny summary
    row per task. The built-in sinks read with confluent-kafka inside Spark tasks
    (stage_ranges); a user transform gets Spark's Kafka source (stage_transformed)."""
    sc.setJobGroup(f"run-{run_id}", f"{settings.name} run {run_id}: {describe(ranges)}",
                   interruptOnCancel=True)
    try:
        if settings.sink.transform:
            stage_transformed(sc, settings, store, run_id, ranges)
        else:
            stage_ranges(sc, settings, store, run_id, ranges)
    except Exception as e:
        raise classify_spark_error(e, settings, ranges) from None


def stage_ranges(sc, settings: Settings, store: Store, run_id: int,
                 ranges: Sequence[OffsetRange]) -> None:
    """Big ranges split into read tasks (split.split_ranges), small ones packed into a few
    Spark tasks (split.pack_ranges): each task reads its ranges exactly with one consumer
    (consume.read_ranges), encodes them (encode.Encoder) and stages the lines in one
    transaction (stage.range_stager)."""
    from pipeline.executor.consume import reader_config
    from pipeline.executor.stage import range_stager
    from pipeline.executor.task import EncoderSettings, RangeStageTask, StagingTarget
    from pipeline.plan.split import pack_ranges, split_ranges

    slots = max(sc.defaultParallelism, settings.spark.min_partitions)
    tasks = pack_ranges(split_ranges(ranges, slots), slots)
    k = settings.kafka
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-reader")
    columns = tuple((c.name, c.type, c.required) for c in settings.sink.columns)
    stager = range_stager(RangeStageTask(
        StagingTarget(store.url, *store.staging_copy(run_id)), reader, k.timeout_seconds,
        EncoderSettings(settings.sink.format, columns, run_id,
                        settings.sink.key if settings.sink.deletes else ())))
    log.info("run %s: %d read tasks for %s", run_id, len(tasks), describe(ranges),
             extra={"event": "read.start", "tasks": len(tasks),
                    "ranges": [r.as_dict() for r in ranges]})
    # One group per Spark partition: parallelize slices a list of n items into n partitions
    # of one item each.
    sc.parallelize(tasks, len(tasks)).mapPartitions(stager).collect()


def stage_transformed(sc, settings: Settings, store: Store, run_id: int,
                      ranges: Sequence[OffsetRange]) -> None:
    """A user transform works on a DataFrame of the good rows: Spark's Kafka source reads
    once, Spark SQL parses and marks each record (transform.mark) into the executors'
    cache (never the driver), and both outputs are staged from it."""
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pipeline.errors import ConfigError
    from pipeline.executor.stage import WRITER_SCHEMA, blob_writer, line_frame
    from pipeline.executor.task import LineStageTask, StagingTarget
    from pipeline.plan.split import pack_ranges, split_ranges
    from pipeline.spark.read import read_ranges
    from pipeline.spark.transform import mark, split
    from pipeline.store import tables

    spark = SparkSession.builder.getOrCreate()  # on sc, with its conf (UTC session)
    records = read_ranges(spark, settings.kafka, ranges, settings.spark.min_partitions)
    # Spark's Kafka source makes one task per partition: a wide topic with a few records
    # per partition would pay a task's fixed cost per partition. No more tasks than the
    # built-in sinks would run (coalesce: no shuffle, a task reads its partitions in turn;
    # never more partitions than the source made, and at least spark.min_partitions).
    slots = max(sc.defaultParallelism, settings.spark.min_partitions)
    records = records.coalesce(max(len(pack_ranges(split_ranges(ranges, slots), slots)), 1))
    columns = tables.typed(tables.from_record(store.records))
    dead_columns = tables.typed(tables.DEAD_LETTER_FIELDS)
    # The parse is cached, not the records: each output filters the cache, and the parse
    # runs once per record (a filter over an uncached parse is pushed below it and parses
    # again per check).
    cached = mark(records, settings.sink).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        results, dead = split(cached, settings.sink)
        missing = [n for n, _ in columns if n not in results.columns]
        if missing:
            raise ConfigError(f"results lack the columns {missing} of table "
                              f"{settings.sink.table}; a transform must keep them")
        good = results.select(*[F.col(f"`{n}`") for n, _ in columns],
                              F.lit(None).cast("string").alias("error_code"))
        lines = line_frame(good, columns, dead_columns, run_id, F, dead=False).unionByName(
            line_frame(dead, columns, dead_columns, run_id, F, rows=False))
        declared = [(c.name, c.type) for c in settings.sink.columns]
        writer = blob_writer(LineStageTask(
            StagingTarget(store.url, *store.staging_copy(run_id)), declared))
        lines.mapInArrow(writer, WRITER_SCHEMA).collect()
    finally:
        cached.unpersist()


def classify_spark_error(e: Exception, settings: Settings,
                         ranges: Sequence[OffsetRange] = ()) -> Exception:
    """The run's error for a failed Spark job (pipeline/spark/errors.py), asking Kafka,
    when Spark could not read planned offsets, which end of the range moved."""
    return spark_errors.classify_spark_error(
        e, settings, ranges, lambda tps: KafkaMeta(settings.kafka).offsets(tps))
