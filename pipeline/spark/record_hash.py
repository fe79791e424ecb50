"""A transform run's content hash per range (content_hash.RecordSum, kind ``md5sum``), in
Spark SQL where Spark's Kafka source reads the records: no Python per record and no second
read. Each record's MD5 (over the framing content_hash.py uses: offset, key and value
lengths, -1 for a null, then the key and value bytes) is kept as its hex in the run's
cached parse (transform.mark carries it); one aggregate over the cache then gives, per
partition, the records read (those the transform filters out included) and the sum of the
digests."""

from __future__ import annotations

from typing import NamedTuple

from pipeline.executor.content_hash import from_sum

DIGEST = "_record_md5"  # the per-record digest column, carried through transform.mark


class RangeRead(NamedTuple):
    """What a transform run read of one partition's planned range."""

    records: int
    content_hash: bytes


def _hex(F, col, nbytes: int):
    # Big-endian two's complement in hex: hex() of a negative int is its 64-bit form, and
    # lpad to fewer characters keeps the leftmost ones, so -1 (a null) becomes FFFFFFFF.
    return F.lpad(F.hex(col), 2 * nbytes, "0")


def record_digest(F):
    """The column DIGEST of a Kafka source DataFrame (offset, key, value): MD5's hex."""
    key, value = F.col("key"), F.col("value")
    empty = F.unhex(F.lit(""))
    header = F.unhex(F.concat(_hex(F, F.col("offset"), 8),
                              _hex(F, F.coalesce(F.length(key), F.lit(-1)), 4),
                              _hex(F, F.coalesce(F.length(value), F.lit(-1)), 4)))
    return F.md5(F.concat(header, F.coalesce(key, empty), F.coalesce(value, empty)))


def range_reads(cached, F) -> dict[tuple[str, int], RangeRead]:
    """Per (topic, partition): records read and their content hash (a small job over the
    cache; a partition with no record returns nothing: 0 records, hash 0). The digest is
    summed in four 32-bit quarters as longs: no overflow below 2**31 records per range, and
    no decimal arithmetic (BigDecimal in Spark past 18 digits)."""
    quarters = [F.sum(F.conv(F.substring(F.col(DIGEST), 1 + 8 * i, 8), 16, 10)
                      .cast("bigint")).alias(f"q{i}") for i in range(4)]
    got = cached.groupBy("topic", "partition").agg(F.count(F.lit(1)).alias("n"),
                                                    *quarters).collect()
    return {(r["topic"], r["partition"]): RangeRead(r["n"], from_sum(
        sum(int(r[f"q{i}"]) << (32 * (3 - i)) for i in range(4)))) for r in got}
