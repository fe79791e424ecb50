"""Spark's Arrow settings for a run with a user transform (issue 25): what the JVM pays per
row of the Arrow -> rows -> Arrow round trip (executor/feed.py in, executor/stage.py's
blob_writer out), cut by settings only. Pure planning: the driver applies them
(spark/launch.py for the JVMs' flags, driver/transform_job.py for the writer's SQL settings).

Measured (docs/benchmarks.md, "Transform path: Arrow settings and the JIT"):

- Spark 4.0's writer side (rows -> Arrow for a ``mapInArrow``) asks the Arrow writer for
  its size in bytes after EVERY row, to cut batches at
  ``spark.sql.execution.arrow.maxBytesPerBatch`` (256 MB), unless that setting is
  Int.MaxValue; the input of ``mapInArrow`` is one struct column whose size walk
  allocates a list per call: ~16% of the executor task thread's samples. Int.MaxValue
  turned the check off, and so cut the batches by rows alone (10,000 whatever their
  size): 8,000 records of 150 KB made one 1.2 GB batch the JVM could not allocate
  (OutOfMemoryException, every run). A transform's job keeps the check, at a cap of its
  own (``BYTES_PER_BATCH``, 64 MB: two tasks' batches, grown by doubling, fit a 1 GB
  driver), so that any record Kafka holds goes through without a setting; rows of the
  usual size reach the 10,000-row cap long before it.
- Arrow Java checks every buffer access's bounds and every get's null bit unless its
  system properties say not to (``ARROW_JVM_FLAGS``): ~10-15% of the same thread.

A user's own value of any key here ([spark.conf], or spark-submit's --conf for the JVM
options) wins."""

from __future__ import annotations

MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_RECORDS_PER_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
UNCHECKED_BYTES = str(2**31 - 1)  # Spark skips its per-row size check only for this value
BYTES_PER_BATCH = str(64 * 2**20)  # a transform's writer batches: records of any size fit

# Arrow Java's bounds checks on every buffer access, and its null check on every vector
# get (Spark asks isNullAt first): read once, when Arrow's classes load, so they are JVM
# options. The executors' JVMs of a cluster get them as spark.executor.extraJavaOptions.
ARROW_JVM_FLAGS = ("-Darrow.enable_unsafe_memory_access=true "
                   "-Darrow.enable_null_check_for_get=false")


def writer_sql_conf(user_conf: dict[str, str]) -> dict[str, str]:
    """The SQL settings of a transform's job: Spark's batches bounded by bytes at
    BYTES_PER_BATCH, unless the user set a byte cap of their own."""
    if MAX_BYTES_PER_BATCH in user_conf:
        return {}
    return {MAX_BYTES_PER_BATCH: BYTES_PER_BATCH}


def executor_java_options(user_conf: dict[str, str], local: bool) -> dict[str, str]:
    """spark.executor.extraJavaOptions for a cluster master's executors (a local master's
    executors are the driver JVM), unless the user set their own."""
    if local or "spark.executor.extraJavaOptions" in user_conf:
        return {}
    return {"spark.executor.extraJavaOptions": ARROW_JVM_FLAGS}
