"""A read range's summary by source transaction (``[sink] transactions``): what the driver
needs to cut the run at whole source transactions (plan/transactions.py) without reading a
record again.

The range's records, in offset order, fall into segments: runs of consecutive records of
one source transaction, or of none (a snapshot's reads, tombstones, records that are not
change events). Each segment is staged with the number of the range's records before it
and the range's content hash (content_hash.py) up to it, so that the ledger row of
``[from, cut)`` is known for a cut at any segment's start; per transaction, the distinct
events the range holds, by their order in their table (``data_collection_order``): a change
Kafka Connect wrote again after a restart counts once. A partition's range is read by one
task whole (plan/split.py, ``whole``), so these counts are exact per partition.

The blob (executor/staging.py, kind SEGMENTS) is JSON: ``{"segments": [[tx, first_offset,
last_offset, records_before, digest_before_hex], ...], "events": {tx: distinct events}}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pipeline.executor.content_hash import ContentHash


class RangeSegments:
    """``s.add(records, sources)`` for each batch of a range in offset order (``sources``:
    each record's (transaction, data_collection_order) or None,
    formats.encode.Encoder.transactions), then ``s.blob()``; ``s.hash`` is the range's
    content hash, as the HASH summary stages it."""

    __slots__ = ("hash", "segments", "orders", "started")

    def __init__(self) -> None:
        self.hash = ContentHash()
        self.segments: list[list] = []
        self.orders: dict[str, set[int]] = {}
        self.started: dict[str, int] = {}

    def add(self, records: Sequence, sources: Sequence[tuple[str, int] | None]) -> None:
        h, segments, orders = self.hash, self.segments, self.orders
        current = segments[-1] if segments else None
        start = 0  # records of this batch not hashed yet
        for i, (m, source) in enumerate(zip(records, sources, strict=True)):
            tx = None if source is None else source[0]
            if current is None or current[0] != tx:
                if i > start:
                    h.add(records[start:i])
                    start = i
                current = [tx, m.offset(), m.offset(), h.records, h.digest().hex()]
                segments.append(current)
            else:
                current[2] = m.offset()
            if source is not None:
                if tx not in orders:
                    self.started[tx] = m.timestamp()[1]
                orders.setdefault(tx, set()).add(source[1])
        if start < len(records):
            h.add(records[start:])

    def blob(self) -> bytes:
        return json.dumps({"segments": self.segments,
                           "events": {tx: len(o) for tx, o in self.orders.items()},
                           "started": self.started},
                          separators=(",", ":")).encode()


def parse(blob: bytes) -> tuple[list[tuple[str | None, int, int, int, bytes]], dict[str, int]]:
    """A SEGMENTS blob back: ([(tx, first_offset, last_offset, records_before,
    digest_before)], {tx: distinct events})."""
    doc = json.loads(blob)
    return ([(tx, first, last, before, bytes.fromhex(digest))
             for tx, first, last, before, digest in doc["segments"]], doc["events"])


def started(blob: bytes) -> dict[str, int]:
    """A SEGMENTS blob's first Kafka timestamp (ms) of each transaction in the range."""
    return json.loads(blob).get("started", {})
