"""What the driver hands a Spark task: one frozen, typed, picklable spec per kind of task
(what Spark's KafkaBatchInputPartition is to its reader), plain Python with no Spark,
SQLAlchemy or Kafka client inside, so that it pickles small and reads the same on both
sides. The driver builds it (driver/job.py, driver/transform_job.py), executor/stage.py and
executor/transform/ run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.formats.schema_source import SchemaSource

# One blob's bytes at most (but for a single line larger than that): a bytea value, and a
# COPY row, cannot pass 1 GB, and 10,000 records of 100 KB would.
BLOB_BYTES = 64 << 20


@dataclass(frozen=True)
class StagingTarget:
    """Where a task attempt stages its blobs: the run's staging table, written with plain
    psycopg. ``copy_sql``, ``types``: its binary COPY statement and column types as psycopg
    names them (store.run.Run.staging_copy)."""

    url: str
    copy_sql: str
    types: tuple[str, ...]
    max_blob_bytes: int = BLOB_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "types", tuple(self.types))


@dataclass(frozen=True)
class EncoderSettings:
    """How a read task turns records into rows (formats.encode.Encoder): the sink's format,
    the declared (name, type, required, source path) columns (formats/paths.py), the run id
    every row carries, an upsert sink's key columns when a null value deletes its key (else
    empty), where the avro format's writer schemas come from, and whether a change event's
    truncate deletes every key ([sink] truncate = "apply")."""

    format: str
    columns: tuple[tuple, ...]
    run_id: int
    tombstone_key: tuple[str, ...] = ()
    schemas: SchemaSource | None = None
    truncate: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(tuple(c) for c in self.columns))
        object.__setattr__(self, "tombstone_key", tuple(self.tombstone_key))

    @classmethod
    def for_settings(cls, settings, run_id: int) -> EncoderSettings:
        """The encoder of [sink] as written (a pipeline of one table: a dead-letter replay,
        verify)."""
        return cls.for_route(settings.sink, settings.schema_registry, run_id)

    @classmethod
    def for_route(cls, sink, schemas: SchemaSource | None, run_id: int) -> EncoderSettings:
        """The one way a topic's route (a SinkSettings: settings/routes.py) becomes an
        encoder's (a run's read tasks, a dead-letter replay and verify must encode a record
        alike); ``schemas``: the pipeline's [schema_registry]."""
        return cls(sink.record_format,
                   tuple((c.name, c.type, c.required, c.source) for c in sink.columns),
                   run_id, sink.key if sink.deletes else (), schemas,
                   sink.truncate == "apply")

    def encoder(self, text_rows: bool = False):
        """``text_rows``: a transform's feed (transform/feed.py), which reads COPY text rows into
        Arrow; a run's staging, replay and verify take the format's own wire (job.py's
        publisher frames it: registry.binary_rows)."""
        from pipeline.formats.encode import Encoder

        return Encoder(self.format, self.columns, self.run_id, self.tombstone_key,
                       self.schemas, text_rows=text_rows, truncate=self.truncate)


@dataclass(frozen=True)
class RangeStageTask:
    """The built-in sinks' task: read offset ranges exactly with one consumer (``reader``:
    its librdkafka settings, consume.reader_config; ``timeout_seconds``: how long no range
    may move), encode each topic's records by its route (``encodings``: (topic, encoder
    settings) pairs) and stage them. The ranges themselves are the Spark partition's data,
    not part of the spec."""

    target: StagingTarget
    reader: dict[str, Any]
    timeout_seconds: float
    encodings: tuple[tuple[str, EncoderSettings], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "encodings", tuple(sorted(
            (str(t), e) for t, e in self.encodings)))

    def encoding(self, topic: str) -> EncoderSettings:
        """``topic``'s encoder settings (its route's)."""
        for t, e in self.encodings:
            if t == topic:
                return e
        raise KeyError(f"no encoder for topic {topic!r} in the read task's spec")


@dataclass(frozen=True)
class FeedTask:
    """A user transform's input (executor/transform/feed.py): read task ``i`` reads ``tasks[i]``
    exactly as a RangeStageTask would (``reader``, ``timeout_seconds``), decodes them
    (``encoding``, no tombstone key) into the DataFrame the transform receives, and stages
    its dead letters and range summaries in ``target``. ``topic``: the run's one topic,
    left out of the batches (the driver adds it to the DataFrame as a literal: one string
    column less through the JVM); None: every batch has its ``topic`` column. ``batch``:
    messages per consume() call (consume.FEED_BATCH). ``row_bytes_limit``: records whose
    rows average more bytes than this stop the job (a TaskError of kind RESIZE), whose
    Arrow batches are bounded by rows alone (spark/arrow_settings.row_bytes_limit)."""

    target: StagingTarget
    reader: dict[str, Any]
    timeout_seconds: float
    encoding: EncoderSettings
    tasks: tuple[tuple, ...]
    topic: str | None = None
    batch: int = 10_000  # consume.BATCH
    row_bytes_limit: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(tuple(t) for t in self.tasks))


@dataclass(frozen=True)
class LineStageTask:
    """A user transform's output task: its rows' staged ``columns`` ((name, Postgres
    type), in order) as COPY text lines ending with ``run_id`` (executor/transform/arrow_copy.py),
    or with ``binary`` as COPY binary tuples (executor/transform/arrow_binary.py, when the driver
    found every column exact), one blob never across two of ``ranges`` (the read tasks'
    ranges, split_ranges' pieces: the ledger has one row each and counts its rows).
    ``topic``: every row's topic, when the driver proved it (spark/topic_literal.py) and
    left the column out of the rows; None: the rows carry their ``topic`` column."""

    target: StagingTarget
    ranges: tuple = ()
    columns: tuple[tuple[str, str], ...] = ()
    run_id: int = 0
    topic: str | None = None
    binary: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranges", tuple(self.ranges))
        # Plain str: the driver's names are SQLAlchemy's quoted_name (store/tables.py), and
        # unpickling one made every writer worker import SQLAlchemy (~11 MB, ~0.1 CPU-s).
        object.__setattr__(self, "columns", tuple((str(name), str(pg))
                                                  for name, pg in self.columns))
