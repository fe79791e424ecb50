"""What Kafka holds: partitions, earliest/latest (or last stable) offsets, offsets for
times, and the optional mirror of our offsets to a consumer group. confluent-kafka only.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import wait
from dataclasses import replace

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from pipeline.config import KafkaSettings
from pipeline.errors import ConfigError, DataError, TransientError
from pipeline.plan.offsets import PartitionOffsets

log = logging.getLogger(__name__)


# Client errors that no retry fixes: the broker refused our credentials, or its certificate
# is not one we trust (or TLS is misconfigured on either side).
_REFUSED = {KafkaError._AUTHENTICATION: "authentication failed",
            KafkaError._SSL: "the TLS handshake failed"}


# What librdkafka says when the client's security.protocol is not its listener's: TLS
# spoken to a PLAINTEXT listener fails its handshake with this hint; plain text spoken to
# a TLS listener is answered by nothing, the connection closed before the first response
# (librdkafka may add its own hint). A broker that is down refuses the connection instead.
_TLS_TO_PLAINTEXT = "connecting to a PLAINTEXT broker listener"
_PLAINTEXT_TO_TLS = "connecting to a SSL listener"
_CLOSED_BEFORE_ANSWER = re.compile(r"Disconnected\b.*\bin state APIVERSION_QUERY")
# Connections closed so before the run calls it a listener that wants TLS (one could be a
# broker restarting).
CLOSED_CONNECTIONS = 3


def protocol_mismatch(protocol: str, said: Iterable[str]) -> str | None:
    """Why the client's ``protocol`` (security.protocol) is not its listener's, from what
    librdkafka said (its errors and log lines), or None."""
    said = list(said)
    if "SSL" in protocol:
        hint = next((s for s in said if _TLS_TO_PLAINTEXT in s), None)
        return (f"it speaks TLS to a PLAINTEXT listener ({hint.split(': ', 1)[-1][:200]})"
                if hint else None)
    closed = [s for s in said if _PLAINTEXT_TO_TLS in s or _CLOSED_BEFORE_ANSWER.search(s)]
    if any(_PLAINTEXT_TO_TLS in s for s in closed) or len(closed) >= CLOSED_CONNECTIONS:
        return ("the listener closed every connection before answering, as a TLS (SSL or "
                "SASL_SSL) listener does to plain text")
    return None


class KafkaMeta:
    def __init__(self, settings: KafkaSettings):
        self.settings = settings
        self.client_errors: list[KafkaError] = []
        # librdkafka's log lines, kept to tell a protocol mismatch (protocol_mismatch);
        # never shown: it logs every failed connect, our one-line error says it once.
        self.client_log: list[str] = []
        timeout_ms = int(settings.timeout_seconds * 1000)
        try:
            self.admin = AdminClient({
                **settings.client_config(),
                "socket.connection.setup.timeout.ms": str(min(timeout_ms, 10000)),
                "log_level": "6",
                "logger": _KeptLog(self.client_log),
                "error_cb": self.client_errors.append,
            })
        except KafkaException as e:
            raise ConfigError(
                f"Kafka client settings rejected by confluent-kafka: {e.args[0].str()}; fix "
                "it in [kafka.consumer] or [kafka.admin_client] in librdkafka's names (every "
                "client of a run is confluent-kafka)"
            ) from None

    @property
    def timeout(self) -> float:
        return self.settings.timeout_seconds

    def _wait(self, futures: Mapping) -> Mapping:
        """Wait for the admin ``futures``, serving the client's error callback meanwhile: a
        refused login or certificate is reported at once (librdkafka would otherwise retry
        until the request times out, and the timeout would look like an outage)."""
        deadline = time.monotonic() + self.timeout + 5
        pending = list(futures.values())
        # Returns as soon as the futures are done (a no-op run makes three such calls).
        while wait(pending, timeout=0.05).not_done and time.monotonic() < deadline:
            self.admin.poll(0)
            self._raise_if_refused()
        self.admin.poll(0)
        self._raise_if_refused()
        return futures

    def _raise_if_refused(self) -> None:
        err = next((e for e in self.client_errors if e.code() in _REFUSED), None)
        if err is not None:
            raise refused_error(self.settings, _REFUSED[err.code()], err.str())
        protocol = self.settings.client_config().get("security.protocol", "PLAINTEXT")
        why = protocol_mismatch(protocol.upper(),
                                [*(e.str() for e in self.client_errors), *self.client_log])
        if why:
            raise ConfigError(
                f"Kafka at {self.settings.bootstrap_servers} is not a {protocol.upper()} "
                f"listener: {why}; set security.protocol in [kafka.consumer] to the "
                "listener's, or point kafka.bootstrap_servers (or "
                "PIPELINE__KAFKA__BOOTSTRAP_SERVERS, which replaces it) at a "
                f"{protocol.upper()} listener; not retried")

    def _unreachable(self, what: str, err: object) -> TransientError:
        return TransientError(
            f"Kafka unreachable at {self.settings.bootstrap_servers} while {what} ({err}); "
            "check the broker and kafka.bootstrap_servers / PIPELINE__KAFKA__BOOTSTRAP_SERVERS, "
            "then retry")

    def topic_names(self) -> list[str]:
        """Every topic the broker has (and lets us describe), from fresh metadata: what a
        kafka.topic_pattern is matched against."""
        try:
            metadata = self.admin.list_topics(timeout=self.timeout)
        except KafkaException as e:
            self._raise_if_refused()
            raise self._unreachable("listing topics", e.args[0]) from None
        self._raise_if_refused()
        return sorted(name for name, t in metadata.topics.items() if t.error is None)

    def describe(self, topics: Iterable[str]) -> dict[str, tuple[str, list[int]]]:
        """Each topic's Kafka ID and partitions, from fresh metadata (new partitions
        included)."""
        topics = list(dict.fromkeys(topics))
        if not topics:
            return {}
        try:
            futures = self._wait(self.admin.describe_topics(TopicCollection(topics),
                                                            request_timeout=self.timeout))
        except KafkaException as e:
            raise self._unreachable("reading metadata", e.args[0]) from None
        out = {}
        for topic in topics:
            try:
                d = futures[topic].result()
            except KafkaException as e:
                err = e.args[0]
                if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise DataError(f"topic '{topic}' does not exist on "
                                    f"{self.settings.bootstrap_servers}; create it or fix "
                                    "kafka.topics") from None
                if isinstance(err, KafkaError) and err.code() in (
                        KafkaError.TOPIC_AUTHORIZATION_FAILED,
                        KafkaError.CLUSTER_AUTHORIZATION_FAILED):
                    raise not_allowed_error(self.settings, f"topic '{topic}'") from None
                if isinstance(err, KafkaError) and err.code() in (
                        KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                        KafkaError._ALL_BROKERS_DOWN):
                    raise self._unreachable("reading metadata", err) from None
                raise TransientError(f"topic '{topic}': metadata error {err}; retry "
                                     "later") from None
            out[topic] = (str(d.topic_id), sorted(p.id for p in d.partitions))
        return out

    def compacted(self, topics: Iterable[str]) -> dict[str, bool | None]:
        """Whether each topic's cleanup.policy compacts (None: the broker would not say,
        e.g. no DescribeConfigs ACL); verify names its skipped offsets with it."""
        from confluent_kafka.admin import ConfigResource, ResourceType

        out: dict[str, bool | None] = {}
        for topic in dict.fromkeys(topics):
            try:
                (future,) = self._wait(self.admin.describe_configs(
                    [ConfigResource(ResourceType.TOPIC, topic)],
                    request_timeout=self.timeout)).values()
                policy = future.result()["cleanup.policy"].value or ""
                out[topic] = "compact" in policy
            except (KafkaException, KeyError):
                out[topic] = None
        return out

    def partitions(self, topics: Iterable[str]) -> list[tuple[str, int]]:
        """Every partition of the topics, from fresh metadata (new partitions included)."""
        return [(topic, p) for topic, (_, parts) in self.describe(topics).items()
                for p in parts]

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        return {topic: topic_id for topic, (topic_id, _) in self.describe(topics).items()}

    def _list_offsets(self, specs: Mapping[TopicPartition, OffsetSpec],
                      isolation_level: str) -> dict[tuple[str, int], int]:
        return {tp: info.offset for tp, info in self._list(specs, isolation_level).items()}

    def _list(self, specs: Mapping[TopicPartition, OffsetSpec], isolation_level: str
              ) -> dict[tuple[str, int], object]:
        """ListOffsetsResultInfo (offset, timestamp) per (topic, partition)."""
        if not specs:
            return {}
        level = (IsolationLevel.READ_COMMITTED if isolation_level == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        try:
            futures = self._wait(self.admin.list_offsets(dict(specs), isolation_level=level,
                                                         request_timeout=self.timeout))
            return {(tp.topic, tp.partition): f.result() for tp, f in futures.items()}
        except KafkaException as e:
            err = e.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise DataError(
                    f"unknown topic or partition while listing offsets: {err}") from None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise not_allowed_error(self.settings, "the topics' offsets") from None
            raise self._unreachable("listing offsets", err) from None

    def offsets(self, partitions: Iterable[tuple[str, int]],
                isolation_level: str | None = None) -> list[PartitionOffsets]:
        """Earliest and latest offsets; latest is the last stable offset (LSO) under
        read_committed: records past it may still be aborted."""
        level = isolation_level or self.settings.isolation_level
        tps = [TopicPartition(t, p) for t, p in partitions]
        earliest = self._list_offsets({tp: OffsetSpec.earliest() for tp in tps}, level)
        latest = self._list_offsets({tp: OffsetSpec.latest() for tp in tps}, level)
        return [PartitionOffsets(t, p, earliest[(t, p)], latest[(t, p)])
                for t, p in sorted(earliest)]

    def topic_offsets(self, topics: Iterable[str]) -> list[PartitionOffsets]:
        """Every partition's offsets, with its topic's Kafka ID."""
        described = self.describe(topics)
        ids = {topic: topic_id for topic, (topic_id, _) in described.items()}
        return [replace(k, topic_id=ids[k.topic]) for k in self.offsets(
            [(topic, p) for topic, (_, parts) in described.items() for p in parts])]

    def offsets_for_time(self, partitions: Iterable[tuple[str, int]], timestamp_ms: int,
                         latest: Mapping[tuple[str, int], int] | None = None
                         ) -> dict[tuple[str, int], int]:
        """First offset whose timestamp is >= timestamp_ms, as of the ``latest`` offsets
        given (one snapshot for both ends of a range; read now if not given): no later
        than them, and them where no record is that late yet."""
        tps = list(partitions)
        found = self._list_offsets(
            {TopicPartition(t, p): OffsetSpec.for_timestamp(timestamp_ms) for t, p in tps},
            self.settings.isolation_level)
        if latest is None:
            latest = {(k.topic, k.partition): k.latest for k in self.offsets(tps)}
        return {tp: (min(off, latest[tp]) if off >= 0 else latest[tp])
                for tp, off in found.items()}

    def mirror_offsets(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Best effort: commit our stored offsets to a consumer group for lag tooling.
        Never read back as truth; a failure is logged, not raised."""
        if not offsets:
            return
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())])
        try:
            for f in self._wait(self.admin.alter_consumer_group_offsets(
                    [request], request_timeout=self.timeout)).values():
                # The broker refuses per partition (e.g. UNKNOWN_MEMBER_ID while the group
                # has active members); the future itself still succeeds.
                failed = [f"{tp.topic}[{tp.partition}]: {tp.error}"
                          for tp in f.result().topic_partitions if tp.error is not None]
                if failed:
                    raise RuntimeError("; ".join(failed))
            log.info("mirrored %d offsets to consumer group %s", len(offsets), group,
                     extra={"event": "mirror.done", "group": group, "offsets": len(offsets)})
        except Exception as e:  # noqa: BLE001 - best effort by design
            log.warning("could not mirror offsets to consumer group %s: %s "
                        "(Postgres stays the source of truth; lag tools may be stale)", group, e,
                        extra={"event": "mirror.failed", "group": group, "error": str(e)})



