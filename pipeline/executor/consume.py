"""One read task's offset range, read exactly, on an executor (confluent-kafka).

The built-in sinks read Kafka here rather than through Spark's Kafka source: each record
then costs one pass of librdkafka + Python instead of a JVM row, an Arrow conversion and a
Python row (see docs/benchmarks.md). Spark still schedules, retries and ships the tasks.

Exactly ``[from_offset, until_offset)``, whatever lies inside: gaps left by compaction,
transaction markers or aborted records (under read_committed) are passed; the read ends at
the first offset >= ``until_offset`` or when the partition's end is reached past it. Loss
is decided from what was read, never guessed from a gap: a gap at the range's start is
loss only if the log no longer covers it (``_check_not_deleted``), an offset deleted ahead
of the reader is OFFSET_OUT_OF_RANGE, and a log that ends before the planned end is a
truncation. Retention that deletes records after they were read changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from pipeline.errors import Kind
from pipeline.executor.group_lookup import look_up_group
from pipeline.executor.read_errors import RangeReadError, refusal, refused
from pipeline.plan.offsets import OffsetRange

__all__ = ["RangeReadError", "read_range", "read_ranges", "reader_config"]

BATCH = 10_000  # messages per consume() call: one Python call per batch, not per record

# Messages librdkafka queues per partition ahead of a reader (reader_config says why 20k).
QUEUED_MESSAGES = 20_000

# A transform's reader (executor/transform/feed.py) hands each batch to Arrow and Spark, so it holds
# the batch's Messages, its columns and its Arrow batch at once, beside librdkafka's queue:
# half the batch and a quarter of the queue held ~15 MB less a reader (two in a 2-core
# run) at the same CPU (docs/benchmarks.md, "Memory of the transform path, round three").
FEED_BATCH = 5_000
FEED_QUEUED_MESSAGES = 5_000
# ... and at most this many bytes of records a batch (executor/transform/feed.py asks each consume()
# for fewer messages once it has seen the records' size, and cuts its Arrow batches at it):
# 5,000 records of 150 KB made 750 MB batches, which the JVM could not hold.
FEED_BATCH_BYTES = 16 * 2**20


def reader_config(client_config: dict[str, str], isolation_level: str, group: str,
                  queued: int = QUEUED_MESSAGES) -> dict:
    """librdkafka settings of an executor's reader; the user's ``[kafka.consumer]`` and
    ``[kafka.admin_client]`` settings override the defaults here. Offsets are never
    committed to Kafka.

    Prefetch, measured on 1M JSON records in two 500k ranges (docs/benchmarks.md): librdkafka
    stops fetching a partition once ``queued.min.messages`` wait in its queue and by default
    fetches again only ``fetch.queue.backoff.ms`` = 1 s later, so a reader draining 10k at a
    time starves (100k queued: 4.75 s). A 1M queue hid that (0.97 s) but held ~290 MB per
    reader and grew the run's RSS with the task size; 100k queued with a 10 ms backoff reads
    as fast (0.81 s) in ~110 MB. 20k queued with that backoff (2M orders, 4 partitions, two
    readers, docs/benchmarks.md "Memory of the transform path") held ~40 MB less per reader
    (transform path 198 -> 160 MB, built-in path 148 -> 105 MB) at the same CPU: a 10k
    batch still finds the next one queued."""
    return {
        "queued.min.messages": queued,
        "fetch.queue.backoff.ms": 10,
        **client_config,
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        # Offsets outside the log are an error, never a silent jump to another offset.
        "auto.offset.reset": "error",
        "isolation.level": isolation_level,
    }


def read_range(config: dict, r: OffsetRange, timeout_seconds: float,
               batch: int = BATCH) -> Iterator[list]:
    """Yields lists of confluent_kafka Messages with ``r.from_offset <= offset <
    r.until_offset``, in offset order. Raises RangeReadError."""
    for _, records in read_ranges(config, [r], timeout_seconds, batch):
        yield records


def asked(remaining: int, batch: int = BATCH) -> int:
    """How many messages one consume() call asks for: never more than the offsets the open
    ranges still span. librdkafka's consume() returns when it has that many messages or
    when its timeout ends, so asking for a batch the ranges cannot fill waited out the
    whole timeout on every small range (~1 s per partition). The records of the ranges, the
    records past their ends and the end-of-partition events fill this count; only gaps
    (compaction, transaction markers) at the end of a log leave it short, for at most one
    POLL_SECONDS."""
    return max(1, min(batch, remaining))


# The longest one consume() call waits. Only a count that cannot be reached (see asked)
# waits it out; the run's no-progress limit (kafka.timeout_seconds) is measured across
# calls, so a short poll never makes a read give up sooner.
POLL_SECONDS = 0.1


class _Open:
    """What is known of one range being read: the next offset wanted, where its partition
    ended when last seen, whether any record was read yet."""

    __slots__ = ("range", "next_offset", "log_end", "first")

    def __init__(self, r: OffsetRange):
        self.range = r
        self.next_offset = r.from_offset
        self.log_end: int | None = None
        self.first = True

    @property
    def done(self) -> bool:
        return self.next_offset >= self.range.until_offset


def read_ranges(config: dict, ranges: list[OffsetRange], timeout_seconds: float,
                batch: int | Callable[[], int] = BATCH) -> Iterator[tuple[OffsetRange, list]]:
    """Reads every range with ONE consumer (one Spark task's ranges: a client, its broker
    connections and metadata per task, not per partition), all of them assigned at once so
    that their fetches share requests. Yields (range, records): records of that range only,
    ``from_offset <= offset < until_offset``, each range's in offset order (the ranges'
    batches interleave). Ranges must be of distinct partitions. ``batch``: messages per
    consume() call, or a function saying it before each call (a reader that bounds its
    batches' bytes). Raises RangeReadError."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    ranges = [r for r in ranges if r.count > 0]
    if not ranges:
        return
    if len({r.tp for r in ranges}) != len(ranges):
        raise ValueError(f"two ranges of one partition in one read: {ranges}")
    errors: list[str] = []
    # Prefetching past a range is wasted work: at most the largest range's records are
    # queued per partition.
    queued = min(int(config.get("queued.min.messages", QUEUED_MESSAGES)),
                 max(r.count for r in ranges))
    try:
        consumer = Consumer({**config, "queued.min.messages": queued,
                             "error_cb": lambda e: errors.append(str(e))})
    except KafkaException as e:  # librdkafka refused a setting: the user's to fix, not a bug
        raise RangeReadError(
            "config", f"the executors' Kafka reader refused its settings ({e.args[0]}); fix "
            "them in [kafka.consumer] / [kafka.admin_client]; nothing was read",
            ranges[0]) from None
    try:
        reading = {r.tp: _Open(r) for r in ranges}
        alone = len(ranges) == 1
        consumer.assign([TopicPartition(r.topic, r.partition, r.from_offset) for r in ranges])
        asks = batch if callable(batch) else lambda: batch
        held = look_up_group(consumer, ranges, config, timeout_seconds, asks())
        progress_at = time.monotonic()
        while reading:
            remaining = sum(o.range.until_offset - o.next_offset for o in reading.values())
            try:
                messages = held or consumer.consume(num_messages=asked(remaining, asks()),
                                                    timeout=POLL_SECONDS)
                held = []
            except KafkaException as e:
                first = next(iter(reading.values()))
                raise RangeReadError(Kind.TRANSIENT, f"{first.range}: Kafka consumer failed "
                                     f"at offset {first.next_offset}: {e}; nothing committed "
                                     "- retry", first.range) from None
            progress = False
            for state, run in _runs(messages, reading):
                records = _take(state, run, config, errors, alone)
                if records:
                    r = state.range
                    if state.first and records[0].offset() > r.from_offset:
                        _check_not_deleted(consumer, r, records[0].offset(), timeout_seconds)
                    state.first = False
                    progress = True
                    yield r, records
                if state.done:
                    progress = True
                    del reading[state.range.tp]
                    # Nothing more of it is wanted: its fetches stop, the others go on.
                    consumer.pause([TopicPartition(state.range.topic, state.range.partition)])
            if progress:
                progress_at = time.monotonic()
            elif time.monotonic() - progress_at > timeout_seconds:
                raise _stalled(config, list(reading.values()), timeout_seconds, errors)
    finally:
        consumer.close()


def _runs(messages: list, reading: dict):
    """A consumed batch -> (open range, its messages) runs, in order. The batch of a single
    open range is taken whole; messages of a partition no longer read (past a finished
    range) are dropped, and an event of no partition goes to the first open range."""
    if not messages:
        return
    if len(reading) == 1:
        (state,) = reading.values()
        yield state, messages
        return
    run: list = []
    current = None
    for m in messages:
        state = reading.get((m.topic(), m.partition()))
        if state is None and reading and m.error() is not None and m.topic() is None:
            state = next(iter(reading.values()))
        if state is not current:
            if current is not None and run:
                yield current, run
            current, run = state, []
        if state is not None:
            run.append(m)
    if current is not None and run:
        yield current, run


def _take(state: _Open, messages: list, config: dict, errors: list[str],
          alone: bool = False) -> list:
    """One range's messages of a batch -> its records; moves ``state`` on. Raises
    RangeReadError on an error no retry inside this read fixes. ``alone``: as for _plain."""
    from confluent_kafka import KafkaError

    r = state.range
    if state.done:
        return []
    if _plain(messages, state.next_offset, r.until_offset, r, alone):
        # The usual batch: records of this partition only, inside the range (offsets of a
        # partition only increase), so no per-message checks below.
        state.next_offset = messages[-1].offset() + 1
        return messages
    records = []
    for m in messages:
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                if (m.topic(), m.partition()) != r.tp:
                    continue
                state.log_end = m.offset()
                if state.log_end >= r.until_offset:  # the end of the log is past us
                    state.next_offset = r.until_offset
                continue
            if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE,
                              KafkaError._AUTO_OFFSET_RESET):
                raise RangeReadError(
                    Kind.TRANSIENT,
                    f"{r}: offset {state.next_offset} is no longer in Kafka (deleted by "
                    "retention while it was read); nothing committed - run again: a "
                    "scheduled run then applies kafka.on_data_loss, a backfill or verify "
                    "names what Kafka no longer holds", r)
            if refused(err):
                raise refusal(config, r, err)
            if err.fatal() or not err.retriable():
                raise RangeReadError(Kind.PERMANENT if err.fatal() else Kind.TRANSIENT,
                                     f"{r}: Kafka error at offset {state.next_offset}: "
                                     f"{err.str()}", r)
            errors.append(err.str())
            continue
        if (m.topic(), m.partition()) != r.tp:
            continue  # an earlier assignment's message, still queued
        offset = m.offset()
        if offset >= r.until_offset:
            state.next_offset = r.until_offset
            break
        if offset >= state.next_offset:
            records.append(m)
            state.next_offset = offset + 1
    return records


