"""A user transform's output -> this run's staging table: the writer, a ``mapInArrow`` over
the transform's rows (driver/transform_job.py starts it).

Each Arrow batch of the staged columns becomes COPY binary tuples (arrow_binary.py, when
the driver found every column exact) or COPY text lines (arrow_copy.py), in Arrow and
numpy, no per-row Python; they go, per partition and read range (a blob never spans two
ledger rows), into as many ROW blobs as the target's max_blob_bytes needs, all of the
attempt in one transaction (stage.stage_attempt). The rows each attempt received are
staged too (RECEIVED), so that the publisher never takes a lost row for a filtered one.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline.executor.blobs import arrow_chunks, contiguous
from pipeline.executor.stage import stage_attempt
from pipeline.executor.staging import RECEIVED, ROW, Blob
from pipeline.executor.task import LineStageTask


def blob_writer(spec: LineStageTask):
    """A picklable function for DataFrame.mapInArrow over a user transform's rows (the
    staged columns, ``spec.columns``): each batch becomes COPY binary tuples
    (``spec.binary``: arrow_binary.py) or text lines (arrow_copy.py), in Arrow and numpy,
    which go, per partition and read range, into as many ROW blobs as
    ``spec.target.max_blob_bytes`` needs (stage_attempt). Yields one summary row per
    task."""

    def write(batches):
        import pyarrow as pa
        import pyarrow.compute as pc

        from pipeline import faults
        from pipeline.executor import zip_imports
        from pipeline.executor.transform.worker_imports import allowed, without_pandas
        if spec.binary:
            from pipeline.executor.transform.arrow_binary import tuples as lines
        else:
            from pipeline.executor.transform.arrow_copy import lines

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
