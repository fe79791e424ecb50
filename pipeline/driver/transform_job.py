"""A run's read and stage with a user transform ([sink] transform): the read tasks as a
DataFrame (executor/transform/feed.py), the user's code over it (spark/transform.py), its output
staged by the writer (executor/transform/writer.blob_writer). driver/job.stage calls it in place of
the built-in path's stage_ranges; everything before and after (plan, publish) is the
run's (driver/job.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from pipeline.config import Settings
from pipeline.driver.report import describe
from pipeline.plan.offsets import OffsetRange
from pipeline.store.run import Run

log = logging.getLogger("pipeline")


def stage_transformed(sc, settings: Settings, run: Run, ranges: Sequence[OffsetRange],
                      choose_wire: Callable[[bool], None] = lambda binary: None) -> int:
    """A user transform works on a DataFrame of the good records, read and decoded by the
    built-in sinks' own reader and Encoder (executor/transform/feed.py: one Spark partition
    per read task, the tasks stage_ranges would run), which stages the dead letters and each
    range's summary itself; the transform's rows become COPY binary tuples
    (executor/transform/arrow_binary.py) when every staged column's Spark type is one
    Postgres takes as it is, else COPY text lines (executor/transform/arrow_copy.py), told
    to ``choose_wire`` before the job, and are staged by blob_writer. Returns how many read
    tasks there were: the publisher must find each one's summaries (Publisher.finish)."""
    from pyspark.sql import SparkSession

    from pipeline.errors import Kind, decode
    from pipeline.executor.task import EncoderSettings, StagingTarget
    from pipeline.plan.split import pack_ranges, split_ranges
    from pipeline.spark.arrow_settings import (
        MAX_BYTES_PER_BATCH,
        bounded_sql_conf,
        row_bytes_limit,
        writer_sql_conf,
    )
    from pipeline.spark.transform import session_settings
    from pipeline.spark.warm_workers import start_python_workers

    spark = SparkSession.builder.getOrCreate()  # on sc, with its conf (UTC session)
    # The executors wait while the driver plans: Spark's Python daemon starts meanwhile.
    start_python_workers(spark)
    slots = max(sc.defaultParallelism, settings.spark.min_partitions)
    tasks = [t if isinstance(t, list) else [t]
             for t in pack_ranges(split_ranges(ranges, slots), slots)]
    sink = settings.sink
    target = StagingTarget(settings.database_url, *run.staging_copy())
    # No tombstone key: on the transform path a null value is a dead letter.
    encoding = EncoderSettings(sink.record_format, tuple(
        (c.name, c.type, c.required, c.source) for c in sink.columns), run.id, (),
        settings.schema_registry)
    # One topic (the usual run): the read tasks leave it out, the transform gets it as a
    # literal (spark/topic_literal.py).
    topics = {r.topic for r in ranges}
    topic = next(iter(topics)) if len(topics) == 1 else None
    log.info("run %s: %d read tasks for %s", run.id, len(tasks), describe(ranges),
             extra={"event": "read.start", "tasks": len(tasks),
                    "ranges": [r.as_dict() for r in ranges]})
    # Spark's per-row batch-size check off for this job (spark/arrow_settings.py), set
    # before the transform builds its plan: its own Arrow UDFs get the same. A cap in
    # [spark.conf], spark-submit's --conf or spark-defaults.conf wins. Its batches are then
    # bounded by rows alone: records too big for that stop it at their first batch
    # (executor/transform/feed.too_big), and it runs again with the check on.
    users = {**dict(sc.getConf().getAll()), **settings.spark.conf}
    fast = writer_sql_conf(users)
    with session_settings(spark, fast):
        try:
            return _transformed(sc, spark, settings, run, tasks, target, encoding, topic,
                                choose_wire, row_bytes_limit(users, fast))
        except Exception as e:  # noqa: BLE001 - only a resize is handled here
            if (task := decode(str(e))) is None or task.kind != Kind.RESIZE:
                raise
            why = task.message
    # The parts the first job committed hold what this job's hold (the same read tasks;
    # a writer's part is a read task's, or after a shuffle no writer ran), so the
    # publisher takes each part once, from whichever job staged it first.
    log.info("run %s: %s; the transform's job runs again with its Arrow batches bounded by "
             "bytes (%s)", run.id, why, MAX_BYTES_PER_BATCH,
             extra={"event": "read.resize", "reason": why})
    with session_settings(spark, bounded_sql_conf(users)):
        return _transformed(sc, spark, settings, run, tasks, target, encoding, topic,
                            lambda binary: None, None)  # the wire is the first job's


