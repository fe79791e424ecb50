"""Pure offset planning: stored offsets + what Kafka holds -> explicit ranges.

No Spark, no I/O. Offsets follow Kafka's convention: a stored offset is the *next*
offset to read, and a range ``[from_offset, until_offset)`` excludes its end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.errors import DataError

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    topic: str
    partition: int
    from_offset: int
    until_offset: int  # exclusive

    def __post_init__(self) -> None:
        if self.from_offset < 0 or self.until_offset < self.from_offset:
            raise ValueError(f"bad range {self}")

    @property
    def count(self) -> int:
        """Offsets spanned; records may be fewer (transaction markers, compaction)."""
        return self.until_offset - self.from_offset

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] [{self.from_offset}, {self.until_offset})"

    def as_dict(self, *, count: bool = True) -> dict[str, Any]:
        """The one dict shape of a range (JSON output, run rows). ``count=False`` leaves out
        the number of offsets: the shape run rows store (sql/002_runs.sql)."""
        d: dict[str, Any] = {"topic": self.topic, "partition": self.partition,
                             "from": self.from_offset, "until": self.until_offset}
        if count:
            d["offsets"] = self.count
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OffsetRange:
        """The range back from ``as_dict``'s shape (a run row's planned ranges)."""
        return cls(d["topic"], d["partition"], d["from"], d["until"])


@dataclass(frozen=True)
class PartitionOffsets:
    """What Kafka holds for one partition, resolved for one isolation level."""

    topic: str
    partition: int
    earliest: int
    latest: int  # high watermark, or last stable offset under read_committed
    topic_id: str | None = None  # Kafka's topic ID: a recreated topic gets a new one


@dataclass(frozen=True)
class PlannedPartition:
    range: OffsetRange
    stored: int | None  # the compare-and-set's expected value; None = no row yet
    lost: OffsetRange | None = None  # deleted by retention and skipped (policy "skip")
    # A new, empty partition read from "earliest" needs no row yet: the next run resolves
    # the same start. Under "latest" the position is pinned so later records are not skipped.
    pin_new: bool = False

    @property
    def moves_offset(self) -> bool:
        if self.stored is None:
            return self.range.count > 0 or self.pin_new
        return self.stored != self.range.until_offset

    def as_dict(self) -> dict[str, Any]:
        """The range with the stored offset it starts from (a dry run's plan)."""
        return {**self.range.as_dict(), "stored": self.stored}


@dataclass(frozen=True)
class Plan:
    partitions: tuple[PlannedPartition, ...]
    # Each planned topic's Kafka topic ID, stored with the offsets the plan moves.
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    @property
    def ranges(self) -> list[OffsetRange]:
        """The non-empty ranges: what Spark must read."""
        return [p.range for p in self.partitions if p.range.count > 0]

    @property
    def offset_updates(self) -> list[PlannedPartition]:
        return [p for p in self.partitions if p.moves_offset]

    @property
    def lost_ranges(self) -> list[OffsetRange]:
        return [p.lost for p in self.partitions if p.lost]

    @property
    def is_empty(self) -> bool:
        """Nothing to read and no offset to move: no Spark, no write transaction."""
        return not self.offset_updates

    @property
    def offset_span(self) -> int:
        return sum(r.count for r in self.ranges)


def topic_ids_of(kafka: Iterable[PartitionOffsets]) -> dict[str, str]:
    return {k.topic: k.topic_id for k in kafka if k.topic_id}


def check_topic_ids(stored_ids: Mapping[str, Iterable[str]], kafka_ids: Mapping[str, str],
                    what: str = "the stored offsets") -> None:
    """Offsets (and rows) belong to one incarnation of a topic. A topic deleted and created
    again under the same name has a new ID and starts again at offset 0: reading it from
    the old offsets would skip its records, or drop them as "already there". Legacy rows
    without an ID (stored before IDs were) are not compared."""
    for topic in sorted(kafka_ids):
        old = sorted(set(stored_ids.get(topic, ())) - {kafka_ids[topic]})
        if old:
            raise DataError(
                f"topic '{topic}' was deleted and recreated: {what} belong to topic ID "
                f"{', '.join(old)}, Kafka's '{topic}' is now {kafka_ids[topic]}; run "
                f"'pipeline offsets reset --topic {topic} --to earliest' to archive the old "
                "topic's rows and read the new one from its start; nothing committed")


def plan_ranges(
    stored: Mapping[TopicPartition, int],
    kafka: Iterable[PartitionOffsets],
    *,
    stored_topic_ids: Mapping[str, Iterable[str]] | None = None,
    starting_offsets: str = "earliest",
    max_records_per_partition: int = 0,
    max_records_per_run: int = 0,
    on_data_loss: str = "fail",
) -> Plan:
    """Plan one run: per partition ``[stored next offset, latest)``, capped per partition
    and per run (0 = no cap): a backlog is drained by successive bounded runs, each one
    transaction of bounded size.

    A topic whose Kafka ID differs from the stored one was recreated: an error before
    anything is planned (``check_topic_ids``). Partitions come from Kafka's metadata
    every run, so partitions added since the last run are picked up. ``starting_offsets``
    applies to a topic's first run only: like Spark's own Kafka source, a partition added
    to a topic we already read starts at its earliest offset, or records written to it
    before the next run would be skipped.
    """
    kafka = sorted(kafka, key=lambda k: (k.topic, k.partition))
    topic_ids = topic_ids_of(kafka)
    check_topic_ids(stored_topic_ids or {}, topic_ids)
    seen = {(k.topic, k.partition) for k in kafka}
    topics = {k.topic for k in kafka}
    for (topic, partition), next_offset in sorted(stored.items()):
        if topic in topics and (topic, partition) not in seen:
            raise DataError(
                f"{topic}[{partition}]: stored next offset {next_offset} but the topic has no "
                f"partition {partition} now (deleted and recreated?); inspect with "
                f"'pipeline offsets show' and reset with 'pipeline offsets reset --topic {topic}'")

    known_topics = {topic for topic, _ in stored}
    planned = []
    for k in kafka:
        if k.earliest > k.latest:
            raise ValueError(f"{k.topic}[{k.partition}]: earliest {k.earliest} > latest {k.latest}")
        current = stored.get((k.topic, k.partition))
        lost = None
        from_latest = starting_offsets == "latest" and k.topic not in known_topics
        if current is None:
            start = k.latest if from_latest else k.earliest
        elif current > k.latest:
            raise DataError(
                f"{k.topic}[{k.partition}]: stored next offset {current} is beyond the latest "
                f"offset {k.latest} (log truncated, e.g. by an unclean leader election, or a "
                f"different cluster?); reset it with 'pipeline offsets reset --topic {k.topic} "
                f"--partition {k.partition} --to earliest' (an aggregate pipeline: --to "
                "latest, which counts nothing twice)")
        elif current < k.earliest:
            lost = OffsetRange(k.topic, k.partition, current, k.earliest)
            if on_data_loss != "skip":
                raise DataError(
                    f"data loss: {k.topic}[{k.partition}] offsets [{current}, {k.earliest}) were "
                    f"deleted (retention) before they were read; set kafka.on_data_loss = 'skip' "
                    f"to continue from {k.earliest} and record the gap, or restore the data")
            start = k.earliest
        else:
            start = current
        until = k.latest
        if max_records_per_partition:
            until = min(until, start + max_records_per_partition)
        planned.append(PlannedPartition(OffsetRange(k.topic, k.partition, start, until),
                                        current, lost,
                                        pin_new=current is None and from_latest))
    if max_records_per_run:
        # Who gets the remainder of an uneven split rotates with the offsets read so far:
        # derived from the stored state (a dry run shows the run that follows) and, while
        # more partitions have a backlog than the budget has offsets, it moves on by exactly
        # the budget each run, so each of them advances within ceil(partitions / budget)
        # runs (tests/unit/test_offsets.py proves it on random backlogs).
        rotation = sum(p.range.from_offset for p in planned)
        shares = share_budget([p.range.count for p in planned], max_records_per_run,
                              rotation=rotation)
        planned = [replace(p, range=replace(p.range, until_offset=p.range.from_offset + n))
                   for p, n in zip(planned, shares, strict=True)]
    return Plan(tuple(planned), topic_ids)


def share_budget(counts: Sequence[int], budget: int, rotation: int = 0) -> list[int]:
    """Split ``budget`` offsets over partitions that have ``counts`` to read: each gets at
    most its count, and what one does not need goes to the others (max-min fair), so a
    busy partition cannot starve a quiet one. The remainder of an uneven split goes to the
    partitions that come first in plan order counted cyclically from position ``rotation``
    (mod the number of partitions): the same inputs give the same plan, and a caller that
    moves ``rotation`` on between runs spreads the remainder over every partition (with a
    budget below the number of partitions with a backlog, the remainder is everything)."""
    shares = [0] * len(counts)
    remaining = budget
    open_ = [i for i, count in enumerate(counts) if count > 0]
    while open_ and remaining > 0:
        share, extra = divmod(remaining, len(open_))
        if share == 0:
            start = rotation % len(counts)
            for i in ([i for i in open_ if i >= start] + [i for i in open_ if i < start])[:extra]:
                shares[i] += 1
            break
        still_open = []
        for i in open_:
            take = min(share, counts[i] - shares[i])
            shares[i] += take
            remaining -= take
            if shares[i] < counts[i]:
                still_open.append(i)
        open_ = still_open
    return shares


def plan_backfill(
    kafka: Iterable[PartitionOffsets],
    *,
    from_offsets: Mapping[TopicPartition, int],
    until_offsets: Mapping[TopicPartition, int],
) -> list[OffsetRange]:
    """Explicit ranges for a backfill, checked against what Kafka holds, before any work."""
    held = {(k.topic, k.partition): k for k in kafka}
    ranges = []
    for tp in sorted(from_offsets):
        topic, partition = tp
        if tp not in held:
            raise DataError(f"{topic}[{partition}]: no such partition in Kafka")
        k = held[tp]
        start, until = from_offsets[tp], until_offsets[tp]
        if until < start:
            raise DataError(f"{topic}[{partition}]: --to-offset {until} is before "
                            f"--from-offset {start}")
        if start < k.earliest or until > k.latest:
            raise DataError(
                f"{topic}[{partition}] [{start}, {until}) is outside what Kafka holds "
                f"[{k.earliest}, {k.latest}); choose a range inside it")
        if until > start:
            ranges.append(OffsetRange(topic, partition, start, until))
    return ranges


def chunk_ranges(ranges: Sequence[OffsetRange], *, max_records_per_partition: int = 0,
                 max_records_per_run: int = 0) -> list[list[OffsetRange]]:
    """Split a backfill's ranges into successive chunks, each within the caps of one
    ingest run (0 = no cap): a long backfill becomes a sequence of bounded transactions.

    Each chunk is planned as an ingest run would be, from where the previous chunk ended:
    per range at most ``max_records_per_partition`` offsets, then ``max_records_per_run``
    shared fairly (``share_budget``). Every offset of every range is in exactly one
    chunk; a range's pieces come in offset order, contiguous; no caps = one chunk. An
    empty input (or only empty ranges) gives no chunk."""
    ranges = [r for r in ranges if r.count > 0]
    position = [r.from_offset for r in ranges]
    chunks: list[list[OffsetRange]] = []
    while True:
        counts = [r.until_offset - at for r, at in zip(ranges, position, strict=True)]
        if not any(counts):
            return chunks
        if max_records_per_partition:
            counts = [min(n, max_records_per_partition) for n in counts]
        if max_records_per_run:
            counts = share_budget(counts, max_records_per_run, rotation=sum(position))
        chunk = []
        for i, (r, n) in enumerate(zip(ranges, counts, strict=True)):
            if n:
                chunk.append(OffsetRange(r.topic, r.partition, position[i], position[i] + n))
                position[i] += n
        chunks.append(chunk)


def subtract_ranges(ranges: Sequence[OffsetRange], done: Iterable[OffsetRange]
                    ) -> list[OffsetRange]:
    """What of ``ranges`` is not covered by ``done`` (same topic and partition): the part
    of an interrupted backfill still to run, in order."""
    covered: dict[TopicPartition, list[tuple[int, int]]] = {}
    for d in done:
        covered.setdefault(d.tp, []).append((d.from_offset, d.until_offset))
    left = []
    for r in sorted(ranges):
        start = r.from_offset
        for a, b in sorted(covered.get(r.tp, [])):
            if b <= start or a >= r.until_offset:
                continue
            if a > start:
                left.append(OffsetRange(r.topic, r.partition, start, a))
            start = max(start, b)
        if start < r.until_offset:
            left.append(OffsetRange(r.topic, r.partition, start, r.until_offset))
    return left
