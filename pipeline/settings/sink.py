"""[sink]: the result table, how records become its rows (format, columns, a transform) and
how rows meet the table (mode: sink_modes.py; evolve; a Debezium envelope). ``table`` may
be a template of the topic's name, and [sink.topics."<topic>"] a topic's own route keys:
settings/routes.py makes each topic's route of them."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, create_model

from pipeline.errors import ConfigError
from pipeline.formats import types
from pipeline.settings.base import Table, about_key
from pipeline.settings.columns import Column, column
from pipeline.settings.sink_modes import Aggregate, mode_fields
from pipeline.settings.table_template import check_template

SINK_FORMATS = ("raw", "json", "avro", "protobuf")
# The formats whose rows are the declared [sink.columns] (raw's columns are fixed).
COLUMN_FORMATS = ("json", "avro", "protobuf")
SINK_MODES = ("append", "upsert", "aggregate")
# [sink] evolve: "off" (a column the table lacks is an exit-2 error before reading) or
# "add_columns" (added by the run, before it reads: pipeline/store/evolve.py).
Evolve = Literal["off", "add_columns"]


@dataclass(frozen=True)
class SinkSettings:
    format: str
    table: str  # [sink]'s may be a template (settings/routes.py); a route's is resolved
    max_bad_records: int = -1
    transform: str | None = None
    columns: tuple[Column, ...] = ()
    # append: one row per record. upsert: the newest record per ``key``. aggregate:
    # ``aggregates`` per ``group_by``, merged additively (docs/reliability.md).
    mode: str = "append"
    key: tuple[str, ...] = ()  # upsert: the business key; aggregate: the group_by columns
    tombstones: str = "delete"  # upsert: a null value with a key deletes | dead_letter
    aggregates: tuple[Aggregate, ...] = ()
    evolve: Evolve = "off"
    envelope: str = "none"  # "debezium": values are change events (formats/debezium/)
    # debezium: a truncate (op t) is a dead letter, or "apply": it deletes every row older
    # than it by the upsert's ordering rule (sinks/upsert.py).
    truncate: str = "dead_letter"
    # debezium: the connector's transaction topic (provide.transaction.metadata): a run
    # publishes whole source transactions only (plan/transactions.py).
    transactions: str | None = None
    # columns = "schema": ``columns`` and ``key`` come from the writer's schema, filled in
    # by init-db and by each run before it checks the table (driver/schema_probe.py);
    # empty until then.
    columns_from_schema: bool = False

    @property
    def record_format(self) -> str:
        """The executors' record format (formats.registry.FORMATS)."""
        if self.envelope == "debezium":
            return "debezium_avro" if self.format == "avro" else "debezium"
        return self.format

    @property
    def deletes(self) -> bool:
        """Upsert with tombstones that delete: a null-valued record's Kafka key names the
        row to delete."""
        return self.mode == "upsert" and self.tombstones == "delete"


def _transform(value: str) -> str:
    if not re.match(r"^[\w.]+:\w+$", value):
        raise about_key(f"= {value!r}: write it as 'module:function'")
    return value


def _columns(value: Any) -> dict[str, Any] | str:
    """[sink.columns], or "schema": the writer's schema says (_schema_columns)."""
    if value != "schema" and not isinstance(value, dict):
        raise about_key(f"= {value!r}: write a table of columns ([sink.columns], name = "
                        "\"type\"), or \"schema\" for the columns of Debezium's writer schema")
    return value


class SinkTable(Table):
    format: Literal["raw", "json", "avro", "protobuf"] = "raw"
    table: Annotated[str, AfterValidator(check_template)]
    max_bad_records: int = Field(-1, ge=-1, description="-1 = no limit")
    transform: Annotated[str, AfterValidator(_transform)] | None = None
    columns: Annotated[Any, AfterValidator(_columns)] = {}
    mode: Literal["append", "upsert", "aggregate"] = "append"
    # Which mode each is for: sink_modes.py.
    key: list | None = None
    tombstones: Literal["delete", "dead_letter"] | None = None
    group_by: list | None = None
    aggregates: dict[str, Any] | None = None
    evolve: Evolve = "off"
    envelope: Literal["none", "debezium"] = "none"
    truncate: Literal["apply", "dead_letter"] | None = None
    transactions: str | None = None
    # [sink.topics."<topic>"]: the keys of ROUTE_KEYS for one topic (settings/routes.py).
    topics: dict[str, RouteTable] = {}

    def value(self) -> SinkSettings:
        if self.columns == "schema":
            return _schema_columns(self)
        fmt, transform = self.format, self.transform
        columns = [column(cname, spec) for cname, spec in self.columns.items()]
        if fmt in COLUMN_FORMATS and not columns:
            raise ConfigError(f"sink.format = '{fmt}' needs at least one column in "
                              "[sink.columns]")
        if fmt == "raw" and columns:
            raise ConfigError("[sink.columns] is only for sink.format = 'json', 'avro' or "
                              "'protobuf'")
        for c in columns if transform is not None else ():
            # A transform's DataFrame holds the Encoder's rows as typed Spark columns
            # (executor/transform/typed_rows.py, paths too): scalars only, and no decimal
            # without precision (no Spark type keeps each value's own scale).
            t = types.column_type(c.type)
            if not t.scalar or t.own_scale:
                raise ConfigError(
                    f"'sink.columns.{c.name}' ({c.type}) is not supported with "
                    f"'sink.transform' = {transform!r} yet: remove sink.transform, declare it "
                    "decimal(p,s), or read the field in the transform")
        sink = SinkSettings(fmt, self.table, self.max_bad_records, transform, tuple(columns))
        sink = replace(sink, **mode_fields(
            self.mode, sink.columns, transform, key=self.key, tombstones=self.tombstones,
            group_by=self.group_by, aggregates=self.aggregates))
        return _envelope(self, _evolve(self, sink))


