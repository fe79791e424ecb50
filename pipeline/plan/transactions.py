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
events, or its END, come again. Such a change written again is never applied again
(``TransactionCut.replays``; the rule, shared with ``pipeline verify``: plan/replays.py):
applied after the changes that followed its original, it would take the replica back to
an older state, one the source may never have had. Its original is earlier in the same
partition: in an earlier run (its transaction was published whole then) or earlier in the
range (the read task marks it, ``ReadPartition.replayed``).

A transaction whose events in a topic are partly or wholly *before* the ranges read is no
obstacle either: that happens only where a run without the cut published them (the first
run with ``transactions``, whose transaction topic is read from its earliest offset while
the data topics resume where they were; or after ``kafka.on_data_loss = "skip"``). It is
told from a transaction that is still being written by the order of each partition, which
is commit order: when every partition of the topic holds an event of a transaction that
committed later (and is not a duplicate of one published), the missing events are behind
the ranges, not ahead of them ("passed"). The first run also takes a partition with none
of the transaction's events as past it where its range resumes at a stored offset (its
data before it; not a new pipeline's partition read from its beginning, whose capped range
may simply end before the transaction's events), and a
transaction with no END read whose events are followed in their partition by a later
transaction's as one whose END lies before the transaction topic's earliest offset.

No I/O: the executors summarise what they read (``ReadPartition``), the driver reads the
END events, and this decides.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pipeline.errors import DataError
from pipeline.plan.offsets import OffsetRange, TopicPartition

_UNASKED = object()


@dataclass(frozen=True)
class TransactionEnd:
    """One END event of the transaction topic: source transaction ``tx`` committed,
    having written ``events`` per data collection (``"public.orders"``)."""

    tx: str
    offset: int  # in the transaction topic
    events: Mapping[str, int]


