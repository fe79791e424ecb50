"""The staging table's contract: what the executors that write a run's staging table and
the driver and store that read it (driver/publish.py, store/ledger.py) must agree on.
Plain Python, no I/O: both sides import it; the table itself (its SQLAlchemy definition)
is store/tables.staging, held to COLUMNS by tests/unit/test_staging_contract.py.

One row per blob: the task attempt that wrote it (part, attempt, task: Spark's
taskAttemptId), its number in that attempt's COPY (seq), then a Blob (below).
"""

from __future__ import annotations

from typing import NamedTuple

ROW = "r"  # a blob of result rows
DEAD = "d"  # a blob of dead-letter rows
TOMBSTONE = "t"  # a blob of an upsert sink's deletes (encode.Encoded.tombstones)
# A read range's summary, no rows: n = its Kafka records, min_offset/max_offset = the range's
# from/until offsets, blob = their content hash (content_hash.py; the ledger's row).
HASH = "h"
# A read range's summary by source transaction ([sink] transactions), no rows: n = its
# segments, min_offset/max_offset = the range's from/until offsets, blob = the segments and
# the distinct events per transaction (segments.py).
SEGMENTS = "s"
# A transform writer attempt's input, no rows: n = the rows of one partition it received
# (the transform's output), min_offset/max_offset = -1, no blob. The publisher holds them
# to the ROW blobs of the same attempt: a row lost on the way is never "filtered".
RECEIVED = "i"

# The staging table's columns, in the order a task attempt's COPY writes them
# (stage.attempt_writer): the attempt's tags and seq, then a Blob's fields.
COLUMNS = ("part", "attempt", "task", "seq",
           "topic", "partition", "kind", "n", "min_offset", "max_offset", "blob")


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


def reader_part(index: int) -> int:
    """The staging part of a transform's read task ``index`` (executor/transform/feed.py): negative,
    apart from every writer's (the publisher takes one attempt per part and counts the
    read tasks' parts: Publisher._check_readers)."""
    return -1 - index
