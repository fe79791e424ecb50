"""A pipeline's config file as one model of its tables, and the Settings a run uses."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import model_validator

from pipeline.errors import ConfigError
from pipeline.formats.schema_source import SchemaSource
from pipeline.settings.airflow import AirflowTable
from pipeline.settings.base import Identifier, Table
from pipeline.settings.database import DatabaseTable
from pipeline.settings.kafka import KafkaSettings, KafkaTable
from pipeline.settings.metrics import MetricsSettings, MetricsTable
from pipeline.settings.registry import SchemaRegistryTable, schema_source
from pipeline.settings.routes import Routes, routes_of
from pipeline.settings.secrets import redact_settings, redact_url
from pipeline.settings.sink import SinkSettings, SinkTable, check_transactions_topic
from pipeline.settings.spark import SparkSettings, SparkTable


class PipelineTable(Table):
    name: Identifier


class ConfigFile(Table):
    """The file's tables, in the order their problems are told."""
    airflow: AirflowTable = AirflowTable()
    pipeline: PipelineTable
    kafka: KafkaTable
    database: DatabaseTable
    sink: SinkTable
    spark: SparkTable = SparkTable()
    metrics: MetricsTable = MetricsTable()
    schema_registry: SchemaRegistryTable | None = None

    @model_validator(mode="before")
    @classmethod
    def _required_tables(cls, data: Any) -> Any:
        """A missing table is an empty one: its first required key is what the error names
        ("missing required key 'pipeline.name'")."""
        if isinstance(data, dict):
            return {**{t: {} for t in ("pipeline", "kafka", "database", "sink")}, **data}
        return data

    def settings(self, source: str, env: dict[str, str]) -> Settings:
        """The run's settings; the checks across keys (the sink's columns and mode, a
        registry for the formats that need one) raise ConfigError."""
        kafka, database_url = self.kafka.value(env), self.database.database_url(env)
        routes = routes_of(self.sink)
        routes.check_topics(kafka.matches, kafka.describe_topics())
        if kafka.topics:  # every route known now: checked now (a pattern's, at each run)
            routes.tables(kafka.topics)
        elif routes.default.transform and routes.overrides:
            raise ConfigError(f"[sink] transform {routes.default.transform!r} with "
                              "[sink.topics.*] routes: not yet; a transform writes one table")
        if routes.one_table is None and any(
                r.columns_from_schema for r in (routes.default, *(o for _, o in routes.overrides))):
            raise ConfigError(
                "[sink] columns = \"schema\" with a table per topic (a table template or "
                "[sink.topics.*] tables): not in this version; declare each table's columns "
                "([sink.columns], a topic's [sink.topics.\"<topic>\"] columns) or send every "
                "topic into one table")
        sink = routes.default
        check_transactions_topic(sink, kafka)
        return Settings(
            name=self.pipeline.name, kafka=kafka, database_url=database_url,
            schema=self.database.schema_, sink=sink, spark=self.spark.value(), source=source,
            sink_overrides=routes.overrides,
            lock_timeout_seconds=float(self.database.lock_timeout_seconds),
            statement_timeout_seconds=float(self.database.statement_timeout_seconds),
            metrics=self.metrics.value(env),
            schema_registry=schema_source(self.schema_registry, sink.format, env))


@dataclass(frozen=True)
class Settings:
    name: str
    kafka: KafkaSettings
    database_url: str = field(repr=False)  # it may hold the password
    schema: str
    sink: SinkSettings
    spark: SparkSettings
    source: str = "<defaults>"
    # [database]'s waits of the publishing transaction (0 = none): database.py.
    lock_timeout_seconds: float = 60.0
    statement_timeout_seconds: float = 0.0
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    # [schema_registry]: the avro format's writer schemas (None for json and raw).
    schema_registry: SchemaSource | None = None
    # [sink.topics."<topic>"]: the topics' own routes, tables resolved (settings/routes.py).
    sink_overrides: tuple = ()

    @property
    def routes(self) -> Routes:
        """Each topic's route: ``routes.for_topic(topic)``, ``routes.tables(topics)``."""
        return Routes(self.sink, self.sink_overrides)

    def redacted(self) -> dict[str, Any]:
        """What may be printed or stored: no password, no SASL secret."""
        return {
            "name": self.name,
            "kafka": {
                "bootstrap_servers": self.kafka.bootstrap_servers,
                "topics": list(self.kafka.topics),
                **({"topic_pattern": self.kafka.topic_pattern}
                   if self.kafka.topic_pattern else {}),
                "isolation_level": self.kafka.isolation_level,
                "consumer": redact_settings(self.kafka.consumer),
                "admin_client": redact_settings(self.kafka.admin_client),
            },
            "database_url": redact_url(self.database_url),
            "sink": {"format": self.sink.format, "table": self.sink.table,
                     "mode": self.sink.mode,
                     **({"topics": {t: {"table": r.table, "mode": r.mode}
                                    for t, r in self.sink_overrides}}
                        if self.sink_overrides else {})},
            **({"schema_registry": self.schema_registry.describe()}
               if self.schema_registry else {}),
        }


def keys(model: type[Table]) -> dict[str, Any]:
    """A table's keys as the file spells them, and their fields."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


# The file's tables by name, and the keys each allows.
TABLES: dict[str, type[Table]] = {
    name: next(a for a in (info.annotation, *typing.get_args(info.annotation))
               if isinstance(a, type) and issubclass(a, Table))
    for name, info in ConfigFile.model_fields.items()}
SECTIONS: dict[str, set[str]] = {name: set(keys(model)) for name, model in TABLES.items()}
