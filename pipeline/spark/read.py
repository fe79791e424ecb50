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


def read_ranges(spark, kafka: KafkaSettings, ranges: Sequence[OffsetRange],
                min_partitions: int = 0):
    """Columns: key, value, topic, partition, offset, timestamp, timestampType, headers."""
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("kafka.isolation.level", kafka.isolation_level)
        .option("includeHeaders", "true")
        # Decided from what is read: Spark passes an offset the log still covers but holds
        # no record for (transaction markers, aborted records, compaction) and fails on one
        # it no longer covers (retention, a truncated log) - errors.explain_data_loss says
        # which.
        .option("failOnDataLoss", "true")
    )
    # One poll that returns nothing waits this long (Spark's default: spark.network.timeout,
    # 120 s): a truncated log or an unreachable broker is then found as fast as by the
    # built-in reader.
    reader = reader.option("kafkaConsumer.pollTimeoutMs", str(int(kafka.timeout_seconds * 1000)))
    # Larger fetches than the Java client's defaults (1 MB per partition): fewer round trips
    # per record; [kafka.spark_consumer] may override them.
    reader = (reader.option("kafka.max.partition.fetch.bytes", str(16 << 20))
              .option("kafka.fetch.max.bytes", str(64 << 20)))
    for key, value in kafka.spark_options().items():
        reader = reader.option(f"kafka.{key}", value)
    for key, value in spark_offsets_options(ranges).items():
        reader = reader.option(key, value)
    if min_partitions:
        reader = reader.option("minPartitions", str(min_partitions))
    return reader.load()
