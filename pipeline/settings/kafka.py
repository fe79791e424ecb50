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
    topics: tuple[str, ...]
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

    def client_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings for metadata, offsets and the mirror."""
        return {**self.consumer, **self.admin_client, "bootstrap.servers": self.bootstrap_servers}


def _topics(value: list) -> list:
    if not value or not all(isinstance(t, str) and _TOPIC.match(t) for t in value):
        raise about_key("must be a non-empty list of Kafka topic names")
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
    topics: Annotated[list, AfterValidator(_topics)]
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

    def value(self, env: dict[str, str]) -> KafkaSettings:
        clients = {name: _client_settings(getattr(self, name), name, env)
                   for name in ("consumer", "admin_client")}
        return KafkaSettings(
            # ${VAR} as in the client tables: a stack's or a deployment's listener address.
            bootstrap_servers=expand_env(self.bootstrap_servers, "kafka.bootstrap_servers",
                                         env), topics=tuple(self.topics),
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


