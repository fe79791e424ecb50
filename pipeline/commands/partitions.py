"""Which partitions of a topic a command acts on (backfill, offsets set): pure, checked
against the pipeline's topics and Kafka's metadata."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pipeline.config import Settings
from pipeline.errors import ConfigError, DataError
from pipeline.plan.offsets import TopicPartition


def require_topic(settings: Settings, topic: str) -> None:
    if not settings.kafka.matches(topic):
        k = settings.kafka
        what = (f"kafka.topics ({', '.join(k.topics)}); add it to {settings.source} first"
                if k.topic_pattern is None else
                f"matched by kafka.topic_pattern = {k.topic_pattern!r}; change the pattern in "
                f"{settings.source} first")
        raise ConfigError(f"topic '{topic}' is not one of pipeline '{settings.name}' {what} "
                          "or fix --topic")


def select_partitions(topic: str, in_kafka: Iterable[tuple[str, int]],
                      requested: Sequence[int] | None,
                      stored: Iterable[TopicPartition] = ()) -> tuple[list[int], list[int]]:
    """(partitions Kafka has, stored partitions Kafka no longer has) that the command acts on.

    No --partition: every partition of the topic. A requested partition that Kafka does not
    have is an error unless it is stored (then it is one to forget).
    """
    have = sorted(p for t, p in in_kafka if t == topic)
    gone_stored = sorted({p for t, p in stored if t == topic} - set(have))
    if not requested:
        return have, gone_stored
    chosen, gone = [], []
    for p in sorted(set(requested)):
        if p in have:
            chosen.append(p)
        elif p in gone_stored:
            gone.append(p)
        else:
            raise DataError(
                f"{topic}[{p}]: no such partition in Kafka (the topic has partitions "
                f"{describe_partitions(have)}); fix --partition")
    return chosen, gone


def describe_partitions(partitions: Sequence[int]) -> str:
    if not partitions:
        return "none"
    if list(partitions) == list(range(partitions[0], partitions[-1] + 1)):
        return f"{partitions[0]}-{partitions[-1]}" if len(partitions) > 1 else str(partitions[0])
    return ", ".join(map(str, partitions))
