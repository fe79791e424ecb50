"""A read range's summary by source transaction (``[sink] transactions``): what the driver
needs to cut the run at whole source transactions (plan/transactions.py) without reading a
record again.

The range's records, in offset order, fall into segments: runs of consecutive records of
one source transaction, or of none (a snapshot's reads, tombstones, records that are not
change events). Each segment is staged with the number of the range's records before it
and the range's content hash (content_hash.py) up to it, so that the ledger row of
``[from, cut)`` is known for a cut at any segment's start; per transaction, the distinct
events the range holds, by their order in their table (``data_collection_order``): a change
Kafka Connect wrote again after a restart counts once, and its offset is marked
``replayed`` (plan/replays.py: the first of an identity in the range wins; the publisher
leaves the others out), as is the tombstone after such a delete. A tombstone right after a
change of its key goes into that change's segment (Debezium's tombstone after a delete: it
is published, or left out, with its delete). A partition's range is read by one task whole
(plan/split.py, ``whole``), so these counts are exact per partition.

The blob (executor/staging.py, kind SEGMENTS) is JSON: ``{"segments": [[tx, first_offset,
last_offset, records_before, digest_before_hex], ...], "events": {tx: distinct events},
"started": {tx: first Kafka ms}, "replayed": [[first_offset, last_offset], ...]}``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from pipeline.executor.content_hash import ContentHash
from pipeline.plan.replays import Identities, Replays


class RangeSegments:
    """``s.add(records, sources)`` for each batch of a range in offset order (``sources``:
    each record's (transaction, data_collection_order) or None,
    formats.encode.Encoder.transactions), then ``s.blob()``; ``s.hash`` is the range's
    content hash, as the HASH summary stages it."""

    __slots__ = ("hash", "segments", "started", "identities", "replays")

    def __init__(self) -> None:
        self.hash = ContentHash()
        self.segments: list[list] = []
        self.started: dict[str, int] = {}
        self.identities = Identities()
        self.replays = Replays()  # its identities met: the distinct events per transaction

    def add(self, records: Sequence, sources: Sequence[tuple[str, int] | None]) -> None:
        h, segments, started = self.hash, self.segments, self.started
        identity_of, replay = self.identities.of, self.replays.add
        current = segments[-1] if segments else None
        start = 0  # records of this batch not hashed yet
        for i, (m, source) in enumerate(zip(records, sources, strict=True)):
            identity = identity_of(m.offset(), m.key(), m.value() is None, source)
            replay(m.offset(), identity)
            tx = None if identity is None else identity[0]  # a tombstone: its delete's
            if current is None or current[0] != tx:
                if i > start:
                    h.add(records[start:i])
                    start = i
                current = [tx, m.offset(), m.offset(), h.records, h.digest().hex()]
                segments.append(current)
            else:
                current[2] = m.offset()
            if source is not None and tx not in started:
                started[tx] = m.timestamp()[1]
        if start < len(records):
            h.add(records[start:])

    def blob(self) -> bytes:
        import orjson

        events = Counter(tx for tx, _ in self.replays.seen)
        return orjson.dumps({"segments": self.segments, "events": events,
                             "started": self.started, "replayed": self.replays.runs})


class Summary(NamedTuple):
    """A SEGMENTS blob read back: ``segments`` [(tx, first_offset, last_offset,
    records_before, digest_before)], ``events`` {tx: distinct events}, ``started`` {tx:
    first Kafka ms}, ``replayed`` the offset runs (first, last) of changes read earlier in
    the range (written again)."""

    segments: list[tuple[str | None, int, int, int, bytes]]
    events: dict[str, int]
    started: dict[str, int]
    replayed: tuple[tuple[int, int], ...]


def summary(blob: bytes) -> Summary:
    """A SEGMENTS blob back, parsed once (a backlog's blob holds a segment per source
    transaction: tens of thousands)."""
    import orjson

    doc = orjson.loads(blob)
    fromhex = bytes.fromhex
    return Summary([(tx, first, last, before, fromhex(digest))
                    for tx, first, last, before, digest in doc["segments"]], doc["events"],
                   doc.get("started", {}), tuple((a, b) for a, b in doc.get("replayed", ())))