# The keys a topic's route may set apart from [sink] ([sink.topics."<topic>"]): where its
# rows go and how they meet that table. format, envelope and transform stay the pipeline's:
# one pipeline reads one source's encoding (its executors' decoder and schema registry, and
# the transaction metadata of a Debezium connector's topics, are the pipeline's).
ROUTE_KEYS = ("table", "columns", "mode", "key", "tombstones", "group_by", "aggregates",
              "evolve", "truncate", "max_bad_records")
# A route's keys as [sink] has them, each optional (None: [sink]'s applies); their checks
# are [sink]'s, as written there.
def _optional(info) -> Any:
    kind = (Annotated[(info.annotation, *info.metadata)] if info.metadata
            else info.annotation)
    return (kind | None, Field(None, description=info.description))


RouteTable = create_model("RouteTable", __base__=Table,
                          **{k: _optional(SinkTable.model_fields[k]) for k in ROUTE_KEYS})
SinkTable.model_rebuild()


def _evolve(s: SinkTable, sink: SinkSettings) -> SinkSettings:
    """[sink] evolve: whether a declared column the table lacks is added by the run."""
    if s.evolve == "off":
        return sink
    if sink.format not in COLUMN_FORMATS:
        raise ConfigError("'sink.evolve' adds columns declared in [sink.columns]: it is for "
                          "sink.format = 'json', 'avro' or 'protobuf' (a raw table's columns "
                          "are fixed)")
    if sink.mode == "aggregate":
        raise ConfigError(
            "'sink.evolve' = 'add_columns' is refused for sink.mode = 'aggregate': a new "
            "aggregate column would total only the records read from now on, beside groups "
            "that counted everything before; add it by hand and rebuild the totals (see "
            "docs/operations.md), or remove sink.evolve")
    return replace(sink, evolve=s.evolve)


def _envelope(s: SinkTable, sink: SinkSettings) -> SinkSettings:
    """[sink] envelope: "debezium" reads change events into an upsert sink; [sink] truncate
    says what its truncates do."""
    if s.envelope == "none":
        if s.truncate is not None:
            raise ConfigError("'sink.truncate' is only for sink.envelope = 'debezium' (what a "
                              "change event's truncate does)")
        if s.transactions is not None:
            raise ConfigError("'sink.transactions' is only for sink.envelope = 'debezium' "
                              "(Debezium's transaction topic, provide.transaction.metadata)")
        return sink
    if sink.format not in ("json", "avro") or sink.transform:
        raise ConfigError("'sink.envelope' = 'debezium' needs sink.format = 'json' or 'avro' "
                          "and no sink.transform (Protobuf change events and transforms: not "
                          "yet)")
    if sink.mode != "upsert" or not sink.deletes:
        raise ConfigError("'sink.envelope' = 'debezium' needs sink.mode = 'upsert' with key = "
                          "[the source table's key columns] and tombstones = 'delete' (the "
                          "default): a change event upserts or deletes its row")
    _check_transactions_name(s)
    return replace(sink, envelope=s.envelope, truncate=s.truncate or "dead_letter",
                   transactions=s.transactions)


def _check_transactions_name(s: SinkTable) -> None:
    if s.transactions is not None and not re.match(r"^[A-Za-z0-9._-]{1,249}$", s.transactions):
        raise ConfigError(f"'sink.transactions' = {s.transactions!r} is not a Kafka topic name: "
                          "name Debezium's transaction topic, e.g. \"<topic.prefix>.transaction\"")


def check_transactions_topic(sink: SinkSettings, kafka) -> None:
    """[sink] transactions names the metadata topic, never one of the data topics."""
    if sink.transactions is not None and kafka.matches(sink.transactions):
        raise ConfigError(f"'sink.transactions' = {sink.transactions!r} is also one of the "
                          f"pipeline's topics ({kafka.describe_topics()}): the transaction topic "
                          "holds BEGIN/END events, not changes; leave it out of kafka.topics / "
                          "kafka.topic_pattern")


def _schema_columns(s: SinkTable) -> SinkSettings:
    """columns = "schema": a Debezium upsert whose columns and key the run takes from the
    writer's schema (Kafka Connect's JSON envelope, or Avro through [schema_registry])."""
    if s.envelope != "debezium" or s.format not in ("json", "avro") or s.mode != "upsert":
        raise ConfigError("'sink.columns' = 'schema' reads the columns from Debezium's change "
                          "events: it needs sink.envelope = 'debezium', sink.format = 'json' "
                          "(Kafka Connect's schema envelope) or 'avro', and sink.mode = "
                          "'upsert'")
    for name in ("key", "group_by", "aggregates", "transform"):
        if getattr(s, name) is not None:
            why = ("the key is the Kafka key's fields" if name == "key" else
                   "it is for declared columns")
            raise ConfigError(f"'sink.{name}' is not for sink.columns = 'schema' ({why}); "
                              "remove it")
    if s.tombstones == "dead_letter":
        raise ConfigError("'sink.envelope' = 'debezium' needs sink.tombstones = 'delete' (the "
                          "default): a change event upserts or deletes its row")
    _check_transactions_name(s)
    sink = SinkSettings(s.format, s.table, s.max_bad_records, mode="upsert",
                        tombstones="delete", envelope=s.envelope,
                        truncate=s.truncate or "dead_letter", columns_from_schema=True,
                        transactions=s.transactions)
    return _evolve(s, sink)