def _stalled(config: dict, reading: list[_Open], timeout_seconds: float,
             errors: list[str]) -> RangeReadError:
    """No range moved for ``timeout_seconds``: a log that ends before its range's planned
    end is a truncation (permanent); anything else, an unreachable broker (transient)."""
    for state in reading:
        if state.log_end is not None and state.log_end < state.range.until_offset:
            return RangeReadError(
                Kind.PERMANENT,
                f"{state.range}: the partition now ends at offset {state.log_end}, before "
                "the planned end (log truncated by an unclean leader election, or the topic "
                "recreated); nothing committed - inspect with 'pipeline offsets show'",
                state.range)
    first = reading[0]
    more = f" (and {len(reading) - 1} more ranges)" if len(reading) > 1 else ""
    seen = "; ".join(dict.fromkeys(errors[-3:])) or "no error reported"
    return RangeReadError(
        Kind.TRANSIENT,
        f"Kafka unreachable at {config.get('bootstrap.servers')} while Spark read "
        f"{first.range}{more}: no progress at offset {first.next_offset} for "
        f"{timeout_seconds:.0f} s ({seen}); nothing committed - check the broker, then "
        "retry", first.range)


def _plain(messages: list, next_offset: int, until_offset: int, r: OffsetRange,
           alone: bool = False) -> bool:
    """True when a batch holds records only (no error or end-of-partition event), all of
    ``r``'s partition, at or after ``next_offset`` and before ``until_offset``. ``alone``:
    the consumer is assigned ``r``'s partition only, so no message can be another's."""
    if not messages:
        return False
    first, last = messages[0], messages[-1]
    if first.error() is not None or last.error() is not None:
        return False
    if first.offset() < next_offset or last.offset() >= until_offset:
        return False
    from confluent_kafka import Message

    # C calls, no Python frame per message.
    return (not any(map(Message.error, messages))
            and (alone or (set(map(Message.partition, messages)) == {r.partition}
                           and set(map(Message.topic, messages)) == {r.topic})))


def _check_not_deleted(consumer, r: OffsetRange, first_offset: int, timeout: float) -> None:
    """The first record read is past the range's start: a gap left by compaction or a
    transaction marker is fine; offsets deleted by retention are loss. Only retention (and
    deleteRecords) moves a partition's earliest offset, so that tells them apart."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        earliest, _ = consumer.get_watermark_offsets(TopicPartition(r.topic, r.partition),
                                                     timeout=timeout)
    except KafkaException as e:
        raise RangeReadError(Kind.TRANSIENT, f"{r}: cannot check the earliest offset: {e}; "
                             "nothing committed - retry", r) from None
    if earliest > r.from_offset:
        raise RangeReadError(
            Kind.TRANSIENT,
            f"{r}: offsets [{r.from_offset}, {min(earliest, first_offset)}) were deleted by "
            "retention while they were read; nothing committed - run again: a scheduled "
            "run then applies kafka.on_data_loss, a backfill or verify names what Kafka no "
            "longer holds", r)
