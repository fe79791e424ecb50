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
from collections.abc import Iterator

from pipeline.offsets import OffsetRange

BATCH = 10_000  # messages per consume() call: one Python call per batch, not per record


class RangeReadError(RuntimeError):
    """Raised inside a Spark task; the driver turns it into its one-line error (the marker
    and the transient flag survive Spark's exception text). ``config``: refused by the
    broker (credentials, certificate, ACLs), which no retry fixes."""

    def __init__(self, message: str, transient: bool, config: bool = False):
        kind = "CONFIG" if config else "TRANSIENT" if transient else "PERMANENT"
        super().__init__(f"{kind}: {message}")


def _refused(err) -> bool:
    """The broker refused this reader: its login, its certificate, or an ACL."""
    from confluent_kafka import KafkaError

    return err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL,
                          KafkaError.GROUP_AUTHORIZATION_FAILED,
                          KafkaError.TOPIC_AUTHORIZATION_FAILED)


def reader_config(client_config: dict[str, str], isolation_level: str, group: str) -> dict:
    """librdkafka settings of an executor's reader; the user's ``[kafka.consumer]`` and
    ``[kafka.admin_client]`` settings override the defaults here. Offsets are never
    committed to Kafka.

    Prefetch, measured on 1M JSON records in two 500k ranges (docs/benchmarks.md): librdkafka
    stops fetching a partition once ``queued.min.messages`` wait in its queue and by default
    fetches again only ``fetch.queue.backoff.ms`` = 1 s later, so a reader draining 10k at a
    time starves (100k queued: 4.75 s). A 1M queue hid that (0.97 s) but held ~290 MB per
    reader and grew the run's RSS with the task size; 100k queued with a 10 ms backoff reads
    as fast (0.81 s) in ~110 MB."""
    return {
        "queued.min.messages": 100_000,
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
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    errors: list[str] = []
    # Prefetching past the range is wasted work: at most the range's records are queued.
    queued = min(int(config.get("queued.min.messages", 100_000)), max(r.count, 1))
    consumer = Consumer({**config, "queued.min.messages": queued,
                         "error_cb": lambda e: errors.append(str(e))})
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.from_offset)])
        next_offset = r.from_offset
        progress_at = time.monotonic()
        log_end = None  # where the partition ended when last seen
        first = True
        while next_offset < r.until_offset:
            try:
                messages = consumer.consume(num_messages=batch, timeout=1.0)
            except KafkaException as e:
                raise RangeReadError(f"{r}: Kafka consumer failed at offset {next_offset}: "
                                     f"{e}; nothing committed - retry", True) from None
            if _plain(messages, next_offset, r.until_offset):
                # The usual batch: records only, inside the range (offsets of a partition
                # only increase), so no per-message checks below.
                records = messages
                next_offset = messages[-1].offset() + 1
                messages = ()
            else:
                records = []
            for m in messages:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        log_end = m.offset()
                        if log_end >= r.until_offset:  # the end of the log is past us
                            next_offset = r.until_offset
                        continue
                    if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE,
                                      KafkaError._AUTO_OFFSET_RESET):
                        raise RangeReadError(
                            f"{r}: offset {next_offset} is no longer in Kafka (deleted by "
                            "retention while the run read it); nothing committed - the next "
                            "run applies kafka.on_data_loss", True)
                    if _refused(err):
                        group = config.get("group.id")
                        raise RangeReadError(
                            f"Kafka at {config.get('bootstrap.servers')} refused the reader of "
                            f"{r} (user '{config.get('sasl.username', '-')}', consumer group "
                            f"'{group}'): {err.str()}; grant the user Describe and Read on "
                            f"the topic and on the group '{group}' (it only looks the group "
                            "up, never commits), or fix its credentials; nothing committed",
                            False, config=True)
                    if err.fatal() or not err.retriable():
                        raise RangeReadError(f"{r}: Kafka error at offset {next_offset}: "
                                             f"{err.str()}", not err.fatal())
                    errors.append(err.str())
                    continue
                offset = m.offset()
                if offset >= r.until_offset:
                    next_offset = r.until_offset
                    break
                if offset >= next_offset:
                    records.append(m)
                    next_offset = offset + 1
            if records:
                if first and records[0].offset() > r.from_offset:
                    _check_not_deleted(consumer, r, records[0].offset(), timeout_seconds)
                first = False
                progress_at = time.monotonic()
                yield records
            elif time.monotonic() - progress_at > timeout_seconds:
                if log_end is not None and log_end < r.until_offset:
                    raise RangeReadError(
                        f"{r}: the partition now ends at offset {log_end}, before the planned "
                        "end (log truncated by an unclean leader election, or the topic "
                        "recreated); nothing committed - inspect with 'pipeline offsets show'",
                        False)
                seen = "; ".join(dict.fromkeys(errors[-3:])) or "no error reported"
                raise RangeReadError(
                    f"Kafka unreachable at {config.get('bootstrap.servers')} while Spark read "
                    f"{r}: no progress at offset {next_offset} for {timeout_seconds:.0f} s "
                    f"({seen}); nothing committed - check the broker, then retry", True)
    finally:
        consumer.close()


def _plain(messages: list, next_offset: int, until_offset: int) -> bool:
    """True when a batch holds records only (no error or end-of-partition event), all at or
    after ``next_offset`` and before ``until_offset``."""
    if not messages:
        return False
    first, last = messages[0], messages[-1]
    if first.error() is not None or last.error() is not None:
        return False
    if first.offset() < next_offset or last.offset() >= until_offset:
        return False
    from confluent_kafka import Message

    return not any(map(Message.error, messages))  # C calls, no Python frame per message


def _check_not_deleted(consumer, r: OffsetRange, first_offset: int, timeout: float) -> None:
    """The first record read is past the range's start: a gap left by compaction or a
    transaction marker is fine; offsets deleted by retention are loss. Only retention (and
    deleteRecords) moves a partition's earliest offset, so that tells them apart."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        earliest, _ = consumer.get_watermark_offsets(TopicPartition(r.topic, r.partition),
                                                     timeout=timeout)
    except KafkaException as e:
        raise RangeReadError(f"{r}: cannot check the earliest offset: {e}; nothing "
                             "committed - retry", True) from None
    if earliest > r.from_offset:
        raise RangeReadError(
            f"{r}: offsets [{r.from_offset}, {min(earliest, first_offset)}) were deleted by "
            "retention while the run read them; nothing committed - the next run applies "
            "kafka.on_data_loss", True)
