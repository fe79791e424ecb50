"""The reader's consumer group, looked up before a read task takes any record, so that a
group the ACLs refuse is refused every time (consume.read_ranges calls it)."""

from __future__ import annotations

import time

from pipeline.errors import Kind
from pipeline.executor.read_errors import RangeReadError, refusal, refused
from pipeline.plan.offsets import OffsetRange


def look_up_group(consumer, ranges: list[OffsetRange], config: dict,
                   timeout_seconds: float, batch: int) -> list:
    """Looks the reader's group up before any record is taken: asks for its committed
    offsets of the ranges' partitions (an OffsetFetch, which the group's ACL guards) until
    the broker answers or refuses the group. librdkafka looks a consumer's group up on its
    own in the background, racing the fetches, which the topic's ACLs allow: a range could
    be read whole before a refused group's answer arrived (3-4 reads in 20 on the stack),
    so a forbidden group failed the run only by chance. Now a refused group is always the
    one-line config error, before any record is yielded.

    A refused coordinator lookup never answers the OffsetFetch (librdkafka retries it); it
    arrives as an error event of the consumer, which consume() returns, together with
    whatever was fetched meanwhile: those messages are returned, in order, for the read to
    take first. Called after assign(): asked before it, the group lookup delayed the
    assignment's first fetch by ~1 s. The offsets answered are not used (a reader never
    commits)."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    partitions = [TopicPartition(r.topic, r.partition) for r in ranges]
    deadline = time.monotonic() + timeout_seconds
    held: list = []
    why = "no answer"
    while True:
        try:
            answered = consumer.committed(partitions, timeout=LOOKUP_POLL_SECONDS)
        except KafkaException as e:
            err = e.args[0]
            if not isinstance(err, KafkaError):
                raise
            if refused(err):
                raise refusal(config, ranges[0], err) from None
            why = err.str()
        else:
            for tp in answered:
                if tp.error is not None and refused(tp.error):
                    r = next(r for r in ranges if r.tp == (tp.topic, tp.partition))
                    raise refusal(config, r, tp.error)
            return held
        messages = consumer.consume(num_messages=batch, timeout=0)
        for m in messages:
            err = m.error()
            if err is not None and refused(err):
                raise refusal(config, ranges[0], err)
        held += messages
        if time.monotonic() > deadline:
            more = f" (and {len(ranges) - 1} more ranges)" if len(ranges) > 1 else ""
            raise RangeReadError(
                Kind.TRANSIENT,
                f"Kafka unreachable at {config.get('bootstrap.servers')} while Spark read "
                f"{ranges[0]}{more}: no answer looking up the consumer group "
                f"'{config.get('group.id')}' for {timeout_seconds:.0f} s ({why}); nothing "
                "committed - check the broker, then retry", ranges[0])


# How long one OffsetFetch of the group lookup waits before the consumer's events are
# checked for a refusal (an answered lookup returns within milliseconds).
LOOKUP_POLL_SECONDS = 0.5
