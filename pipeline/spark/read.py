"""Planned OffsetRanges -> a Spark DataFrame of exactly those Kafka records."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pipeline.config import KafkaSettings
from pipeline.plan.offsets import OffsetRange


def spark_offsets_options(ranges: Sequence[OffsetRange]) -> dict[str, str]:
    """The connector's options for an explicit batch read: assign + JSON offsets."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in sorted(ranges):
        if r.count <= 0:
            raise ValueError(f"empty range {r} must not be read")
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.from_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.until_offset
    return {
        "assign": json.dumps(assign, sort_keys=True),
        "startingOffsets": json.dumps(starting, sort_keys=True),
        "endingOffsets": json.dumps(ending, sort_keys=True),
    }


def reader_options(kafka: KafkaSettings, ranges: Sequence[OffsetRange],
                   min_partitions: int = 0) -> dict[str, str]:
    """Every option of the batch read, in the order they apply (a later one wins)."""
    options = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "kafka.isolation.level": kafka.isolation_level,
        "includeHeaders": "true",
        # Decided from what is read: Spark passes an offset the log still covers but holds
        # no record for (transaction markers, aborted records, compaction) and fails on one
        # it no longer covers (retention, a truncated log) - errors.explain_data_loss says
        # which.
        "failOnDataLoss": "true",
        # One poll that returns nothing waits this long (Spark's default: spark.network.timeout,
        # 120 s): a truncated log or an unreachable broker is then found as fast as by the
        # built-in reader.
        "kafkaConsumer.pollTimeoutMs": str(int(kafka.timeout_seconds * 1000)),
        # Larger fetches than the Java client's defaults (1 MB per partition): fewer round
        # trips per record.
        "kafka.max.partition.fetch.bytes": str(16 << 20),
        "kafka.fetch.max.bytes": str(64 << 20),
        # A range ends where the log may hold nothing more, and the consumer's next fetch
        # then waits at the broker for new records, 500 ms by default; a seek or a close
        # waits for that fetch to come back. Once per Kafka partition that is most of a
        # wide topic's read (docs/benchmarks.md, "Wide topics"). With data to return, a
        # fetch returns at once whatever this is.
        "kafka.fetch.max.wait.ms": "10",
    }
    # [kafka.spark_consumer] may override any of the above.
    options.update({f"kafka.{key}": value for key, value in kafka.spark_options().items()})
    options.update(spark_offsets_options(ranges))
    if min_partitions:
        options["minPartitions"] = str(min_partitions)
    return options


def read_ranges(spark, kafka: KafkaSettings, ranges: Sequence[OffsetRange],
                min_partitions: int = 0):
    """Columns: key, value, topic, partition, offset, timestamp, timestampType, headers."""
    reader = spark.read.format("kafka")
    for key, value in reader_options(kafka, ranges, min_partitions).items():
        reader = reader.option(key, value)
    return reader.load()
