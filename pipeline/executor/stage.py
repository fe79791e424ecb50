"""What runs on the executors: records -> Postgres COPY text -> this run's staging table.

A read task (range_stager) encodes each batch of records into COPY lines (formats/); a
user transform's writer (blob_writer, a ``mapInArrow``) turns each Arrow batch of the
transform's rows into COPY binary tuples (formats/arrow_binary.py) or, for a column type
those do not cover, COPY text lines (formats/arrow_copy.py), vectorized. Each batch's lines
are stored as ONE contiguous buffer: one blob row (or several, each at most BLOB_BYTES) in
the run's UNLOGGED staging table (its columns and blob kinds: staging.py), tagged with
the Spark partition and the task attempt that wrote it (Spark's taskAttemptId: its attempt
number restarts at 0 when a stage is resubmitted), and a summary (topic, partition, kind,
rows, first and last offset). Each task writes its blobs in one
transaction, so a task attempt's blobs are either all there or not at all; the publisher
uses one task attempt per Spark partition, so a retried task (lost executor, speculation)
or a resubmitted stage is never counted twice.

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

from pipeline.executor.blobs import arrow_chunks, contiguous, line_chunks
from pipeline.executor.staging import DEAD, HASH, RECEIVED, ROW, TOMBSTONE, Blob
from pipeline.executor.task import LineStageTask, RangeStageTask, StagingTarget
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


def blob_writer(spec: LineStageTask):
    """A picklable function for DataFrame.mapInArrow over a user transform's rows (the
    staged columns, ``spec.columns``): each batch becomes COPY binary tuples
    (``spec.binary``: formats/arrow_binary.py) or text lines (formats/arrow_copy.py), in
    Arrow and numpy, which go, per partition and read range, into as many ROW
    blobs as ``spec.target.max_blob_bytes`` needs (stage_attempt). Yields one summary row
    per task."""

    def write(batches):
        import pyarrow as pa
        import pyarrow.compute as pc

        from pipeline import faults
        from pipeline.executor import zip_imports
        from pipeline.executor.worker_imports import allowed, without_pandas
        if spec.binary:
            from pipeline.formats.arrow_binary import tuples as lines
        else:
            from pipeline.formats.arrow_copy import lines

        zip_imports.install()  # the worker's next tasks start sooner

        max_bytes = spec.target.max_blob_bytes
        starts: dict[tuple[str, int], list[int]] = {}
        for r in spec.ranges:
            starts.setdefault((r.topic, r.partition), []).append(r.from_offset)
        for v in starts.values():
            v.sort()

        # A run of one topic whose transform kept it: the rows come without it.
        fixed = {} if spec.topic is None else {"topic": spec.topic}

        def blobs_of(batch) -> Iterator[Blob]:
            topics = (batch.column("topic") if spec.topic is None else
                      pa.repeat(pa.scalar(spec.topic, pa.string()), len(batch)))
            batch = pa.RecordBatch.from_arrays(
                [topics, batch.column("partition"), batch.column("offset"),
                 lines(batch, spec.columns, spec.run_id, pa, pc, fixed)], names=LINE_COLUMNS)
            for group in _by_partition(batch, pa, pc):
                topic = group.column("topic")[0].as_py()
                partition = group.column("partition")[0].as_py()
                for piece in _by_range(group, starts.get((topic, partition), [0]), pa, pc):
                    if faults.inject("writer_piece"):  # a test's loss (faults.LOSS_POINTS)
                        continue
                    lo, hi = (v.as_py() for v in pc.min_max(piece.column("offset")).values())
                    for rows in arrow_chunks(piece.column("row_line"), max_bytes, pa):
                        yield Blob(topic, partition, ROW, len(rows), lo, hi,
                                   contiguous(rows, pa))

        received: dict[tuple[str, int], int] = {}

        def staged(batches) -> Iterator[Iterator[Blob]]:
            for batch in batches:
                _count_received(batch, spec.topic, received, pa, pc)
                yield blobs_of(batch)
            yield (Blob(t, p, RECEIVED, n, -1, -1, b"") for (t, p), n in received.items())

        with without_pandas(allowed()):  # pyarrow's probe for pandas, ~40 MB a worker
            part, attempt, totals = stage_attempt(spec.target, staged(batches))
        yield pa.RecordBatch.from_pydict(
            {"part": [part], "attempt": [attempt], "rows": [totals[ROW]]},
            schema=pa.schema([("part", pa.int32()), ("attempt", pa.int32()),
                              ("rows", pa.int64())]))

    return write


WRITER_SCHEMA = "part int, attempt int, rows long"
# What blob_writer cuts into blobs: coordinates and a result row (a COPY text line or
# binary tuple).
LINE_COLUMNS = ["topic", "partition", "offset", "row_line"]


def _count_received(batch, topic: str | None, received: dict, pa, pc) -> None:
    """Add a writer's input batch to its rows received per (topic, partition), counted
    before anything is done with them (``topic``: the run's one topic, not in the rows)."""
    if len(batch) == 0:
        return
    if topic is not None:
        for item in pc.value_counts(batch.column("partition")).to_pylist():
            key = (topic, item["values"])
            received[key] = received.get(key, 0) + item["counts"]
        return
    counts = pa.Table.from_batches([batch]).group_by(["topic", "partition"]).aggregate(
        [("offset", "count")])  # an offset is never null
    for row in counts.to_pylist():
        key = (row["topic"], row["partition"])
        received[key] = received.get(key, 0) + row["offset_count"]


def _by_range(group, starts: list[int], pa, pc):
    """One partition's rows split by the read range holding each offset (``starts``:
    the ranges' first offsets, sorted), so that a blob never spans two ledger rows. Rows
    in one range (the usual case: a transform that keeps the read's partitioning) stay one
    piece; a transform that shuffles may mix ranges."""
    import bisect

    lo, hi = (v.as_py() for v in pc.min_max(group.column("offset")).values())
    if bisect.bisect_right(starts, lo) == bisect.bisect_right(starts, hi):
        yield group
        return
    import numpy as np

    which = np.searchsorted(np.asarray(starts), group.column("offset").to_numpy(), "right")
    for i in np.unique(which):
        yield group.filter(pa.array(which == i))


def _by_partition(batch, pa, pc):
    """The batch split by (topic, partition); a Kafka-sourced batch is nearly always one."""
    partitions = batch.column("partition")
    topics = batch.column("topic")
    if len(batch) == 0:
        return
    lo, hi = pc.min_max(partitions).values()
    if lo == hi and len(pc.unique(topics)) == 1:
        yield batch
        return
    table = pa.Table.from_batches([batch])
    keys = table.group_by(["topic", "partition"]).aggregate([]).to_pylist()
    for key in keys:
        mask = pc.and_(pc.equal(table.column("topic"), key["topic"]),
                       pc.equal(table.column("partition"), key["partition"]))
        yield table.filter(mask).combine_chunks().to_batches()[0]


def range_stager(spec: RangeStageTask):
    """A picklable function for ``RDD.mapPartitions`` over read tasks (one Spark partition
    holds one group of split.pack_ranges, a list of OffsetRanges, or bare OffsetRanges):
    read the task's ranges on the executor with one consumer (consume.read_ranges), encode
    each batch (encode.Encoder) and store it as one blob per kind (ROW, DEAD, TOMBSTONE),
    all of a task attempt in one transaction (stage_attempt). Yields one summary tuple per
    task: (part, attempt, rows, dead letters, tombstones)."""

    def stage_ranges(items):
        from pipeline.executor import zip_imports
        from pipeline.executor.consume import read_ranges
        from pipeline.executor.content_hash import ContentHash

        zip_imports.install()  # the worker's next tasks start sooner

        encoder = spec.encoding.encoder()
        ranges = [r for item in items for r in (item if isinstance(item, list) else [item])]

        def blobs_of(r, records) -> Iterator[Blob]:
            lo, hi = records[0].offset(), records[-1].offset()
            encoded = encoder.encode(r.topic, r.partition, records)
            for kind, batch in zip((ROW, DEAD, TOMBSTONE), encoded, strict=True):
                for lines in line_chunks(batch, spec.target.max_blob_bytes):
                    # Result rows are in the format's COPY wire; dead letters and
                    # tombstones are always COPY text.
                    wire = encoder.wire if kind == ROW else TEXT
                    yield Blob(r.topic, r.partition, kind, len(lines), lo, hi, wire.blob(lines))

        def staged() -> Iterator[Iterator[Blob]]:
            for r, records in read_ranges(spec.reader, ranges, spec.timeout_seconds):
                hashes[r].add(records)  # the one per-record step besides the encoding
                yield blobs_of(r, records)
            # Each range's summary, staged with its blobs: the ledger row of the attempt
            # the publisher chooses (a range with no record still has one).
            yield (Blob(r.topic, r.partition, HASH, h.records, r.from_offset,
                        r.until_offset, h.digest()) for r, h in hashes.items())

        hashes = {r: ContentHash() for r in ranges if r.count > 0}
        part, attempt, totals = stage_attempt(spec.target, staged())
        yield (part, attempt, totals[ROW], totals[DEAD], totals[TOMBSTONE])

    return stage_ranges
