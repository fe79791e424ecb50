"""``[sink] columns = "schema"``: a table's columns and upsert key from what its topics'
writers say (driver/schema_probe.py reads them) and the table as it is. Pure.

The columns are the union of the writers' fields and the table's: a column the source no
longer sends stays (NULL in new rows); a field the table lacks is a nullable column (rows
already there have no value for it: ``[sink] evolve`` adds it); a field whose type differs
from the table's column, a field named like a pipeline column, or writers whose Kafka keys
disagree are ConfigError (exit 2) naming table, topic, column, both types and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipeline.config import SinkSettings
from pipeline.errors import ConfigError
from pipeline.formats.debezium.schema_columns import SchemaColumn, WriterColumns
from pipeline.settings.columns import column
from pipeline.settings.sink_modes import mode_fields
from pipeline.store import tables
from pipeline.store.schema import LiveTable

# What an upsert table holds besides the record's columns (sinks/upsert.py).
FIXED_COLUMNS = frozenset({"topic", "partition", "offset", "kafka_timestamp", "run_id",
                           "ingested_at", "_order_time"})


@dataclass(frozen=True)
class Writer:
    """What the newest records of one planned range say: ``columns`` (their writer's), and
    ``where`` they were read, for messages."""

    columns: WriterColumns
    where: str


def with_writer_columns(sink: SinkSettings, topic: str, writers: Sequence[Writer],
                        table: LiveTable | None) -> SinkSettings:
    """The columns and key of ``sink``: the writers' fields (in their order), the columns
    the sink has already (another topic of its table), then the table's other columns;
    raises ConfigError on a conflict, naming its fix."""
    name = sink.table
    found: dict[str, tuple[SchemaColumn, str]] = {}
    keys: list[tuple[tuple[str, ...], str]] = []
    earlier = [(SchemaColumn(c.name, c.type, c.required), "another topic of the table")
               for c in sink.columns]
    for columns, where in [*((w.columns.columns, w.where) for w in writers),
                           *(((c,), w) for c, w in earlier)]:
        for c in columns:
            if c.name not in found:
                found[c.name] = (c, where)
            elif found[c.name][0].type != c.type:
                raise ConfigError(
                    f"table {name}, topic {topic}: field '{c.name}' is {c.type} in {where} "
                    f"and {found[c.name][0].type} in {found[c.name][1]}: one column cannot be "
                    "both; route the topics to tables of their own, or declare the table's "
                    "columns")
            elif not c.required:  # not null only where every writer says so
                found[c.name] = (c, found[c.name][1])
    keys = [(w.columns.key, w.where) for w in writers if w.columns.key]
    columns = [c for c, _ in found.values()]
    if table is not None:
        columns = _with_table(name, topic, columns, {n: w for n, (_, w) in found.items()},
                              table)
    if not columns:
        raise ConfigError(f"table {name}: no record of topic {topic}'s planned ranges carries "
                          "a writer schema (tombstones or unreadable records only) and the "
                          "table does not exist: nothing says its columns; rerun when the "
                          "topic has a change event, or declare [sink.columns]")
    return _validated(sink, topic, columns, _key(sink, topic, keys, table))


def _key(sink: SinkSettings, topic: str, keys: list[tuple[tuple[str, ...], str]],
         table: LiveTable | None) -> tuple[str, ...]:
    """The key the writers' Kafka keys agree on (else the sink's so far, else the table's)."""
    distinct = {k for k, _ in keys}
    if len(distinct) > 1:
        raise ConfigError(
            f"table {sink.table}, topic {topic}: the Kafka keys name different key columns ("
            + "; ".join(f"({', '.join(k)}) in {where}" for k, where in keys) + "): the source "
            "table's primary key changed; rebuild the table with the new key (a new "
            "sink.table, then a backfill), or declare the columns and key")
    key = next(iter(distinct), None) or sink.key or (table.key if table else ())
    if not key:
        raise ConfigError(
            f"table {sink.table}: the records of topic {topic} have no Kafka key with a schema "
            "(a source table without a primary key?): an upsert needs the key - give the "
            "source table a primary key (or Debezium's message.key.columns), or declare the "
            "columns and key")
    return key


def _with_table(name: str, topic: str, columns: list[SchemaColumn], where: dict[str, str],
                table: LiveTable) -> list[SchemaColumn]:
    """The writers' columns checked against the table's; a field the table lacks is added
    without NOT NULL (rows already there have no value for it), a column the writers lack
    is kept (NULL in new rows)."""
    out = []
    for c in columns:
        live = table.columns.get(c.name)
        want = tables.ddl_type(tables.sink_type(c.type))
        if live is None:
            out.append(replace(c, required=False))
            continue
        if live[0] != want:
            raise ConfigError(
                f"table {name}: column {c.name} is {live[0]}, the writer's schema of topic "
                f"{topic} says {c.type} ({want}) in {where[c.name]}: run 'ALTER TABLE {name} "
                f"ALTER COLUMN {c.name} TYPE {want}' as the table's owner (or point "
                "sink.table at a new table); nothing was read")
        out.append(c)
    have = {c.name for c in out}
    for cname, (ddl, _) in table.columns.items():
        declared = tables.declared_type(ddl)
        if cname in have or cname in FIXED_COLUMNS or declared is None:
            continue  # a pipeline column, or one the pipeline does not write
        out.append(SchemaColumn(cname, declared, False))
    return out


def _validated(sink: SinkSettings, topic: str, columns: list[SchemaColumn],
               key: tuple[str, ...]) -> SinkSettings:
    """The columns and key through [sink]'s own checks (names, reserved columns, the
    upsert key), each refusal naming the topic and the fix."""
    try:
        made = tuple(column(c.name, f"{c.type}{' not null' if c.required else ''}")
                     for c in columns)
        fields = mode_fields("upsert", made, None, key=list(key), tombstones="delete")
    except ConfigError as e:
        raise ConfigError(
            f"table {sink.table}, topic {topic}: the writer's schema cannot be the table's "
            f"columns as it is ({e.message.replace('sink.columns.', 'column ')}): declare the "
            "table's columns for the topic (with from = \"<field>\" for a name to change) "
            "instead of columns = 'schema'") from None
    return replace(sink, columns=fields["columns"], key=fields["key"])
