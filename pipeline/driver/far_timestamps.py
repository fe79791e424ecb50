"""The records of a transform run Spark's Kafka source cannot read, found on the driver.

Spark's source turns a record's timestamp into int64 microseconds itself and fails the
whole read on one past plan/far_records.SPARK_MAX_MS ("long overflow"), every run: one
record would stop the pipeline. Each run asks Kafka once for every planned partition's
largest timestamp (one ListOffsets request, KIP-734); only a partition that holds such a
record is read here, from its first far record (a second ListOffsets) to its range's end,
and its far records go on as dead letters (spark/far_records.py), the rest through Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

from pipeline.config import Settings
from pipeline.plan.far_records import SPARK_MAX_MS
from pipeline.plan.offsets import OffsetRange

log = logging.getLogger("pipeline")


class FarRecord(NamedTuple):
    """A record as Kafka returned it, its timestamp past what Spark can hold."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int  # epoch ms


def far_records(settings: Settings, ranges: Sequence[OffsetRange]) -> list[FarRecord]:
    """Every record of ``ranges`` whose timestamp is past SPARK_MAX_MS, in offset order."""
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.driver.kafka_records import batches
    from pipeline.executor.consume import reader_config

    ranges = [r for r in ranges if r.count > 0]
    if not ranges:
        return []
    meta = KafkaMeta(settings.kafka)
    largest = meta.max_timestamps([r.tp for r in ranges])
    if largest is None:
        log.warning("Kafka at %s does not tell a partition's largest timestamp (before Kafka "
                    "3.0): a record past %d ms would fail this transform run",
                    settings.kafka.bootstrap_servers, SPARK_MAX_MS,
                    extra={"event": "read.far_unchecked"})
        return []
    over = [tp for tp, ts in largest.items() if ts > SPARK_MAX_MS]
    if not over:
        return []
    # The log's first far record: a partition whose far records all precede the range
    # (one already dead-lettered, still retained) is read from the range's start.
    first = meta.first_offsets_for_time(over, SPARK_MAX_MS + 1)
    k = settings.kafka
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-reader")
    found: list[FarRecord] = []
    for r in sorted(ranges):
        if r.tp not in over or first.get(r.tp, -1) >= r.until_offset:
            continue
        scan = OffsetRange(r.topic, r.partition, max(r.from_offset, first.get(r.tp, -1)),
                           r.until_offset)
        for batch in batches(reader, scan, k.timeout_seconds, what="far-timestamp scan"):
            for m in batch:
                ts = m.timestamp()[1]
                if ts > SPARK_MAX_MS:
                    found.append(FarRecord(m.topic(), m.partition(), m.offset(), m.key(),
                                           m.value(), list(m.headers() or []), ts))
        log.info("%s: its log holds a timestamp past what Spark can read; scanned %s on the "
                 "driver", r, scan, extra={"event": "read.far_scan", **scan.as_dict()})
    if found:
        log.warning("%d records with a timestamp past what Spark can read become dead letters "
                    "timestamp_out_of_range: %s", len(found),
                    ", ".join(f"{f.topic}[{f.partition}]@{f.offset}" for f in found[:10]),
                    extra={"event": "read.far_records", "records": len(found)})
    return found
