"""What runs on the executors: records -> Postgres COPY lines -> this run's staging table.

A read task (range_stager) encodes each batch of records into COPY lines (formats/); a
user transform's writer (transform/writer.py) turns the transform's rows into COPY lines in
Arrow. Both stage through one skeleton (stage_attempt). Each batch's lines are stored as
ONE contiguous buffer: one blob row (or several, each at most BLOB_BYTES) in the run's
UNLOGGED staging table (its columns and blob kinds: staging.py), tagged with the Spark
partition and the task attempt that wrote it (Spark's taskAttemptId: its attempt number
restarts at 0 when a stage is resubmitted), and a summary (topic, partition, kind, rows,
first and last offset). Each task writes its blobs in one transaction, so a task attempt's
blobs are either all there or not at all; the publisher uses one task attempt per Spark
partition, so a retried task (lost executor, speculation) or a resubmitted stage is never
counted twice.

The driver then streams those blobs, unchanged, into ``COPY results FROM STDIN`` inside the
publishing transaction (pipeline/driver/publish.py): each row is written once into the keyed
table, and Postgres parses COPY text far faster than ``INSERT ... SELECT`` copies rows.

The executors connect with plain psycopg and import no SQLAlchemy: the driver hands each
task a frozen spec (executor/task.py) with the staging table's COPY statement and column
types (store.run.Run.staging_copy, from pipeline/store/tables.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pipeline.executor.blobs import line_chunks
from pipeline.executor.staging import DEAD, HASH, ROW, SEGMENTS, TOMBSTONE, Blob
from pipeline.executor.task import RangeStageTask, StagingTarget
from pipeline.formats.wire.text import TEXT


def executor_connection(url: str):
    """An executor's connection: plain psycopg (an executor builds no SQLAlchemy engine)."""
    import psycopg

    return psycopg.connect(url, connect_timeout=10,
                           application_name="kafka-offset-pipeline-stage")


@contextmanager
def attempt_writer(target: StagingTarget, part: int, attempt: int, task: int
                   ) -> Iterator[Callable[[Blob], None]]:
    """``with attempt_writer(...) as put: put(blob) ...``: one attempt's blobs in one COPY
    and one transaction on one connection, tagged (part, attempt, task) and numbered in
    order; committed when the block ends normally, else rolled back (nothing staged)."""
    seq = 0

    with executor_connection(target.url) as conn:
        with conn.cursor() as cur, cur.copy(target.copy_sql) as copy:
            copy.set_types(target.types)

            def put(blob: Blob) -> None:
                nonlocal seq
                copy.write_row((part, attempt, task, seq, *blob))
                seq += 1

            yield put
        conn.commit()


def stage_attempt(target: StagingTarget, batches: Iterator[Iterator[Blob]]
                  ) -> tuple[int, int, dict[str, int]]:
    """The one skeleton of a staging task: all blobs of this task attempt in one
    transaction (attempt_writer), tagged with the Spark partition, the attempt and its task
    attempt id (Spark's taskAttemptId). ``batches``: the blobs of each input batch,
    produced lazily inside the open COPY. The during_read fault fires once, after the first
    batch that staged anything; after_task_commit after a first attempt's commit (a retried
    task re-stages what it committed). Returns (part, attempt, lines staged per kind)."""
    from pyspark import TaskContext

    from pipeline import faults as f

    ctx = TaskContext.get()
    part, attempt, task = ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId()
    totals = {ROW: 0, DEAD: 0, TOMBSTONE: 0}
    injected = staged = False
    with attempt_writer(target, part, attempt, task) as put:
        for blobs in batches:
            for blob in blobs:
                put(blob)
                staged = True
                if blob.kind in totals:  # a summary (HASH, RECEIVED): no lines
                    totals[blob.kind] += blob.rows
            if staged and not injected:  # once per task, inside its open COPY
                injected = True
                f.inject("during_read")
    if attempt == 0:
        f.inject("after_task_commit")
    return part, attempt, totals


def range_stager(spec: RangeStageTask, transactions: bool = False):
    """A picklable function for ``RDD.mapPartitions`` over read tasks (one Spark partition
    holds one group of split.pack_ranges, a list of OffsetRanges, or bare OffsetRanges):
    read the task's ranges on the executor with one consumer (consume.read_ranges), encode
    each batch (encode.Encoder: its topic's route's) and store it as one blob per kind
    (ROW, DEAD, TOMBSTONE), all of a task attempt in one transaction (stage_attempt). Yields
    one summary tuple per task: (part, attempt, rows, dead letters, tombstones).

    ``transactions`` ([sink] transactions): each range is also summarised by source
    transaction (segments.RangeSegments, a SEGMENTS blob beside its HASH); the ranges must
    then be whole partitions' (split.split_ranges with ``whole``)."""

    def stage_ranges(items):
        from pipeline.executor import zip_imports
        from pipeline.executor.consume import read_ranges
        from pipeline.executor.content_hash import ContentHash
        from pipeline.executor.segments import RangeSegments

        zip_imports.install()  # the worker's next tasks start sooner

        # One encoder per route's settings (a table's topics share one), made when its
        # first batch comes.
        encoders: dict = {}
        ranges = [r for item in items for r in (item if isinstance(item, list) else [item])]

        def encoder_of(topic: str):
            encoding = spec.encoding(topic)
            encoder = encoders.get(encoding)
            if encoder is None:
                encoder = encoders[encoding] = encoding.encoder()
            return encoder

        def blobs_of(r, records, encoder, encoded) -> Iterator[Blob]:
            lo, hi = records[0].offset(), records[-1].offset()
            for kind, batch in zip((ROW, DEAD, TOMBSTONE), encoded, strict=True):
                for lines in line_chunks(batch, spec.target.max_blob_bytes):
                    # Result rows are in the format's COPY wire; dead letters and
                    # tombstones are always COPY text.
                    wire = encoder.wire if kind == ROW else TEXT
                    yield Blob(r.topic, r.partition, kind, len(lines), lo, hi, wire.blob(lines))

        def staged() -> Iterator[Iterator[Blob]]:
            for r, records in read_ranges(spec.reader, ranges, spec.timeout_seconds):
                encoder = encoder_of(r.topic)
                if transactions:
                    encoded, sources = encoder.transactions(r.topic, r.partition, records)
                    summaries[r].add(records, sources)
                else:
                    hashes[r].add(records)  # the one per-record step besides the encoding
                    encoded = encoder.encode(r.topic, r.partition, records)
                yield blobs_of(r, records, encoder, encoded)
            # Each range's summary, staged with its blobs: the ledger row of the attempt
            # the publisher chooses (a range with no record still has one).
            yield (Blob(r.topic, r.partition, HASH, h.records, r.from_offset,
                        r.until_offset, h.digest()) for r, h in hashes.items())
            yield (Blob(r.topic, r.partition, SEGMENTS, len(s.segments), r.from_offset,
                        r.until_offset, s.blob()) for r, s in summaries.items())

        summaries = {r: RangeSegments() for r in ranges if r.count > 0} if transactions else {}
        hashes = ({r: s.hash for r, s in summaries.items()} if transactions else
                  {r: ContentHash() for r in ranges if r.count > 0})
        part, attempt, totals = stage_attempt(spec.target, staged())
        yield (part, attempt, totals[ROW], totals[DEAD], totals[TOMBSTONE])

    return stage_ranges
