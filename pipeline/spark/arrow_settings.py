"""Spark's Arrow settings for a run with a user transform (issue 25): what the JVM pays per
row of the Arrow -> rows -> Arrow round trip (executor/feed.py in, executor/stage.py's
blob_writer out), cut by settings only. Pure planning: the driver applies them
(driver/transform_job.py, the writer's SQL settings).

Measured (docs/benchmarks.md, "Transform path: Arrow settings and the JIT"):

- Spark 4.0's writer side (rows -> Arrow for a ``mapInArrow``) asks the Arrow writer for
  its size in bytes after EVERY row, to cut batches at
  ``spark.sql.execution.arrow.maxBytesPerBatch`` (256 MB), unless that setting is
  Int.MaxValue; the input of ``mapInArrow`` is one struct column whose size walk
  allocates a list per call: ~16% of the executor task thread's samples. Int.MaxValue
  turns the check off; the batches are then cut by rows only
  (``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 rows whatever their size:
  records averaging over ~26 KB, 256 MB / 10,000, make batches bigger than Spark's
  default cap, so such topics set a byte cap of their own: docs/operations.md).
- Arrow Java's bounds check on every buffer access and null check on every get stay on:
  its system properties turn them off for ~10-15% of the same thread, but a Spark or
  Arrow bug would then crash the JVM or corrupt rows silently instead of failing a task.

A user's own value of any key here ([spark.conf]) wins."""

from __future__ import annotations

MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
UNCHECKED_BYTES = str(2**31 - 1)  # Spark skips its per-row size check only for this value


def writer_sql_conf(user_conf: dict[str, str]) -> dict[str, str]:
    """The SQL settings of a transform's job: Spark's per-row byte check off, unless the
    user set a byte cap of their own."""
    if MAX_BYTES_PER_BATCH in user_conf:
        return {}
    return {MAX_BYTES_PER_BATCH: UNCHECKED_BYTES}

