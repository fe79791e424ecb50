"""[kafka]: the broker, the topics, how much one run reads, and the clients' own settings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationInfo, model_validator

from pipeline.settings.base import Table, about_key, expand_env, whole
from pipeline.settings.secrets import SECRET_KEY

# A run is one transaction: bounded by default, so that a large backlog (a new pipeline on
# an old topic, a long outage) is drained by successive runs of bounded WAL, staging and
# duration instead of one that a task timeout kills and retries forever. 20M records take
# ~2 minutes on 2 cores (docs/benchmarks.md). 0 = no cap.
DEFAULT_MAX_RECORDS_PER_PARTITION = 5_000_000
DEFAULT_MAX_RECORDS_PER_RUN = 20_000_000
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# What the pipeline sets on every client itself.
_MANAGED = ("bootstrap.servers", "isolation.level", "group.id", "enable.auto.commit")
SPARK_CONSUMER_GONE = (
    "[kafka.spark_consumer] is no longer read: no run uses Spark's Kafka source (its Java "
    "client); [kafka.consumer] replaced it, read by the driver and by the executors' "
    "confluent-kafka reader: move the settings there in librdkafka's names (sasl.username "
    "and sasl.password for sasl.jaas.config, ssl.ca.location for ssl.truststore.location), "
    "then remove [kafka.spark_consumer]")


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str
    topics: tuple[str, ...]  # empty when the topics are ``topic_pattern``'s
    starting_offsets: str = "earliest"
    isolation_level: str = "read_committed"
    max_records_per_partition: int = 0
    max_records_per_run: int = 0
    on_data_loss: str = "fail"
    timeout_seconds: float = 15.0
    mirror_group: str | None = None
    # The clients' settings may hold secrets (${VAR} read): not in repr.
    consumer: dict[str, str] = field(default_factory=dict, repr=False)  # driver and executors
    admin_client: dict[str, str] = field(default_factory=dict, repr=False)  # confluent-kafka
    # A full-match regex over the broker's topics, evaluated at every run (exactly one of
    # ``topics`` and ``topic_pattern`` is set): a new matching topic joins at the next run.
    topic_pattern: str | None = None

    def matches(self, topic: str) -> bool:
        """Is ``topic`` one of the pipeline's? (listed, or matched by the pattern; an
        internal topic never matches)."""
        if self.topic_pattern is None:
            return topic in self.topics
        return not internal(topic) and re.fullmatch(self.topic_pattern, topic) is not None

    def select(self, names) -> list[str]:
        """The pipeline's topics among the broker's ``names``, sorted."""
        return sorted(t for t in set(names) if self.matches(t))

    def describe_topics(self) -> str:
        """The topics as the config names them, for messages."""
        if self.topic_pattern is None:
            return f"kafka.topics ({', '.join(self.topics)})"
        return f"kafka.topic_pattern = {self.topic_pattern!r}"

    def client_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings for metadata, offsets and the mirror."""
        return {**self.consumer, **self.admin_client, "bootstrap.servers": self.bootstrap_servers}


def internal(topic: str) -> bool:
    """A topic of the broker's or of a tool's own (``__consumer_offsets``,
    ``__transaction_state``, the Schema Registry's ``_schemas``, Connect's worker topics
    when named so): a name starting with ``_``. No pattern reads one."""
    return topic.startswith("_")


def _topics(value: list) -> list:
    if not value or not all(isinstance(t, str) and _TOPIC.match(t) for t in value):
        raise about_key("must be a non-empty list of Kafka topic names")
    return value


def _pattern(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise about_key(f"= {value!r} is not a regular expression ({e}); it must match a "
                        "whole topic name, e.g. 'shop\\.public\\..*'") from None
    if not value:
        raise about_key("must not be empty")
    return value


def _client_table(value: dict, info: ValidationInfo) -> dict:
    for key, v in value.items():
        where = f"kafka.{info.field_name}.{key}"
        if not isinstance(v, (str, int, bool)):
            raise whole(f"'{where}' must be a string, number or boolean")
        if key in _MANAGED:
            raise whole(f"'{where}' is managed by the pipeline; set it elsewhere or drop it")
    # A secret (sasl.password, ssl.key.password, sasl.jaas.config, ...) is held as one.
    return {k: SecretStr(v) if isinstance(v, str) and SECRET_KEY.search(k) else v
            for k, v in value.items()}


ClientTable = Annotated[dict[str, Any], AfterValidator(_client_table)]


class KafkaTable(Table):
    bootstrap_servers: str
    topics: Annotated[list, AfterValidator(_topics)] | None = None
    topic_pattern: Annotated[str, AfterValidator(_pattern)] | None = None
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    max_records_per_partition: int = Field(DEFAULT_MAX_RECORDS_PER_PARTITION, ge=0,
                                           description="0 = no cap")
    max_records_per_run: int = Field(DEFAULT_MAX_RECORDS_PER_RUN, ge=0,
                                     description="0 = no cap")
    on_data_loss: Literal["fail", "skip"] = "fail"
    timeout_seconds: float = Field(15.0, gt=0)
    mirror_group: str | None = None
    consumer: ClientTable = {}
    admin_client: ClientTable = {}

    @model_validator(mode="before")
    @classmethod
    def _no_spark_consumer(cls, data: Any) -> Any:
        """[kafka.spark_consumer] configured Spark's Kafka source (its Java client), which no
        run reads through any more: its settings would be silently ignored."""
        if isinstance(data, dict) and "spark_consumer" in data:
            raise whole(SPARK_CONSUMER_GONE)
        return data

    @model_validator(mode="after")
    def _one_way_to_name_topics(self) -> KafkaTable:
        if (self.topics is None) == (self.topic_pattern is None):
            raise whole("[kafka] needs exactly one of 'kafka.topics' (a list of topics) and "
                        "'kafka.topic_pattern' (a regular expression the topics' names match "
                        "whole, evaluated at every run)" if self.topics is None else
                        "[kafka] has both 'kafka.topics' and 'kafka.topic_pattern': keep one")
        return self

    def value(self, env: dict[str, str]) -> KafkaSettings:
        clients = {name: _client_settings(getattr(self, name), name, env)
                   for name in ("consumer", "admin_client")}
        return KafkaSettings(
            # ${VAR} as in the client tables: a stack's or a deployment's listener address.
            bootstrap_servers=expand_env(self.bootstrap_servers, "kafka.bootstrap_servers",
                                         env), topics=tuple(self.topics or ()),
            topic_pattern=self.topic_pattern,
            starting_offsets=self.starting_offsets, isolation_level=self.isolation_level,
            max_records_per_partition=self.max_records_per_partition,
            max_records_per_run=self.max_records_per_run, on_data_loss=self.on_data_loss,
            timeout_seconds=float(self.timeout_seconds), mirror_group=self.mirror_group,
            **clients)


def _client_settings(table: dict[str, Any], name: str, env: dict[str, str]) -> dict[str, str]:
    """A pass-through table of client settings as text; ${VAR} is read from the environment."""
    out = {}
    for key, value in table.items():
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out[key] = expand_env(text, f"kafka.{name}.{key}", env)
    return out