def sasl_user(settings: KafkaSettings) -> str:
    """Who we log in as, for messages: librdkafka's sasl.username (or 'no SASL user')."""
    user = settings.client_config().get("sasl.username")
    mechanism = settings.client_config().get("sasl.mechanism", "")
    return f"user '{user}' ({mechanism})" if user else "no SASL user"


class _KeptLog(logging.Logger):
    """A logger (confluent-kafka's ``logger`` setting) that keeps librdkafka's lines in a
    list and shows none: not registered with logging, so no handler sees them."""

    def __init__(self, lines: list[str]):
        super().__init__("librdkafka", logging.DEBUG)
        self.lines = lines

    def log(self, level, msg, *args, **kwargs) -> None:
        if len(self.lines) < 1000:  # a run that retries for long keeps its first lines
            self.lines.append(msg % args if args else str(msg))


def refused_error(settings: KafkaSettings, what: str, detail: str) -> ConfigError:
    """Kafka refused the login or the TLS handshake: permanent until someone fixes the
    credentials or the trusted CA (exit 2, not retried)."""
    fix = ("fix sasl.username / sasl.password in [kafka.consumer] (or [kafka.admin_client]; "
           "or the user's SCRAM credentials on the broker)"
           if "auth" in what else
           "point ssl.ca.location in [kafka.consumer] (or [kafka.admin_client]) at the CA that "
           "signed the broker's certificate, and check security.protocol")
    return ConfigError(f"Kafka at {settings.bootstrap_servers} refused {sasl_user(settings)}: "
                       f"{what} ({detail.split(': ', 1)[-1][:300]}); {fix}; not retried")


def not_allowed_error(settings: KafkaSettings, what: str) -> ConfigError:
    """The broker's ACLs do not let our user at a topic: permanent (exit 2)."""
    return ConfigError(f"Kafka at {settings.bootstrap_servers} does not allow "
                       f"{sasl_user(settings)} to describe {what} (TOPIC_AUTHORIZATION_FAILED); "
                       "grant it Describe and Read on the topic (kafka-acls) or fix "
                       "kafka.topics; not retried")
