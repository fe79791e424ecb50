"""``[sink] columns = "schema"``: a Debezium sink's columns and upsert key from the writer's
schema, found at the start of each run, before its table is checked (driver/job.py), and
by init-db, which makes the table from what the topic holds.

For each planned range of the topic, its newest records are read on the driver (the last
few, further back only past tombstones and records without a schema): the newest value's
schema (Kafka Connect's JSON envelope; Avro: its schema id -> ``[schema_registry]``) gives
the columns, the newest key's the key (formats/debezium/schema_columns.py). A topic with
no planned range has nothing to resolve. The writers' columns are united with the table's
(driver/writer_columns.py): a field the table lacks is added by ``[sink] evolve =
"add_columns"`` (store/evolve.py; evolve off: exit 2 naming the ALTER, as for declared
columns); a table that does not exist yet is made from the schema (store/schema.py:
``create_missing``). A field no column type holds, or a topic whose events carry no
schema, stops the run (exit 2) naming table, topic and the fix.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace

from pipeline.config import KafkaSettings, Settings, SinkSettings
from pipeline.driver.kafka_records import batches
from pipeline.driver.writer_columns import Writer, with_writer_columns
from pipeline.errors import ConfigError, DataError, Kind, TaskError, TransientError
from pipeline.formats.debezium.schema_columns import (
    NotAnEnvelope,
    Unmapped,
    from_avro,
    from_connect,
)
from pipeline.formats.schema_source import SchemaSource, UnknownSchema
from pipeline.plan.offsets import OffsetRange
from pipeline.sinks import Sink, for_settings
from pipeline.store.evolve import Addition

log = logging.getLogger("pipeline")

TAIL = 16  # records read back from a range's end at first; then 16 times as many
# Once the value's schema is found, records searched for a key's schema before giving up
# (a source table without a primary key sends none): a few hundred, not the whole range.
KEY_SEARCH = TAIL + TAIL * 16
PROBE_GROUP = "pipeline-schema-probe"  # librdkafka's group.id: nothing is committed


def resolve_schema_columns(sink: SinkSettings, topic: str, ranges: Sequence[OffsetRange],
                           kafka: KafkaSettings, registry: SchemaSource | None,
                           store) -> SinkSettings:
    """``sink`` (a route of ``topic``) with its columns and key from the writer's schema of
    the topic's planned ``ranges`` (others are ignored), united with its table's
    (``store``: the run's Store); unchanged when the topic has no range to read, or when
    the sink's columns are declared. Raises ConfigError (exit 2) or TransientError."""
    mine = [r for r in ranges if r.topic == topic and r.count > 0]
    if not sink.columns_from_schema or not mine:
        return sink
    writers = [w for r in mine if (w := newest_writer(sink, r, kafka, registry)) is not None]
    for w in writers:
        for warning in w.columns.warnings:
            log.warning("%s, %s: %s", sink.table, w.where, warning,
                        extra={"event": "schema_columns.warning", "table": sink.table,
                               "topic": topic})
    resolved = with_writer_columns(sink, topic, writers, store.schema.live_table(sink.table))
    log.info("table %s: columns %s, key (%s) from the writer's schema of %s", sink.table,
             ", ".join(f"{c.name} {c.type}" for c in resolved.columns), ", ".join(resolved.key),
             "; ".join(w.where for w in writers) or topic,
             extra={"event": "schema_columns.resolved", "table": sink.table, "topic": topic,
                    "columns": {c.name: c.type for c in resolved.columns},
                    "key": list(resolved.key)})
    return resolved


def with_schema_columns(settings: Settings, store, ranges: Sequence[OffsetRange]
                        ) -> tuple[Settings, Sink, tuple[Addition, ...]]:
    """Today's single-table run: the settings with [sink]'s columns and key resolved for
    every topic of the planned ``ranges``, its sink, its table made if it is new, then
    checked (Store.ready_for; the lock is held already): the additions sink.evolve makes."""
    sink = settings.sink
    for topic in sorted({r.topic for r in ranges}):
        sink = resolve_schema_columns(sink, topic, ranges, settings.kafka,
                                      settings.schema_registry, store)
    if not sink.columns:  # no record read: the table's columns, if it has any
        table = store.schema.live_table(sink.table)
        if table is None:
            raise ConfigError(
                f"table {sink.table} does not exist yet and this run reads no record of "
                f"{', '.join(settings.kafka.topics)} to take its columns from (sink.columns = "
                "'schema'; kafka.starting_offsets = 'latest' plans an empty first run): start "
                "from 'earliest' (Debezium's snapshot is where a replica begins), or declare "
                "[sink.columns]; nothing was read")
        sink = with_writer_columns(sink, ", ".join(settings.kafka.topics), [], table)
    settings = replace(settings, sink=sink)
    results = for_settings(settings)
    for made in store.schema.create_missing([results]):
        log.info("created %s from the writer's schema (sink.columns = 'schema')", made,
                 extra={"event": "schema_columns.created", "table": sink.table})
    return settings, results, store.ready_for("run", [results], lock=False)


def held_columns(settings: Settings, store) -> Settings:
    """init-db of sink.columns = 'schema': [sink]'s columns and key from the newest writer
    schema of what the topics hold now, so that init-db makes the table (as the owner, as
    for declared columns); the settings unchanged when no topic holds a record yet (or
    exists yet: Debezium makes its topics with their first event): the first run that reads
    one makes the table then."""
    from pipeline.driver.kafka_meta import KafkaMeta

    if not settings.sink.columns_from_schema:
        return settings
    try:
        held = KafkaMeta(settings.kafka).topic_offsets(settings.kafka.topics)
    except DataError as e:  # a topic that does not exist yet
        log.info("%s: the table's columns wait for the topic", e.message,
                 extra={"event": "schema_columns.no_topic", "table": settings.sink.table})
        return settings
    ranges = [OffsetRange(k.topic, k.partition, k.earliest, k.latest) for k in held]
    sink = settings.sink
    for topic in sorted({r.topic for r in ranges if r.count > 0}):
        sink = resolve_schema_columns(sink, topic, ranges, settings.kafka,
                                      settings.schema_registry, store)
    return replace(settings, sink=sink)


def table_columns(settings: Settings) -> Settings:
    """sink.columns = 'schema' for what re-reads ranges a run published (verify, backfill,
    dead-letters replay): [sink]'s columns and key are its table's, as the runs made it;
    other settings are returned as they are."""
    if not settings.sink.columns_from_schema or settings.sink.columns:
        return settings
    from pipeline.store import Store

    with Store(settings) as store:
        table = store.schema.live_table(settings.sink.table)
    if table is None:
        raise ConfigError(f"table {settings.sink.table} does not exist yet: its columns come "
                          "from the writer's schema (sink.columns = 'schema'), and no run has "
                          "read the topic yet - run the pipeline first")
    return replace(settings, sink=with_writer_columns(
        settings.sink, ", ".join(settings.kafka.topics), [], table))


# ---- reading the newest records (I/O) ----------------------------------------------------

def newest_writer(sink: SinkSettings, r: OffsetRange, kafka: KafkaSettings,
                  registry: SchemaSource | None) -> Writer | None:
    """The writer's schema of range ``r``'s newest record with a schema (its value's) and
    newest key (its key's), read back from the range's end; None when none has one."""
    from pipeline.executor.consume import reader_config

    reader = reader_config(kafka.client_config(), kafka.isolation_level, PROBE_GROUP,
                           queued=1000)
    value = key = schemaless = None
    until, window = r.until_offset, TAIL

    def searching() -> bool:  # a key's schema is looked for in the newest KEY_SEARCH only
        return value is None or (key is None and r.until_offset - until < KEY_SEARCH)

    while until > r.from_offset and searching():
        start = max(r.from_offset, until - window)
        part = OffsetRange(r.topic, r.partition, start, until)
        records = [m for batch in batches(reader, part, kafka.timeout_seconds,
                                          "columns = 'schema'") for m in batch]
        for m in reversed(records):
            if value is None and m.value() is not None:
                value = _value_schema(sink, registry, m)
                if value is None and schemaless is None:
                    schemaless = _schemaless(sink, m)
            if key is None and m.key() is not None:
                key = _key_schema(sink, registry, m)
        if value is None and schemaless is not None:
            # The newest records are events without a schema (not a stray bad record among
            # events with one): the topic's writer sends none.
            raise ConfigError(_no_schema(sink, r.topic, schemaless))
        until, window = start, window * 16
    if value is None:
        return None
    schema, where = value
    try:
        columns = (from_avro(schema, key) if sink.format == "avro"
                   else from_connect(schema, key))
    except Unmapped as e:
        raise ConfigError(
            f"table {sink.table}: {e} (the writer's schema of {where}): declare the table's "
            f"columns for topic {r.topic} instead of columns = 'schema', leaving '{e.field}' "
            "out or reading it as a string; nothing was read") from None
    except NotAnEnvelope as e:
        raise ConfigError(f"table {sink.table}: {where} is not a Debezium change event ({e}): "
                          "columns = 'schema' reads Debezium's topics only") from None
    return Writer(columns, where)


def _value_schema(sink: SinkSettings, registry: SchemaSource | None, m):
    """(the value's writer schema, where it was read) or None (a record without one: the
    run makes it a dead letter)."""
    where = f"{m.topic()}[{m.partition()}] offset {m.offset()}"
    if sink.format == "avro":
        schema_id = _schema_id(m.value())
        schema = None if schema_id is None else _registry_schema(registry, schema_id)
        return None if schema is None else (schema, f"{where} (writer schema id {schema_id})")
    doc = _json(m.value())
    return (doc["schema"], where) if _enveloped(doc) else None


def _enveloped(doc) -> bool:
    """Kafka Connect's JSON schema envelope: {"schema": {...}, "payload": ...}."""
    return type(doc) is dict and type(doc.get("schema")) is dict and "payload" in doc


def _schemaless(sink: SinkSettings, m) -> str | None:
    """Where and what a record without a writer schema is, when it is a JSON object (an
    event written without Kafka Connect's schema envelope) or, for avro, not in the wire
    format; None for other bytes (a bad record: the run makes it a dead letter)."""
    where = f"{m.topic()}[{m.partition()}] offset {m.offset()}"
    if sink.format == "avro":
        return None if _schema_id(m.value()) is not None else (
            f"{where} is not in the Confluent wire format (no writer schema id)")
    if type(doc := _json(m.value())) is dict and not _enveloped(doc):
        return f"{where} is JSON without Kafka Connect's schema envelope {{schema, payload}}"
    return None


def _no_schema(sink: SinkSettings, topic: str, what: str) -> str:
    fix = ("write the topic with Confluent's AvroConverter and the registry of "
           "[schema_registry]" if sink.format == "avro" else
           "set the connector's value.converter.schemas.enable = true (and key.converter's)")
    return (f"topic {topic} has no writer schema for table {sink.table} ({what}): columns = "
            f"'schema' takes the columns from it - {fix}, or declare the columns in "
            "[sink.columns] instead; nothing was read")


def _key_schema(sink: SinkSettings, registry: SchemaSource | None, m):
    """The key's writer schema (a JSON key without one: a schema of its fields), or None."""
    avro = sink.format == "avro"
    if avro and (schema_id := _schema_id(m.key())) is not None:
        return _registry_schema(registry, schema_id)
    doc = _json(m.key())
    if _enveloped(doc):
        names = [f.get("field") for f in doc["schema"].get("fields") or ()]
    elif type(doc) is dict:  # a bare JSON key: its fields
        names = list(doc)
    else:
        return None
    if avro:
        return {"type": "record", "name": "Key", "fields": [{"name": n} for n in names]}
    return {"type": "struct", "fields": [{"field": n} for n in names]}


def _schema_id(data: bytes) -> int | None:
    if len(data) < 5 or data[0] != 0:
        return None
    return int.from_bytes(data[1:5], "big")


def _registry_schema(registry: SchemaSource | None, schema_id: int):
    """The parsed writer schema of an id, None for an id the registry does not know (its
    record is a dead letter of the run); a registry that fails stops the run."""
    from pipeline.formats.avro.schemas import writer_schema

    if registry is None:
        raise ConfigError("sink.columns = 'schema' with format = 'avro' needs "
                          "[schema_registry]")
    try:
        return writer_schema(registry, schema_id)
    except UnknownSchema:
        return None
    except TaskError as e:
        error = ConfigError if e.kind == Kind.CONFIG else TransientError
        raise error(f"sink.columns = 'schema': {e.message}") from None


def _json(data: bytes):
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None
