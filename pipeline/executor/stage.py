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

The executors connect with plain psycopg and import no SQLAlchemy: the driver hands them
the staging table's COPY statement and column types (store.run.Run.staging_copy, from
pipeline/store/tables.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate

ROW = "r"  # a blob of result rows
DEAD = "d"  # a blob of dead-letter rows
TOMBSTONE = "t"  # a blob of an upsert sink's deletes (encode.Encoded.tombstones)

# One blob's bytes at most (but for a single line larger than that): a bytea value, and a
# COPY row, cannot pass 1 GB, and 10,000 records of 100 KB would.
BLOB_BYTES = 64 << 20


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
    base = pg_type.replace(" NOT NULL", "").strip().lower()
    if base == "bytea":
        # \x + hex is bytea's input format; the backslash itself is escaped for COPY.
        value = F.concat(F.lit("\\\\x"), F.hex(col))
    elif base in ("timestamptz", "timestamp with time zone"):
        # Past year 9999 Spark writes "+55840-..." (a Kafka timestamp in microseconds sent
        # as milliseconds), which Postgres refuses; without the sign it reads it.
        # regexp_replace, not ltrim(col, "+"): Spark 3.5's Python ltrim takes no trim string.
        value = F.regexp_replace(F.date_format(col, "yyyy-MM-dd HH:mm:ss.SSSSSSXXX"),
                                 r"^\+", "")
    elif base in ("text", "jsonb") or base.startswith("text"):
        value = escape_text(F, col)
    else:  # numbers, booleans, dates: their string form is already COPY-safe
        value = col.cast("string")
    return F.coalesce(value, F.lit("\\N"))


def copy_line(F, columns: Sequence[tuple[str, str]], extra: Sequence = ()):
    """A whole row as one COPY text line, newline included."""
    fields = [copy_field(F, F.col(f"`{name}`"), pg_type) for name, pg_type in columns]
    return F.concat(F.concat_ws("\t", *fields, *extra), F.lit("\n"))


def blob_writer(url: str, copy_sql: str, types: list[str], declared: list[tuple[str, str]],
                max_blob_bytes: int = BLOB_BYTES):
    """A picklable function for DataFrame.mapInArrow over LINE_COLUMNS batches. Yields one
    summary row per task. ``copy_sql``, ``types``: the binary COPY into the run's staging
    table and its column types (store.run.Run.staging_copy). ``declared``: the JSON sink's
    (column, type) pairs, to explain bad records. A batch's lines of one kind go into as
    many blobs as ``max_blob_bytes`` needs."""

    def write(batches):
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        from pipeline import faults as f

        ctx = TaskContext.get()
        part, attempt, task = ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId()
        totals = {ROW: 0, DEAD: 0}
        seq = 0
        injected = False
        with executor_connection(url) as conn:
            with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                copy.set_types(types)
                for batch in batches:
                    for group in _by_partition(batch, pa, pc):
                        offsets = group.column("offset")
                        lo, hi = pc.min_max(offsets).values()
                        topic = group.column("topic")[0].as_py()
                        partition = group.column("partition")[0].as_py()
                        lines = pc.drop_null(group.column("row_line"))
                        for rows in _arrow_chunks(lines, max_blob_bytes, pa):
                            copy.write_row((part, attempt, task, seq, topic,
                                            partition, ROW, len(rows), lo.as_py(), hi.as_py(),
                                            _contiguous(rows, pa)))
                            totals[ROW] += len(rows)
                            seq += 1
                        for dead in _chunks(_dead_lines(group, pc, declared), max_blob_bytes):
                            copy.write_row((part, attempt, task, seq, topic,
                                            partition, DEAD, len(dead), lo.as_py(), hi.as_py(),
                                            "".join(dead).encode()))
                            totals[DEAD] += len(dead)
                            seq += 1
                    if seq and not injected:  # once per task, inside its open COPY
                        injected = True
                        f.inject("during_read")
            conn.commit()
        if attempt == 0:  # a retried task re-stages what this attempt committed
            f.inject("after_task_commit")
        yield pa.RecordBatch.from_pydict(
            {"part": [part], "attempt": [attempt], "rows": [totals[ROW]],
             "dead": [totals[DEAD]]},
            schema=pa.schema([("part", pa.int32()), ("attempt", pa.int32()),
                              ("rows", pa.int64()), ("dead", pa.int64())]))

    return write


