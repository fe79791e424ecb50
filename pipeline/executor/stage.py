"""What runs on the executors: records -> Postgres COPY text -> this run's staging table.

Spark SQL turns each record into one line of Postgres COPY text format (no Python per
record: escaping, timestamps in UTC and bytea hex are Spark expressions). A small Python
function (``mapInArrow``) then takes each Arrow batch of lines as ONE contiguous buffer and
stores it as one blob row (or several, each at most BLOB_BYTES) in the run's UNLOGGED
staging table, tagged with the Spark partition and the task attempt that wrote it (Spark's
taskAttemptId: its attempt number restarts at 0 when a stage is resubmitted), and a summary
(topic, partition, kind, rows, first and last offset). Each task writes its blobs in one
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

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from pipeline.executor.blobs import arrow_chunks, contiguous, line_chunks
from pipeline.executor.task import LineStageTask, RangeStageTask, StagingTarget
from pipeline.formats.copy_text import TEXT

ROW = "r"  # a blob of result rows
DEAD = "d"  # a blob of dead-letter rows
TOMBSTONE = "t"  # a blob of an upsert sink's deletes (encode.Encoded.tombstones)
# A read range's summary, no rows: n = its Kafka records, min_offset/max_offset = the range's
# from/until offsets, blob = their content hash (content_hash.py; the ledger's row).
HASH = "h"



def executor_connection(url: str):
    """An executor's connection: plain psycopg (an executor builds no SQLAlchemy engine)."""
    import psycopg

    return psycopg.connect(url, connect_timeout=10,
                           application_name="kafka-offset-pipeline-stage")


