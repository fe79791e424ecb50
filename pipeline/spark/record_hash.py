"""A transform run's content hash per range (content_hash.RecordSum, kind ``md5sum``), in
Spark SQL where Spark's Kafka source reads the records: no Python per record and no second
read. Each record's MD5 (over the framing content_hash.py uses: offset, key and value
lengths, -1 for a null, then the key and value bytes) is kept as 16 bytes in the run's
cached parse (transform.mark carries it); one aggregate over the cache then gives, per
partition, the records read (those the transform filters out included) and the sum of the
digests, split in two 64-bit halves summed as decimals (no overflow)."""

from __future__ import annotations

from typing import NamedTuple

from pipeline.executor.content_hash import from_sum

DIGEST = "_record_md5"  # the per-record digest column, carried through transform.mark


class RangeRead(NamedTuple):
    """What a transform run read of one partition's planned range."""

    records: int
    content_hash: bytes


def _be(F, col, nbytes: int):
    # Big-endian two's complement: hex() of a negative int is its 64-bit form, and lpad
    # to fewer characters keeps the leftmost ones, so -1 becomes FFFFFFFF.
    return F.unhex(F.lpad(F.hex(col), 2 * nbytes, "0"))


def record_digest(F):
    """The column DIGEST of a Kafka source DataFrame (offset, key, value)."""
    key, value = F.col("key"), F.col("value")
    empty = F.unhex(F.lit(""))
    return F.unhex(F.md5(F.concat(
        _be(F, F.col("offset"), 8),
        _be(F, F.coalesce(F.length(key), F.lit(-1)), 4),
        _be(F, F.coalesce(F.length(value), F.lit(-1)), 4),
        F.coalesce(key, empty), F.coalesce(value, empty))))


def range_reads(cached, F) -> dict[tuple[str, int], RangeRead]:
    """Per (topic, partition): records read and their content hash (a small job over the
    cache; a partition with no record returns nothing: 0 records, hash 0)."""
    def half(start: int):
        return F.sum(F.conv(F.hex(F.substring(F.col(DIGEST), start, 8)), 16, 10)
                     .cast("decimal(20,0)"))

    got = cached.groupBy("topic", "partition").agg(
        F.count(F.lit(1)).alias("n"), half(1).alias("hi"), half(9).alias("lo")).collect()
    return {(r["topic"], r["partition"]): RangeRead(
        r["n"], from_sum((int(r["hi"]) << 64) + int(r["lo"]))) for r in got}
