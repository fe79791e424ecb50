"""[kafka]: the broker, the topics, how much one run reads, and the clients' own settings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationInfo

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
    consumer: dict[str, str] = field(default_factory=dict, repr=False)  # both clients
    spark_consumer: dict[str, str] = field(default_factory=dict, repr=False)  # Java client
    admin_client: dict[str, str] = field(default_factory=dict, repr=False)  # confluent-kafka

    def client_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings for metadata, offsets and the mirror."""
        return {**self.consumer, **self.admin_client, "bootstrap.servers": self.bootstrap_servers}

    def spark_options(self) -> dict[str, str]:
        """Settings for Spark's Kafka source (the Java client), without the kafka. prefix."""
        return {**self.consumer, **self.spark_consumer}


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
    spark_consumer: ClientTable = {}
    admin_client: ClientTable = {}

    def value(self, env: dict[str, str]) -> KafkaSettings:
        clients = {name: _client_settings(getattr(self, name), name, env)
                   for name in ("consumer", "spark_consumer", "admin_client")}
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


