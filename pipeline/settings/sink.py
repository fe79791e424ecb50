"""[sink]: the result table, how records become its rows (format, columns, a transform) and
how rows meet the table (mode: sink_modes.py; evolve; a Debezium envelope)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from pipeline.errors import ConfigError
from pipeline.formats import types
from pipeline.settings.base import Identifier, Table, about_key
from pipeline.settings.columns import Column, column
from pipeline.settings.sink_modes import Aggregate, mode_fields

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
    table: str
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


class SinkTable(Table):
    format: Literal["raw", "json", "avro", "protobuf"] = "raw"
    table: Identifier
    max_bad_records: int = Field(-1, ge=-1, description="-1 = no limit")
    transform: Annotated[str, AfterValidator(_transform)] | None = None
    columns: dict[str, Any] = {}
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

    def value(self) -> SinkSettings:
        fmt, transform = self.format, self.transform
        columns = [column(cname, spec) for cname, spec in self.columns.items()]
        if fmt in COLUMN_FORMATS and not columns:
            raise ConfigError(f"sink.format = '{fmt}' needs at least one column in "
                              "[sink.columns]")
        if fmt == "raw" and columns:
            raise ConfigError("[sink.columns] is only for sink.format = 'json' or 'avro'")
        for c in columns if transform is not None else ():
            # A transform's DataFrame holds the Encoder's rows as typed Spark columns
            # (executor/transform/typed_rows.py, paths too): scalars only.
            if not types.column_type(c.type).scalar:
                what = c.type
                raise ConfigError(
                    f"'sink.columns.{c.name}' ({what}) is not supported with 'sink.transform' "
                    f"= {transform!r} yet: remove sink.transform, or read the field in the "
                    "transform")
        sink = SinkSettings(fmt, self.table, self.max_bad_records, transform, tuple(columns))
        sink = replace(sink, **mode_fields(
            self.mode, sink.columns, transform, key=self.key, tombstones=self.tombstones,
            group_by=self.group_by, aggregates=self.aggregates))
        return _envelope(self, _evolve(self, sink))


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
    if s.transactions is not None and not re.match(r"^[A-Za-z0-9._-]{1,249}$", s.transactions):
        raise ConfigError(f"'sink.transactions' = {s.transactions!r} is not a Kafka topic name: "
                          "name Debezium's transaction topic, e.g. \"<topic.prefix>.transaction\"")
    return replace(sink, envelope=s.envelope, truncate=s.truncate or "dead_letter",
                   transactions=s.transactions)


def check_transactions_topic(sink: SinkSettings, topics) -> None:
    """[sink] transactions names the metadata topic, never one of the data topics."""
    if sink.transactions is not None and sink.transactions in topics:
        raise ConfigError(f"'sink.transactions' = {sink.transactions!r} is also in kafka.topics: "
                          "the transaction topic holds BEGIN/END events, not changes; remove it "
                          "from kafka.topics")
