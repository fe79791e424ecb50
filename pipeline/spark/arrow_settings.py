"""Spark's Arrow settings for a run with a user transform (issue 25): what the JVM pays per
row of the Arrow -> rows -> Arrow round trip (executor/transform/feed.py in, executor/stage.py's
blob_writer out), cut by settings only. Pure planning: the driver applies them
(driver/transform_job.py, the writer's SQL settings).

Measured (docs/benchmarks.md, "Transform path: Arrow settings and the JIT"):

- Spark 4.0's writer side (rows -> Arrow for a ``mapInArrow``) asks the Arrow writer for
  its size in bytes after EVERY row, to cut batches at
  ``spark.sql.execution.arrow.maxBytesPerBatch`` (256 MB), unless that setting is
  Int.MaxValue; the input of ``mapInArrow`` is one struct column whose size walk
  allocates a list per call: ~16% of the executor task thread's samples (measured again:
  rows -> Arrow of 2M order rows, 2.9-3.4 JVM CPU-s without it, 5.0-6.0 with it).
  Int.MaxValue turns the check off, and the batches are then cut by rows alone (10,000
  whatever their size): 8,000 records of 150 KB made one 1.2 GB batch the JVM could not
  allocate (OutOfMemoryException, every run). So a transform's job runs without the
  check only while its records are small: its read tasks refuse records averaging more
  than ``BYTES_PER_BATCH`` / the rows of a batch (``row_bytes_limit``: 64 MB / 10,000,
  ~6.7 KB), and the driver then runs the job again with the check on at
  ``BYTES_PER_BATCH`` (``bounded_sql_conf``; 64 MB: two tasks' batches, grown by
  doubling, fit a 1 GB driver). Records up to Kafka's largest message go through without
  a setting.
- Arrow Java's bounds check on every buffer access and null check on every get stay on:
  its system properties turn them off for ~10-15% of the same thread, but a Spark or
  Arrow bug would then crash the JVM or corrupt rows silently instead of failing a task.

A user's own value of any key here ([spark.conf]) wins."""

from __future__ import annotations

MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
UNCHECKED_BYTES = str(2**31 - 1)  # Spark skips its per-row size check only for this value
BYTES_PER_BATCH = str(64 * 2**20)  # a transform's writer batches: records of any size fit


def writer_sql_conf(user_conf: dict[str, str]) -> dict[str, str]:
    """The SQL settings of a transform's job: Spark's per-row byte check off, unless the
    user set a byte cap of their own."""
    if MAX_BYTES_PER_BATCH in user_conf:
        return {}
    return {MAX_BYTES_PER_BATCH: UNCHECKED_BYTES}


def bounded_sql_conf(user_conf: dict[str, str]) -> dict[str, str]:
    """The SQL settings of a transform's job run again for big records: Spark's batches
    bounded by bytes at BYTES_PER_BATCH, unless the user set a byte cap of their own."""
    if MAX_BYTES_PER_BATCH in user_conf:
        return {}
    return {MAX_BYTES_PER_BATCH: BYTES_PER_BATCH}


def row_bytes_limit(user_conf: dict[str, str], sql_conf: dict[str, str]) -> int | None:
    """The average bytes a row above which a job run with ``sql_conf`` must not go on
    (its read tasks refuse such records, executor/transform/feed.py): None when its batches are
    bounded by bytes already (our cap, or the user's)."""
    if sql_conf.get(MAX_BYTES_PER_BATCH, user_conf.get(MAX_BYTES_PER_BATCH)) \
            != UNCHECKED_BYTES:
        return None
    rows = int(user_conf.get(MAX_RECORDS_PER_BATCH, "10000"))
    return max(1, int(BYTES_PER_BATCH) // max(1, rows))

