"""A user transform's input: the built-in sinks' own read and decode, as a DataFrame.

The driver makes one Spark partition per planned read task (the tasks stage_ranges runs:
split.pack_ranges over split.split_ranges) and maps them with ``feeder`` (``mapInArrow``):
each task reads its ranges exactly with one consumer (consume.read_ranges: read_committed,
retention errors, typed TaskErrors), encodes each batch with the sink's Encoder (no
tombstone key: on the transform path a null value is a dead letter) and yields the good
records as typed Arrow batches of the result columns (typed_rows.py; a json
batch's values go to Arrow as columns, without COPY text lines: arrow_columns.py).
That is the DataFrame the transform receives; no JVM parse, no cache. A run of one topic
leaves the ``topic`` column out of the batches and the driver adds it as a literal
(spark/topic_literal.py): one string column less through the JVM, each way.

The reader stages what it alone knows, its dead letters (DEAD blobs) and each range's
summary (HASH blob: records read and their content hash, as stage.range_stager does), in
ONE transaction that commits only after its last batch was taken: the ledger, the records
read and the dead letters come from the built-in machinery. Because the reader is a side
effect inside a DataFrame the user's code consumes:

- its blobs are staged under reader parts ``-1 - task index``, never a writer's part (the
  publisher picks one attempt per part when it first sees it);
- each invocation is its own attempt, with a random 63-bit task id (Spark may run it more
  than once: a retry, a resubmitted stage, a transform that uses its input twice); the
  content of a part is the same whichever invocation the publisher picks;
- an invocation whose output was not read to its end (a transform's ``limit``) never
  commits: the publisher then misses its part and refuses the run (Publisher.finish).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from pipeline.executor.task import FeedTask
from pipeline.formats import paths
from pipeline.formats.types import column_type

# The raw format's result columns (transform.result_names) as Spark DDL.
RAW_SCHEMA = ("topic string, partition int, offset bigint, key binary, value binary, "
              "headers string, kafka_timestamp timestamp")


def feed_schema(fmt: str, columns: Sequence[Sequence], topic: bool = True) -> str:
    """The DataFrame a transform receives (Spark DDL): the record's coordinates and Kafka
    timestamp, then the declared columns as their Spark types (raw: the record as it is);
    without ``topic``, what the read tasks yield for a run of one topic (FeedTask.topic)."""
    if fmt == "raw":
        schema = RAW_SCHEMA
    else:
        typed = ", ".join(f"`{name}` {column_type(t).spark}"
                          for name, t, _, _ in paths.columns(columns))
        schema = f"{TOPIC}partition int, offset bigint, kafka_timestamp timestamp, {typed}"
    return schema if topic else schema.removeprefix(TOPIC)


# The first column of every feed schema; a run of one topic leaves it out of the batches.
TOPIC = "topic string, "


def feeder(spec: FeedTask):
    """A picklable function for ``mapInArrow`` over batches of read task indexes (column
    ``id``) -> ``feed_schema`` batches (module docstring)."""

    def feed(batches):
        from pipeline.executor import zip_imports
        from pipeline.executor.transform.worker_imports import allowed, without_pandas

        zip_imports.install()  # the worker's next tasks start sooner
        with without_pandas(allowed()):
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from _read_task(spec, index)

    return feed


def _read_task(spec: FeedTask, index: int) -> Iterator:
    import pyarrow as pa
    from pyspark import TaskContext

    from pipeline.executor.blobs import line_chunks
    from pipeline.executor.consume import FEED_BATCH_BYTES, read_ranges
    from pipeline.executor.content_hash import ContentHash
    from pipeline.executor.stage import attempt_writer
    from pipeline.executor.staging import DEAD, HASH, Blob, reader_part
    from pipeline.executor.transform import typed_rows
    from pipeline.formats.wire.text import TEXT

    encoder = spec.encoding.encoder(text_rows=True)  # read into Arrow from COPY text
    to_arrow = typed_rows.feed_converter(encoder, spec.encoding.format,
                                         spec.encoding.columns, pa)
    ranges = list(spec.tasks[index])
    hashes = {r: ContentHash() for r in ranges if r.count > 0}
    ctx = TaskContext.get()
    attempt = ctx.attemptNumber() if ctx is not None else 0
    # SystemRandom: forked Python workers would share a seeded generator's sequence.
    task = random.SystemRandom().getrandbits(63)
    asks = ByteBound(spec.batch, FEED_BATCH_BYTES)
    with attempt_writer(spec.target, reader_part(index), attempt, task) as put:
        for r, records in read_ranges(spec.reader, ranges, spec.timeout_seconds, asks):
            hashes[r].add(records)
            batch, dead = to_arrow(r.topic, r.partition, records)
            lo, hi = records[0].offset(), records[-1].offset()
            for lines in line_chunks(dead, spec.target.max_blob_bytes):
                put(Blob(r.topic, r.partition, DEAD, len(lines), lo, hi, TEXT.blob(lines)))
            if len(batch):
                # One topic: the driver adds it as a literal, so no string column crosses
                # the JVM (~0.5 JVM CPU-s per 2M records each way).
                if spec.topic is not None:
                    batch = pa.RecordBatch.from_arrays(
                        batch.columns[1:], schema=batch.schema.remove(0))  # topic is first
                too_big(spec, r, batch)
                yield from asks.cut(batch)
        for r, h in hashes.items():
            put(Blob(r.topic, r.partition, HASH, h.records, r.from_offset, r.until_offset,
                     h.digest()))


def too_big(spec: FeedTask, r, batch) -> None:
    """Raise a TaskError of kind RESIZE when ``batch``'s rows average more bytes than the
    job's row-bounded Arrow batches hold (spec.row_bytes_limit): before the batch reaches
    the JVM, so the job stops before it allocates them; the driver runs it again bounded
    by bytes (driver/transform_job.py)."""
    limit = spec.row_bytes_limit
    if limit is None or batch.nbytes <= limit * len(batch):
        return
    from pipeline.errors import Kind, TaskError, Where

    raise TaskError(Kind.RESIZE, f"{r}: records of {batch.nbytes // len(batch)} bytes a row "
                    f"on average, over the {limit} a row-bounded Arrow batch holds",
                    Where(r.topic, r.partition, r.from_offset, r.until_offset))


class ByteBound:
    """A read task's batches bounded by bytes as well as by records: the JVM holds each
    Arrow batch whole (and a Python worker its records and their batch), so records of up
    to Kafka's largest message (~1 MB by default) must not come 5,000 at a time. The next
    consume() asks for as many records as ``max_bytes`` holds at the size seen so far
    (never more than ``batch``), and a batch over ``max_bytes`` (the first one, or records
    growing) goes to the JVM in slices (zero-copy). Records of the usual size (5,000 of
    them in a few MB) are never cut: one size check a batch."""

    def __init__(self, batch: int, max_bytes: int):
        self.batch, self.max_bytes = batch, max_bytes
        self.asked = batch

    def __call__(self) -> int:
        return self.asked

    def cut(self, batch) -> Iterator:
        size = batch.nbytes
        per_record = max(1, size // max(1, len(batch)))
        self.asked = max(1, min(self.batch, self.max_bytes // per_record))
        if size <= self.max_bytes:
            yield batch
            return
        rows = max(1, self.max_bytes // per_record)
        for start in range(0, len(batch), rows):
            yield batch.slice(start, rows)
