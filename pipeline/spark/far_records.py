"""A transform run's read with the records Spark's Kafka source cannot read taken out of it
and put back as dead letters (driver/far_timestamps.py finds them, plan/far_records.py
plans the reads around them).

The far records join after ``transform.mark``, in its output's shape, rather than before
it: mark keeps a record's key, value and headers only when the record is bad, and a far
record's value may parse well. Each gets the record digest from the same expression as
every record (the ledger's hash counts it), error_code ``refused:timestamp_out_of_range``
and its message in ``_parsed`` (json_diagnose.diagnose hands both to its dead letter),
and a NULL Kafka timestamp, as on the built-in path.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.config import KafkaSettings
from pipeline.driver.far_timestamps import FarRecord
from pipeline.formats.json_diagnose import REFUSED
from pipeline.formats.timestamps import PG_END_MS, TimestampOutOfRange
from pipeline.plan.far_records import SPARK_MAX_MS, layers
from pipeline.plan.offsets import OffsetRange

# Spark's Kafka source's columns.
SOURCE_SCHEMA = ("key binary, value binary, topic string, partition int, offset bigint, "
                 "timestamp timestamp, timestampType int, "
                 "headers array<struct<key:string,value:binary>>")
ERROR_CODE = REFUSED + "timestamp_out_of_range"
_MESSAGE = "_far_message"


def message(millis: int) -> str:
    """The dead letter's message: the built-in path's where Postgres cannot hold it either."""
    if millis >= PG_END_MS:
        return str(TimestampOutOfRange(millis))
    return (f"Kafka timestamp {millis} ms is outside what Spark can read (up to "
            f"{SPARK_MAX_MS} ms, int64 microseconds); a producer that sent micro- or "
            "nanoseconds as milliseconds?")


def read_around(spark, kafka: KafkaSettings, ranges: Sequence[OffsetRange],
                far: Sequence[FarRecord], min_partitions: int = 0):
    """The planned ranges minus the far records, through Spark's Kafka source: one read per
    layer, unioned (with no far record: the one read of the ranges)."""
    from pipeline.spark.read import read_ranges

    skipped: dict[tuple[str, int], list[int]] = {}
    for f in far:
        skipped.setdefault((f.topic, f.partition), []).append(f.offset)
    reads = [read_ranges(spark, kafka, layer, min_partitions)
             for layer in layers(ranges, skipped)]
    if not reads:  # every planned record is far
        return spark.createDataFrame([], SOURCE_SCHEMA)
    out = reads[0]
    for more in reads[1:]:
        out = out.unionByName(more)
    return out


def with_far(spark, marked, far: Sequence[FarRecord]):
    """``marked`` (transform.mark's output, with the record digest carried) plus the far
    records as marked dead letters in its shape."""
    if not far:
        return marked
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    from pipeline.spark.record_hash import DIGEST, record_digest
    from pipeline.spark.transform import _headers_json

    rows = [(f.key, f.value, f.topic, f.partition, f.offset, None, 0,
             [(k, v) for k, v in f.headers], message(f.timestamp)) for f in far]
    source = spark.createDataFrame(rows, f"{SOURCE_SCHEMA}, {_MESSAGE} string").coalesce(1)
    source = source.withColumn(DIGEST, record_digest(F))
    same = {"topic", "partition", "offset", "key", "value", DIGEST}
    columns = []
    for field in marked.schema.fields:
        name = field.name
        if name in same:
            col = F.col(name)
        elif name == "headers":  # raw's mark serialises them, the others' keep the array
            col = _headers_json(F) if isinstance(field.dataType, StringType) else F.col(name)
        elif name == "error_code":
            col = F.lit(ERROR_CODE)
        elif name == "_parsed":
            col = F.col(_MESSAGE)
        else:  # kafka_timestamp and the declared columns
            col = F.lit(None)
        columns.append(col.cast(field.dataType).alias(name))
    return marked.unionByName(source.select(*columns))