def _transformed(sc, spark, settings: Settings, run: Run, tasks, target, encoding,
                 topic: str | None, choose_wire: Callable[[bool], None],
                 row_bytes: int | None) -> int:
    from pyspark.sql import functions as F

    from pipeline.executor.task import LineStageTask
    from pipeline.executor.transform.arrow_binary import exact
    from pipeline.executor.transform.feed import feed_schema, feeder
    from pipeline.executor.transform.worker_imports import NO_PANDAS, runs_only_ours
    from pipeline.executor.transform.writer import WRITER_SCHEMA, blob_writer
    from pipeline.spark.topic_literal import TOPIC, proven_literal, with_topic
    from pipeline.spark.transform import apply
    from pipeline.store import tables

    sink = settings.sink
    # One read task per Spark partition: range(n) in n slices is one index per slice.
    records = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(
        feeder(feed_task(settings, target, encoding, tasks, topic, row_bytes)),
        feed_schema(encoding.format, encoding.columns, topic is None))
    results = apply(records if topic is None else with_topic(records, topic), sink)
    columns = tables.typed(tables.from_record(tables.record_rows(sink)))
    # The writer makes each row a COPY tuple or line in Arrow (executor/transform/: arrow_binary,
    # arrow_copy): the JVM only hands the transform's rows over.
    # The writers cut their blobs by the read tasks' ranges (each one ledger row), not by
    # the planned ones: a big planned range is read in pieces, and a transform that
    # shuffles mixes the pieces' rows in every batch.
    pieces = tuple(r for task in tasks for r in task)
    staged = results.select(*[F.col(f"`{n}`") for n, _ in columns])
    # No user Python in the plan: the workers run only ours and keep pandas out
    # (executor/transform/worker_imports.py: ~40 MB a worker).
    sc.setLocalProperty(NO_PANDAS, "true" if runs_only_ours(staged) else None)
    if topic is not None and not proven_literal(staged, topic):
        topic = None  # the transform's rows carry their own topic
    if topic is not None:  # the writer writes it: Spark prunes the literal
        staged = results.select(*[F.col(f"`{n}`") for n, _ in columns if n != TOPIC])
    # The wire, from the types Spark will hand the writer (the fixed topic: a string).
    spark_types = {f.name: f.dataType.simpleString() for f in staged.schema.fields}
    texts = [f"{name}: {spark_types.get(name, 'string')} into {pg}" for name, pg in columns
             if not exact([(pg, spark_types.get(name, "string"))])]
    choose_wire(not texts)
    log.info("run %s: the transform's rows are staged as COPY %s", run.id,
             f"text lines ({'; '.join(texts)})" if texts else "binary tuples",
             extra={"event": "stage.wire", "binary": not texts})
    try:
        staged.mapInArrow(blob_writer(LineStageTask(target, pieces, tuple(columns), run.id,
                                                    topic, not texts)),
                         WRITER_SCHEMA).collect()
    finally:
        sc.setLocalProperty(NO_PANDAS, None)
    return len(tasks)


def feed_task(settings: Settings, target, encoding, tasks, topic: str | None = None,
              row_bytes: int | None = None):
    """The spec of a transform's read tasks (executor/transform/feed.py): the built-in path's reader
    with smaller batches and queue (consume.FEED_BATCH: memory); a queued.min.messages of
    the user's [kafka.consumer] still wins. ``topic``: the run's one topic, left out of the
    batches (FeedTask.topic); ``row_bytes``: FeedTask.row_bytes_limit."""
    from pipeline.executor.consume import FEED_BATCH, FEED_QUEUED_MESSAGES, reader_config
    from pipeline.executor.task import FeedTask

    k = settings.kafka
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-reader",
                           FEED_QUEUED_MESSAGES)
    return FeedTask(target, reader, k.timeout_seconds, encoding, tasks, topic, FEED_BATCH,
                    row_bytes)