def escape_text(F, col):
    """COPY text format: backslash, newline, carriage return and tab are escaped."""
    for raw, escaped in (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        col = F.replace(col, F.lit(raw), F.lit(escaped))
    return col


def copy_field(F, col, pg_type: str):
    """One column as COPY text; NULL is \\N. Timestamps carry an explicit UTC offset, so
    neither the OS time zone of a driver or executor nor the session's can shift them."""
    from pipeline.formats import types

    form = types.copy_form(pg_type)
    if form == types.HEX:
        # \x + hex is bytea's input format; the backslash itself is escaped for COPY.
        value = F.concat(F.lit("\\\\x"), F.hex(col))
    elif form == types.TIMESTAMP:
        # Past year 9999 Spark writes "+55840-..." (a Kafka timestamp in microseconds sent
        # as milliseconds), which Postgres refuses; without the sign it reads it.
        # regexp_replace, not ltrim(col, "+"): Spark 3.5's Python ltrim takes no trim string.
        value = F.regexp_replace(F.date_format(col, "yyyy-MM-dd HH:mm:ss.SSSSSSXXX"),
                                 r"^\+", "")
    elif form == types.ESCAPED:
        value = escape_text(F, col)
    else:  # numbers, booleans, dates: their string form is already COPY-safe
        value = col.cast("string")
    return F.coalesce(value, F.lit("\\N"))


def copy_line(F, columns: Sequence[tuple[str, str]], extra: Sequence = ()):
    """A whole row as one COPY text line, newline included."""
    fields = [copy_field(F, F.col(f"`{name}`"), pg_type) for name, pg_type in columns]
    return F.concat(F.concat_ws("\t", *fields, *extra), F.lit("\n"))


class Blob(NamedTuple):
    """One staged blob but for the task's coordinates: ``rows`` lines of one kind (ROW,
    DEAD, TOMBSTONE) of one partition, offsets ``first``..``last``, as one value."""

    topic: str
    partition: int
    kind: str
    rows: int
    first: int
    last: int
    data: bytes


def stage_attempt(target: StagingTarget, batches: Iterator[Iterator[Blob]]
                  ) -> tuple[int, int, dict[str, int]]:
    """The one skeleton of a staging task: all blobs of this task attempt in one COPY and
    one transaction on one connection, tagged with the Spark partition, the attempt and
    its task attempt id (Spark's taskAttemptId) and numbered in order. ``batches``: the
    blobs of each input batch, produced lazily inside the open COPY. The during_read fault
    fires once, after the first batch that staged anything; after_task_commit after a first
    attempt's commit (a retried task re-stages what it committed). Returns (part, attempt,
    lines staged per kind)."""
    from pyspark import TaskContext

    from pipeline import faults as f

    ctx = TaskContext.get()
    part, attempt, task = ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId()
    totals = {ROW: 0, DEAD: 0, TOMBSTONE: 0}
    seq = 0
    injected = False
    with executor_connection(target.url) as conn:
        with conn.cursor() as cur, cur.copy(target.copy_sql) as copy:
            copy.set_types(target.types)
            for blobs in batches:
                for blob in blobs:
                    copy.write_row((part, attempt, task, seq, *blob))
                    if blob.kind != HASH:  # a range's summary: no lines
                        totals[blob.kind] += blob.rows
                    seq += 1
                if seq and not injected:  # once per task, inside its open COPY
                    injected = True
                    f.inject("during_read")
        conn.commit()
    if attempt == 0:
        f.inject("after_task_commit")
    return part, attempt, totals


def blob_writer(spec: LineStageTask):
    """A picklable function for DataFrame.mapInArrow over LINE_COLUMNS batches: each
    batch's lines of one kind, per partition, go into as many blobs as
    ``spec.target.max_blob_bytes`` needs (stage_attempt). Yields one summary row per task."""

    def write(batches):
        import pyarrow as pa
        import pyarrow.compute as pc

        max_bytes = spec.target.max_blob_bytes

        def blobs_of(batch) -> Iterator[Blob]:
            for group in _by_partition(batch, pa, pc):
                lo, hi = (v.as_py() for v in pc.min_max(group.column("offset")).values())
                topic = group.column("topic")[0].as_py()
                partition = group.column("partition")[0].as_py()
                lines = pc.drop_null(group.column("row_line"))
                for rows in arrow_chunks(lines, max_bytes, pa):
                    yield Blob(topic, partition, ROW, len(rows), lo, hi, contiguous(rows, pa))
                for dead in line_chunks(_dead_lines(group, pc, spec.declared), max_bytes):
                    yield Blob(topic, partition, DEAD, len(dead), lo, hi,
                               "".join(dead).encode())

        part, attempt, totals = stage_attempt(spec.target, map(blobs_of, batches))
        yield pa.RecordBatch.from_pydict(
            {"part": [part], "attempt": [attempt], "rows": [totals[ROW]],
             "dead": [totals[DEAD]]},
            schema=pa.schema([("part", pa.int32()), ("attempt", pa.int32()),
                              ("rows", pa.int64()), ("dead", pa.int64())]))

    return write


WRITER_SCHEMA = "part int, attempt int, rows long, dead long"
# What blob_writer reads: coordinates, a result row as COPY text (null for a bad record),
# and for a bad record the first seven dead-letter fields as COPY text plus what
# json_diagnose.diagnose needs to explain it.
LINE_COLUMNS = ["topic", "partition", "offset", "row_line", "dead_head", "error_code",
                "bad_value", "_parsed"]


def line_frame(marked, row_columns, dead_columns, run_id: int, F, *, rows: bool = True,
               dead: bool = True):
    """A marked DataFrame (transform.mark) -> LINE_COLUMNS. ``rows``/``dead`` = False: the
    frame holds only dead letters / only results (a user transform's two outputs)."""
    good = F.col("error_code").isNull()
    none = F.lit(None).cast("string")
    row_line = copy_line(F, row_columns, extra=[F.lit(str(run_id))]) if rows else none
    return marked.select(
        "topic", "partition", "offset",
        F.when(good, row_line).alias("row_line"),
        (F.when(~good, dead_head(F, dead_columns)) if dead else none).alias("dead_head"),
        F.col("error_code") if dead else none.alias("error_code"),
        (F.when(~good, F.col("value")) if dead else F.lit(None).cast("binary")).alias(
            "bad_value"),
        F.col("_parsed") if dead else none.alias("_parsed"))


def dead_head(F, dead_columns):
    """The dead letter's fields before error_type and error_message, as COPY text."""
    head = [(n, t) for n, t in dead_columns if n not in ("error_type", "error_message")]
    fields = [copy_field(F, F.col(f"`{name}`"), pg_type) for name, pg_type in head]
    return F.concat_ws("\t", *fields)


def _dead_lines(group, pc, declared) -> list[str]:
    """Bad records are rare: each is explained and finished in Python. Whatever explaining
    one record raises, it still gets its dead letter, naming the exception (the record's
    coordinates and bytes are in ``dead_head``, written by Spark)."""
    from pipeline.formats import json_diagnose as d
    from pipeline.formats.copy_text import escape
    from pipeline.formats.dead_letters import unexpected

    heads = group.column("dead_head")
    if heads.null_count == len(heads):
        return []
    out = []
    for head, code, value, parsed in zip(heads.to_pylist(), group.column("error_code").to_pylist(),
                                         group.column("bad_value").to_pylist(),
                                         group.column("_parsed").to_pylist(), strict=True):
        if head is None:
            continue
        try:
            error_type, message = d.diagnose(code, value, parsed, declared)
        except Exception as e:  # noqa: BLE001 - whatever it is, it is this record's
            error_type, message = unexpected(e, "explaining the bad record")
        out.append(f"{head}\t{escape(error_type)}\t{escape(message)}\n")
    return out


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
        from pipeline.executor.consume import read_ranges
        from pipeline.executor.content_hash import ContentHash

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
