"""Pure planning of a run's cut at whole source transactions (change data capture).

A database captured by Debezium writes each table's changes to its own topic and, with
``provide.transaction.metadata``, one END event per source transaction to a transaction
topic: how many events the transaction wrote to each table ("data collection"). A run that
published some of a transaction's events and not the others would show a reader of the
replica half of it: an order without its lines, a transfer debited and not credited.

So a run reads its planned ranges, then publishes only up to a cut: the source
transactions in commit order (the transaction topic's order) while each is complete within
what was read (every data collection holds as many of its events as its END says), and
stops at the first that is not. Every partition's range ends where the first event of a
transaction not published starts; the rest is read again by the next run. The replica then
always holds the source as it was after some commit.

Kafka Connect delivers at least once: after a worker's crash a transaction's events (and
its END) can be written again. Events are counted by their order within the transaction
(duplicates once), and a transaction an earlier run published is no obstacle when its
events, or its END, come again.

No I/O: the executors summarise what they read (``ReadPartition``), the driver reads the
END events, and this decides.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.errors import DataError
from pipeline.plan.offsets import OffsetRange, TopicPartition


@dataclass(frozen=True)
class TransactionEnd:
    """One END event of the transaction topic: source transaction ``tx`` committed,
    having written ``events`` per data collection (``"public.orders"``)."""

    tx: str
    offset: int  # in the transaction topic
    events: Mapping[str, int]


@dataclass(frozen=True)
class Segment:
    """Consecutive records of one read range that belong to one source transaction;
    ``tx`` None: records of none (a snapshot's reads, a tombstone)."""

    tx: str | None
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class ReadPartition:
    """What a read task saw of one partition: its range, the range's records as segments
    in offset order, and per transaction the distinct events read (by their order within
    the transaction: a duplicate counts once)."""

    range: OffsetRange
    segments: tuple[Segment, ...] = ()
    events: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Blocked:
    """The first transaction in commit order that the read ranges do not hold whole:
    per topic, (events read, events its END names)."""

    tx: str
    missing: Mapping[str, tuple[int, int]]

    def __str__(self) -> str:
        parts = ", ".join(f"{t} has {have} of {want}"
                          for t, (have, want) in sorted(self.missing.items()))
        return f"source transaction {self.tx} ({parts})"


@dataclass(frozen=True)
class TransactionCut:
    """``until``: per read partition, where its published part ends (exclusive; the
    range's own end when it holds no event of a transaction left out). ``included``: the
    transactions published, in commit order. ``metadata_next``: the transaction topic's
    next offset to read (None: where it was). ``blocked``: the transaction the cut stops
    at, if any. ``unended``: transactions with events read but no END read yet."""

    until: Mapping[TopicPartition, int]
    included: tuple[str, ...]
    metadata_next: int | None
    blocked: Blocked | None = None
    unended: tuple[str, ...] = ()

    def cut_short(self, ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
        """The ranges that end before their planned end."""
        return [r for r in ranges if self.until.get(r.tp, r.until_offset) < r.until_offset]


def cut_at_transactions(ends: Sequence[TransactionEnd], read: Sequence[ReadPartition],
                        topic_of: Callable[[str], str | None],
                        published: Collection[str] = ()) -> TransactionCut:
    """The cut of one run. ``ends``: the END events read from the transaction topic, in
    its order (commit order); ``read``: every partition the run read; ``topic_of``: the
    pipeline's topic of a data collection (None: a table the pipeline does not read, whose
    events do not count); ``published``: transactions earlier runs published."""
    events: dict[tuple[str, str], int] = {}
    for p in read:
        for tx, n in p.events.items():
            events[(tx, p.range.topic)] = events.get((tx, p.range.topic), 0) + n
    done = set(published)
    included: list[str] = []
    metadata_next = None
    blocked = None
    for end in sorted(ends, key=lambda e: e.offset):
        if end.tx in done:  # again after a connector's restart, or published before
            metadata_next = end.offset + 1
            continue
        missing = {}
        for collection, want in end.events.items():
            topic = topic_of(collection)
            if topic is None:
                continue
            have = events.get((end.tx, topic), 0)
            if have > want:
                raise DataError(
                    f"source transaction {end.tx}: {have} distinct events read from topic "
                    f"{topic}, more than the {want} its END event (transaction topic offset "
                    f"{end.offset}) names for {collection}; the topic and the transaction "
                    "metadata disagree (were events written to the topic by another "
                    "producer?): check the connector, nothing was published")
            if have < want:
                missing[topic] = (have, want)
        if missing:
            blocked = Blocked(end.tx, missing)
            break
        done.add(end.tx)
        included.append(end.tx)
        metadata_next = end.offset + 1
    until: dict[TopicPartition, int] = {}
    unended: dict[str, None] = {}
    ended = {e.tx for e in ends} | set(published)
    for p in read:
        cut = p.range.until_offset
        for s in p.segments:
            if s.tx is None or s.tx in done:
                continue
            if s.tx not in ended:
                unended[s.tx] = None
            cut = min(cut, s.first_offset)
            break
        until[p.range.tp] = max(p.range.from_offset, cut)
    return TransactionCut(until, tuple(included), metadata_next, blocked, tuple(unended))
