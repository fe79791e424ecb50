"""The re-read and hash of published ranges (``pipeline verify`` against the ledger), on the
driver or as Spark tasks: a span of consecutive ranges of one partition is read once with
one consumer (consume.read_range), each batch's slice inside a range going to that range's
hash (content_hash.hasher of its kind). Imports no SQLAlchemy: it runs on executors too."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from operator import methodcaller

from pipeline.executor.content_hash import hasher
from pipeline.plan.offsets import OffsetRange

_offset = methodcaller("offset")
Reader = Callable[[OffsetRange], Iterable[list]]  # batches of Messages of a range
Hashed = tuple[int, bytes]  # (records, digest) of one range


def hash_span(span: list[tuple[OffsetRange, str]], read: Reader) -> list[Hashed]:
    """``span``: (range, hash kind) by from_offset, all of one partition, overlapping or
    adjacent; one read over their union."""
    first = span[0][0]
    whole = OffsetRange(first.topic, first.partition, first.from_offset,
                        max(r.until_offset for r, _ in span))
    hashes = [hasher(kind)() for _, kind in span]
    for batch in read(whole):
        offsets = list(map(_offset, batch))  # C calls, no Python frame per record
        lo, hi = offsets[0], offsets[-1]
        for (r, _), h in zip(span, hashes, strict=True):
            if r.from_offset > hi:
                break  # ranges are by from_offset: none further starts in this batch
            if r.until_offset > lo:
                h.add(batch[bisect_left(offsets, r.from_offset):
                            bisect_left(offsets, r.until_offset)])
    return [(h.records, h.digest()) for h in hashes]


def span_hasher(reader: dict, timeout_seconds: float):
    """A picklable function for ``RDD.mapPartitions`` over spans (one per Spark partition):
    yields (span index, [(records, digest) per range], None), or (span index, None, (kind,
    message)) when a range cannot be read: only these small results reach the driver."""

    def hash_spans(items):
        from pipeline.errors import TaskError
        from pipeline.executor.consume import read_range

        for index, span in items:
            try:
                yield index, hash_span(span, lambda r: read_range(reader, r, timeout_seconds)
                                       ), None
            except TaskError as e:  # crosses to the driver as plain data, classified there
                yield index, None, (str(e.kind), e.message)

    return hash_spans
