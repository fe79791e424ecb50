"""Kafka records -> Postgres COPY rows: a result row or a dead letter per record.

The built-in sinks' per-record work, in plain Python on the executors (see consume.py for
why not in the JVM). The record format (registry.py: json, raw) turns a batch into result
rows in its own wire encoding; what is the same for every format is here: the guard that
makes any record whose encoding raises a dead letter, an upsert sink's tombstones, and the
dead letters of rejected records. Pure: takes records (anything with confluent-kafka's
Message methods ``offset() key() value() headers() timestamp()``), returns lines;
unit-tested without Kafka or Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pipeline.errors import TaskError
from pipeline.formats import paths
from pipeline.formats.dead_letters import dead_line, unexpected
from pipeline.formats.registry import CHOOSE_WIRE, binary_rows, record_format
from pipeline.formats.schema_source import SchemaSource
from pipeline.formats.timestamps import TimestampOutOfRange, kafka_timestamp
from pipeline.formats.tombstones import EVERY_KEY, BadTombstone, key_fields
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import NULL, text


class Encoded(NamedTuple):
    """One batch's lines: result rows, dead letters, and an upsert sink's tombstones
    (``topic, partition, offset, kafka_timestamp, key..., run_id, t``)."""
    rows: list[str] | list[bytes]
    dead: list[str]
    tombstones: list[str]


class Encoder:
    """Turns a batch of one partition's records into result lines and dead-letter lines.

    ``fmt``: the record format's name (config.SinkSettings.format), chosen here once.
    ``columns``: the declared (name, type, required[, path]) columns; empty for raw.
    ``tombstone_key``: an upsert sink's key columns when a null value deletes its key
    (config.SinkSettings.deletes); empty otherwise, and a null value is a dead letter.
    ``schemas``: where the avro format's writer schemas come from ([schema_registry]).
    ``text_rows``: result rows as COPY text even where the format would write binary
    (registry.binary_rows): a transform's feed (executor/transform/typed_rows.py) reads the text.
    ``truncate``: a change-event format's truncate deletes every key ([sink] truncate =
    "apply"; its tombstone line's key fields are NULL) instead of being a dead letter."""

    def __init__(self, fmt: str, columns: Sequence[tuple[str, str, bool]], run_id: int,
                 tombstone_key: Sequence[str] = (), schemas: SchemaSource | None = None,
                 text_rows: bool = False, truncate: bool = False):
        # Only a format that reads schemas (avro) takes a schema source; one that can write
        # either wire (avro) writes COPY binary unless ``text_rows`` (a transform's feed,
        # which reads the text lines into Arrow) or its columns have no binary form.
        options: dict = {} if schemas is None else {"schemas": schemas}
        if fmt in CHOOSE_WIRE:
            options["binary"] = not text_rows and binary_rows(fmt, columns)
        if getattr(record_format(fmt), "change_events", False):
            options.update(key=tuple(tombstone_key), truncate=truncate)
        self.format = record_format(fmt)(columns, run_id, **options)
        self.delete_key = getattr(self.format, "delete_key", None)
        self.wire = self.format.wire
        self.binary = self.wire.binary
        self.run_id = run_id
        self.format_columns = getattr(self.format, "value_columns", None)
        declared = {c[0]: c for c in paths.columns(columns)}
        self.key = [(n, column_type(declared[n][1]).from_json, declared[n][1], declared[n][3])
                    for n in tombstone_key]

    def encode(self, topic: str, partition: int, records) -> Encoded:
        """(result rows, dead-letter lines, tombstones): rows in the format's wire encoding
        (bytes of COPY binary for raw and avro, COPY text lines for json, or for avro with
        ``text_rows``); the rest is text.

        No record can fail a batch: the batch is encoded at full speed and, only when that
        raises (anything: RecursionError, OverflowError, MemoryError, a bug), again one
        record at a time, where whatever one record raises makes it a dead letter naming
        the exception. The good path pays nothing for the guard."""
        head = f"{text(topic)}\t{partition}\t"
        try:
            return self._encode(topic, partition, head, records)
        except TaskError:  # not a record's fault (a schema registry down): the run's
            raise
        except Exception:  # noqa: BLE001 - some record of the batch: found by _encode_each
            return self._encode_each(topic, partition, head, records)

    def transactions(self, topic: str, partition: int, records
                     ) -> tuple[Encoded, list[tuple[str, int] | None]]:
        """``encode``, and each record's source transaction and its order within its table
        (formats/debezium: ``transaction_of``; None for a record of none: a snapshot's
        read, a tombstone, what is no change event), in the records' order: what a read
        task summarises when whole source transactions are kept (executor/segments.py).
        Only this path collects them: ``encode`` pays nothing for it."""
        if not hasattr(self.format, "sources"):
            raise TypeError(f"{type(self.format).__name__} reads no source transactions "
                            "([sink] transactions needs envelope = \"debezium\")")
        sources: dict[int, tuple[str, int]] = {}
        self.format.sources = sources
        try:
            encoded = self.encode(topic, partition, records)
        finally:
            self.format.sources = None
        return encoded, [sources.get(m.offset()) for m in records]

    def columns(self, topic: str, partition: int, records) -> Encoded | None:
        """The batch as ``encode`` has it, its rows as one list of values per column
        (JsonFormat.value_columns: offsets, epoch ms, then the declared columns) for the
        transform feed (executor/transform/typed_rows.py); None where the format has no such form or
        the batch raised (then ``encode``, whose per-record boundary finds the record)."""
        if self.format_columns is None:
            return None
        head = f"{text(topic)}\t{partition}\t"
        try:
            return self._encode(topic, partition, head, records, self.format_columns)
        except TaskError:
            raise
        except Exception:  # noqa: BLE001 - some record of the batch: encode() finds it
            return None

    def _encode_each(self, topic: str, partition: int, head: str, records) -> Encoded:
        """The per-record boundary: each record alone; any exception is its dead letter."""
        rows: list = []
        dead: list[str] = []
        tombstones: list[str] = []
        for m in records:
            try:
                one = self._encode(topic, partition, head, [m])
            except TaskError:
                raise
            except Exception as e:  # noqa: BLE001 - whatever it is, it is this record's
                dead.append(self.failed_line(head, m, e))
                continue
            rows += one.rows
            dead += one.dead
            tombstones += one.tombstones
        return Encoded(rows, dead, tombstones)

    def failed_line(self, head: str, m, e: Exception) -> str:
        """The dead letter of a record whose encoding raised ``e``."""
        if isinstance(e, TimestampOutOfRange):
            return dead_line(head, m, "timestamp_out_of_range", str(e))
        return dead_line(head, m, *unexpected(e, "encoding the record"))

    def _encode(self, topic: str, partition: int, head: str, records,
                rows_of=None) -> Encoded:
        dead: list[str] = []
        tombstones: list[str] = []
        rejected: list = []

        def refuse(m, error_type: str, message: str) -> None:
            dead.append(dead_line(head, m, error_type, message))

        rows = (rows_of or self.format.rows)(topic, partition, head, records, rejected,
                                             refuse)
        for m in rejected:
            # A timestamp Postgres cannot hold raises here (the format rejected it):
            # encode() then makes the record a dead letter of that type.
            timestamp = kafka_timestamp(m.timestamp()[1])
            # A format that deletes by more than null values (debezium) names the key.
            deletes = self.delete_key is not None or m.value() is None
            if deletes and self.key:
                what = "tombstone (null value)" if m.value() is None else "delete"
                try:
                    key = m.key() if self.delete_key is None else self.delete_key(m, self.key)
                    fields = "\t".join(NULL for _ in self.key) if key is EVERY_KEY else \
                        "\t".join(key_fields(key, self.key))
                except BadTombstone as e:
                    dead.append(dead_line(head, m, "bad_tombstone", f"{what} {e}: it cannot "
                                          "name the row to delete"))
                else:
                    tombstones.append(f"{head}{m.offset()}\t{timestamp}\t{fields}"
                                      f"\t{self.run_id}\tt\n")
                continue
            dead.append(dead_line(head, m, *self.format.explain(m)))
        return Encoded(rows, dead, tombstones)