WRITER_SCHEMA = "part int, attempt int, rows long, dead long"
# What blob_writer reads: coordinates, a result row as COPY text (null for a bad record),
# and for a bad record the first seven dead-letter fields as COPY text plus what
# diagnose.diagnose needs to explain it.
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
    from pipeline.formats import diagnose as d

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
            error_type, message = d.unexpected(e, "explaining the bad record")
        out.append(f"{head}\t{d.copy_escape(error_type)}\t{d.copy_escape(message)}\n")
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


def blob_spans(ends: Sequence[int], max_bytes: int, start: int = 0) -> list[tuple[int, int]]:
    """Lines [i, j) of each blob, in order, each blob at most ``max_bytes`` (a line larger
    than that alone is a blob of its own). ``ends[k]``: where line k ends in the lines laid
    end to end, which begin at ``start`` (cumulative sizes, or an Arrow offsets buffer)."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(ends):
        j = max(bisect_right(ends, start + max_bytes, i), i + 1)
        spans.append((i, j))
        start, i = ends[j - 1], j
    return spans


def _chunks(lines: Sequence[str | bytes], max_bytes: int = BLOB_BYTES) -> Iterator[Sequence]:
    """Python lines (str or bytes) -> consecutive slices of at most ``max_bytes`` of UTF-8;
    nothing for no lines."""
    ends = list(accumulate(len(x) if isinstance(x, bytes) or x.isascii() else
                           len(x.encode()) for x in lines))
    for i, j in blob_spans(ends, max_bytes):
        yield lines[i:j]


def _arrow_chunks(lines, max_bytes: int, pa) -> Iterator:
    """A string array -> consecutive slices of at most ``max_bytes`` of data, from its
    offsets buffer (no per-line Python); nothing for an empty array."""
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    if not len(lines):
        return
    offsets = memoryview(lines.buffers()[1]).cast("q" if lines.type == pa.large_string()
                                                     else "i")
    first = lines.offset
    for i, j in blob_spans(offsets[first + 1:first + len(lines) + 1], max_bytes,
                           offsets[first]):
        yield lines.slice(i, j - i)


def _contiguous(lines, pa) -> bytes:
    """The lines of a string array as one buffer: its data buffer between the first and
    the last offset, copied once (no per-line Python)."""
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    if lines.type == pa.large_string():
        width = "q"
    else:
        width = "i"
    _, offsets_buf, data_buf = lines.buffers()
    offsets = memoryview(offsets_buf).cast(width)
    start, end = offsets[lines.offset], offsets[lines.offset + len(lines)]
    return bytes(memoryview(data_buf)[start:end])


def range_stager(url: str, copy_sql: str, types: list[str], reader: dict,
                 timeout_seconds: float, encoder_args: tuple):
    """A picklable function for ``RDD.mapPartitions`` over read tasks (one Spark partition
    holds one group of split.pack_ranges, a list of OffsetRanges, or bare OffsetRanges):
    read the task's ranges on the executor with one consumer (consume.read_ranges), encode
    each batch (encode.Encoder) and store it as one blob per kind (ROW, DEAD, TOMBSTONE),
    all of a task attempt in one transaction on one connection (``copy_sql``, ``types``: as
    for blob_writer). Yields one summary tuple per task: (part, attempt, rows, dead
    letters, tombstones)."""

    def stage_ranges(items):
        from pyspark import TaskContext

        from pipeline import faults as f
        from pipeline.executor.consume import read_ranges
        from pipeline.formats.encode import Encoder

        ctx = TaskContext.get()
        part, attempt, task = ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId()
        encoder = Encoder(*encoder_args)
        totals = {ROW: 0, DEAD: 0, TOMBSTONE: 0}
        seq = 0
        injected = False
        with executor_connection(url) as conn:
            with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                copy.set_types(types)
                ranges = [r for item in items
                          for r in (item if isinstance(item, list) else [item])]
                for r, records in read_ranges(reader, ranges, timeout_seconds):
                    lo, hi = records[0].offset(), records[-1].offset()
                    encoded = encoder.encode(r.topic, r.partition, records)
                    for kind, batch in zip((ROW, DEAD, TOMBSTONE), encoded, strict=True):
                        for lines in _chunks(batch):
                            blob = (b"".join(lines) if kind == ROW and encoder.binary
                                    else "".join(lines).encode())
                            copy.write_row((part, attempt, task, seq, r.topic, r.partition,
                                            kind, len(lines), lo, hi, blob))
                            totals[kind] += len(lines)
                            seq += 1
                    if seq and not injected:  # once per task, inside its open COPY
                        injected = True
                        f.inject("during_read")
            conn.commit()
        if attempt == 0:  # a retried task re-stages what this attempt committed
            f.inject("after_task_commit")
        yield (part, attempt, totals[ROW], totals[DEAD], totals[TOMBSTONE])

    return stage_ranges