class Segment(NamedTuple):
    """Consecutive records of one read range that belong to one source transaction;
    ``tx`` None: records of none (a snapshot's reads, a tombstone). A named tuple: a
    backlog's summaries hold one per source transaction (tens of thousands), made on the
    driver between the read and the publish."""

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
    # Offset runs (first, last) of changes written again whose original is earlier in the
    # range (and the tombstone after such a delete): executor/segments.py.
    replayed: tuple[tuple[int, int], ...] = ()


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
    at, if any. ``unended``: transactions with events read but no END read yet.
    ``passed``: transactions whose missing events are behind the ranges read (published
    by a run without the cut, see the module's docstring): no obstacle, their events in
    the ranges published; recorded as published like ``included``. ``replays``: per
    partition, the offset runs (first, last) before its cut that the publisher leaves out:
    changes Kafka Connect wrote again (a transaction an earlier run published, a change
    read earlier in the range), with the tombstone after such a delete."""

    until: Mapping[TopicPartition, int]
    included: tuple[str, ...]
    metadata_next: int | None
    blocked: Blocked | None = None
    unended: tuple[str, ...] = ()
    passed: tuple[str, ...] = ()
    replays: Mapping[TopicPartition, tuple[tuple[int, int], ...]] = field(
        default_factory=dict)

    @property
    def published(self) -> tuple[str, ...]:
        """What the run records as published (pipeline_source_transactions)."""
        return self.included + self.passed

    def cut_short(self, ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
        """The ranges that end before their planned end."""
        return [r for r in ranges if self.until.get(r.tp, r.until_offset) < r.until_offset]


def cut_at_transactions(ends: Sequence[TransactionEnd], read: Sequence[ReadPartition],
                        topic_of: Callable[[str], str | None],
                        published: Collection[str] = (),
                        first_run: bool = False,
                        resumed: Collection[TopicPartition] | None = None) -> TransactionCut:
    """The cut of one run. ``ends``: the END events read from the transaction topic, in
    its order (commit order); ``read``: every partition of the pipeline's topics, each
    with what the run read of it (an empty range for a partition with nothing new: it
    still tells where its topic is); ``topic_of``: the pipeline's topic of a data
    collection (None: a table the pipeline does not read, whose events do not count);
    ``published``: transactions earlier runs published; ``first_run``: no offset of the
    transaction topic is stored yet (it is read from its earliest); ``resumed``: the
    partitions whose range starts after records read without the cut (an offset a run
    stored, a new pipeline's "latest"; None: all). Only there can the
    first run take a transaction's missing events as behind the range: a partition read
    from its beginning (a new pipeline's) has nothing behind it, and a transaction with no
    event in its capped range has them ahead."""
    events: dict[tuple[str, str], int] = {}
    for p in read:
        for tx, n in p.events.items():
            events[(tx, p.range.topic)] = events.get((tx, p.range.topic), 0) + n
    ends = sorted(ends, key=lambda e: e.offset)  # commit order (usually as read: cheap)
    first_end: dict[str, int] = {}
    for end in ends:
        first_end.setdefault(end.tx, end.offset)
    by_topic: dict[str, list[ReadPartition]] = {}
    topics: dict[str, str | None] = {}  # topic_of's answers: a run's ENDs name a few
    for p in read:
        by_topic.setdefault(p.range.topic, []).append(p)
    order = _commit_order(first_end, published)
    done = set(published)
    included: list[str] = []
    passed: list[str] = []
    metadata_next = None
    blocked = None
    for end in ends:
        if end.tx in done:  # again after a connector's restart, or published before
            metadata_next = end.offset + 1
            continue
        missing = {}
        behind = True
        for collection, want in end.events.items():
            topic = topics.get(collection, _UNASKED)
            if topic is _UNASKED:
                topic = topics[collection] = topic_of(collection)
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
                behind = behind and _past(end.tx, by_topic.get(topic, ()), order, first_run,
                                          resumed)
        if missing and not behind:
            blocked = Blocked(end.tx, missing)
            break
        done.add(end.tx)
        (passed if missing else included).append(end.tx)
        metadata_next = end.offset + 1
    until: dict[TopicPartition, int] = {}
    unended: dict[str, None] = {}
    ended = set(first_end) | set(published)
    for p in read:
        cut = p.range.until_offset
        for i, s in enumerate(p.segments):
            if s.tx is None or s.tx in done:
                continue
            if s.tx not in ended:
                if first_run and _followed_by_ended(p.segments[i + 1:], first_end,
                                                    published):
                    # Its END lies before the transaction topic's earliest offset: a later
                    # transaction's END was read, so its own came before.
                    done.add(s.tx)
                    passed.append(s.tx)
                    continue
                unended[s.tx] = None
            cut = min(cut, s.first_offset)
            break
        until[p.range.tp] = max(p.range.from_offset, cut)
    replays = {p.range.tp: runs for p in read
               if (runs := _replays(p, published, until[p.range.tp]))}
    return TransactionCut(until, tuple(included), metadata_next, blocked, tuple(unended),
                          tuple(passed), replays)


def _replays(p: ReadPartition, published: Collection[str], until: int
             ) -> tuple[tuple[int, int], ...]:
    """The offset runs of ``p`` before ``until`` that are changes written again: every
    segment of a transaction published by an earlier run (whole: each of its changes was
    published then), and what the read task marked as read earlier in the range; merged,
    in offset order."""
    runs = sorted([(s.first_offset, s.last_offset) for s in p.segments
                   if s.tx is not None and s.tx in published] + list(p.replayed))
    out: list[list[int]] = []
    for first, last in runs:
        last = min(last, until - 1)
        if first > last:
            continue
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return tuple((a, b) for a, b in out)


def _commit_order(first_end: Mapping[str, int], published: Collection[str]
                  ) -> Callable[[str | None], float]:
    """A transaction's place in commit order: its first END's offset; a transaction with
    no END read comes after all of them (its END is still to come); None (no transaction)
    and a transaction published before (a connector's restart writes it again after later
    ones) have no place: -inf, never evidence of a later one."""
    def place(tx: str | None) -> float:
        if tx is None or tx in published:
            return float("-inf")
        return first_end.get(tx, float("inf"))
    return place


def _past(tx: str, partitions: Sequence[ReadPartition], order, first_run: bool,
          resumed: Collection[TopicPartition] | None = None) -> bool:
    """Whether the events of ``tx`` missing from a topic's ``partitions`` are behind what
    was read: each partition holds an event of a transaction that committed after it (a
    partition is in commit order, so all of ``tx``'s events there came before that one),
    or, in the first run, none of its events (they lie before the stored offsets)."""
    if not partitions:
        return False  # nothing known of the topic: wait
    mine = order(tx)
    for p in partitions:
        if (first_run and tx not in p.events
                and (resumed is None or p.range.tp in resumed)):
            continue
        if not any(order(s.tx) > mine for s in p.segments):
            return False
    return True


def _followed_by_ended(later: Sequence[Segment], first_end: Mapping[str, int],
                       published: Collection[str]) -> bool:
    """A later segment of the partition is of a transaction whose END was read (and that
    is not a duplicate of one published before)."""
    return any(s.tx is not None and s.tx in first_end and s.tx not in published
               for s in later)


def collection_topics(transaction_topic: str, topics: Collection[str]
                      ) -> Callable[[str], str | None]:
    """``topic_of`` for Debezium's default topic names: the data collection
    ``<schema>.<table>`` is the topic ``<prefix>.<schema>.<table>``, ``<prefix>`` the
    transaction topic's (``<prefix>.transaction``); None for a topic the pipeline does not
    read."""
    prefix = transaction_topic.rsplit(".", 1)[0] if "." in transaction_topic else ""
    names = set(topics)

    def topic_of(collection: str) -> str | None:
        topic = f"{prefix}.{collection}" if prefix else collection
        return topic if topic in names else None
    return topic_of
