"""The columns of every table the pipeline writes, in one place: SQLAlchemy ``Table``s.

The fixed tables (offsets, runs, dead letters and their archive), the record rows a run
stages (from ``[sink]``; each mode's own tables are in pipeline/sinks/) and a run's staging
table. The DDL the driver emits, the COPY column
lists, the dead-letter fields the executors stage, and the schema checks are derived from
these. ``sql/*.sql`` stays the applied history that ``init-db`` runs;
tests/integration/test_tables.py reflects a freshly initialised database and compares it
with these definitions, so the two cannot drift apart silently.

Every table is declared in the placeholder schema ``SCHEMA``; the driver's session maps it
onto ``database.schema`` (``schema_translate_map``), so one definition serves every
pipeline, and a statement that escaped the mapping fails instead of writing elsewhere.
Nothing here runs on the executors (they get column lists and COPY statements as strings).
"""

from __future__ import annotations

import re

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Date,
    Index,
    Integer,
    MetaData,
    Numeric,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import BYTEA, DOUBLE_PRECISION, JSONB, TIMESTAMP
from sqlalchemy.types import TypeEngine

from pipeline.config import SinkSettings
from pipeline.formats.types import SCALARS, column_type

SCHEMA = "pipeline_schema"  # replaced by database.schema on the driver's session
UNAVAILABLE = "_unavailable"  # a staged change event's columns it left out (text[])
# A staged change event's old key (a primary-key change's create: the key it had), one
# column per key column: ``_oldkey_<key column>`` (formats/debezium/old_key.py).
OLD_KEY = "_oldkey_"
TIMESTAMPTZ = TIMESTAMP(timezone=True)
_DIALECT = postgresql.dialect()

metadata = MetaData(schema=SCHEMA)


def _key(name: str, type_: TypeEngine) -> Column:
    """A primary-key column; never a serial (SQLAlchemy would make a lone integer one)."""
    return Column(name, type_, primary_key=True, autoincrement=False)


# The source of truth for where each pipeline resumes: the NEXT offset to read (sql/001, 004).
offsets = Table(
    "pipeline_offsets", metadata,
    _key("pipeline", Text), _key("topic", Text), _key("partition", Integer),
    Column("next_offset", BigInteger, CheckConstraint("next_offset >= 0"), nullable=False),
    Column("updated_at", TIMESTAMPTZ, nullable=False, server_default=func.now()),
    Column("run_id", BigInteger),
    Column("topic_id", Text),
)

# One row per run: what it planned, read and wrote, its timings, how it ended (sql/002).
runs = Table(
    "pipeline_runs", metadata,
    Column("run_id", BigInteger, primary_key=True),  # bigserial
    Column("pipeline", Text, nullable=False),
    Column("kind", Text, nullable=False),  # ingest | backfill | reprocess | offsets | replay
    Column("status", Text, nullable=False),  # running | succeeded | noop | failed | abandoned
    Column("started_at", TIMESTAMPTZ, nullable=False, server_default=func.now()),
    Column("finished_at", TIMESTAMPTZ),
    Column("planned", JSONB, nullable=False, server_default=text("'[]'")),
    Column("lost", JSONB, nullable=False, server_default=text("'[]'")),
    Column("records_read", BigInteger),
    Column("rows_written", BigInteger),
    Column("dead_letters", BigInteger),
    Column("per_partition", JSONB),
    Column("timings", JSONB),
    Column("error", Text),
    Column("exit_code", Integer),
    Column("host", Text),
    Column("pid", Integer),
    Column("details", JSONB),
)
Index("pipeline_runs_by_pipeline", runs.c.pipeline, runs.c.run_id.desc())

# Records that could not become result rows, published with their run's results (sql/003).
dead_letters = Table(
    "pipeline_dead_letters", metadata,
    _key("pipeline", Text), _key("topic", Text), _key("partition", Integer),
    _key("offset", BigInteger),
    Column("key", BYTEA),
    Column("value", BYTEA),
    Column("headers", JSONB),
    Column("kafka_timestamp", TIMESTAMPTZ),
    Column("error_type", Text, nullable=False),
    Column("error_message", Text, nullable=False),
    Column("run_id", BigInteger, nullable=False),
    Column("failed_at", TIMESTAMPTZ, nullable=False, server_default=func.now()),
)
# The ledger of published ranges: one row per read task's range of a run, written in the
# publishing transaction (sql/006; store/ledger.py, driver/ledger_check.py).
ranges = Table(
    "pipeline_ranges", metadata,
    _key("pipeline", Text), Column("run_id", BigInteger, primary_key=True,
                                   autoincrement=False),
    _key("topic", Text), _key("partition", Integer), _key("from_offset", BigInteger),
    Column("until_offset", BigInteger, nullable=False),
    Column("records", BigInteger, nullable=False),
    Column("rows_written", BigInteger, nullable=False),
    Column("dead_letters", BigInteger, nullable=False),
    Column("deletes", BigInteger, nullable=False),
    Column("skipped", BigInteger, nullable=False),
    Column("content_hash", BYTEA, nullable=False),
    Column("published_at", TIMESTAMPTZ, nullable=False, server_default=func.now()),
    # sql/007: a transform's filtered records, and which hash content_hash is.
    Column("filtered", BigInteger, nullable=False, server_default="0"),
    Column("hash_kind", Text, nullable=False, server_default="blake2b"),
)
Index("pipeline_ranges_by_partition", ranges.c.pipeline, ranges.c.topic,
      ranges.c.partition, ranges.c.from_offset)

# The source transactions published whole ([sink] transactions), pruned by age (sql/008;
# store/source_transactions.py).
source_transactions = Table(
    "pipeline_source_transactions", metadata,
    _key("pipeline", Text), _key("tx", Text),
    Column("run_id", BigInteger, nullable=False),
    Column("published_at", TIMESTAMPTZ, nullable=False, server_default=func.now()),
)
Index("pipeline_source_transactions_by_age", source_transactions.c.pipeline,
      source_transactions.c.published_at)

# What an executor stages of a dead letter, in this order (encode.Encoder.dead_line and
# stage.dead_head write it): the publisher adds pipeline and run_id, failed_at is defaulted.
DEAD_LETTER_FIELDS = [c for c in dead_letters.columns
                      if c.name not in ("pipeline", "run_id", "failed_at")]


def dead_letter_batch(name: str) -> Table:
    """A temp table (dropped at COMMIT) that takes a run's staged dead-letter lines. No
    schema: temporary tables live in the session's own."""
    return Table(name, MetaData(), *[Column(c.name, c.type) for c in DEAD_LETTER_FIELDS],
                 prefixes=["TEMPORARY"], postgresql_on_commit="DROP")


def _archive_columns() -> list[Column]:
    """Where an archived row came from ('pipeline offsets reset' of a recreated topic)."""
    return [Column("topic_id", Text),
            Column("archived_at", TIMESTAMPTZ, nullable=False, server_default=func.now()),
            Column("archived_by_run", BigInteger)]


def _like(table: Table) -> list[Column]:
    """What ``LIKE table INCLUDING DEFAULTS`` copies: columns, NOT NULLs, defaults; no key."""
    return [Column(c.name, c.type, nullable=c.nullable,
                   server_default=c.server_default.arg if c.server_default is not None else None)
            for c in table.columns]


dead_letters_archived = Table("pipeline_dead_letters_archived", metadata,
                              *_like(dead_letters), *_archive_columns())
# Dead letters 'pipeline dead-letters replay' turned into rows, moved in its transaction
# (sql/005).
dead_letters_replayed = Table(
    "pipeline_dead_letters_replayed", metadata, *_like(dead_letters),
    Column("replayed_run_id", BigInteger, nullable=False),
    Column("replayed_at", TIMESTAMPTZ, nullable=False, server_default=func.now()))
# Created on first use (store/archive.py) from the live results table, so only its extra
# columns are declared here.
RESULTS_ARCHIVE_COLUMNS = _archive_columns()


# ---- a pipeline's results table, from [sink] ---------------------------------------------
# The SQLAlchemy type of each Postgres type of the column-type registry (formats/types.py).
_POSTGRES_TYPES = {"text": Text, "bigint": BigInteger, "integer": Integer,
                   "double precision": DOUBLE_PRECISION, "boolean": Boolean,
                   "timestamp with time zone": lambda: TIMESTAMPTZ, "date": Date,
                   "jsonb": JSONB, "numeric": Numeric}


def sink_type(declared: str) -> TypeEngine:
    """The Postgres type of a [sink.columns] type (config.COLUMN_TYPE, without 'not null'),
    from its entry in the column-type registry."""
    t = column_type(declared)
    if t.element is not None:  # array<T>: T[]
        return postgresql.ARRAY(sink_type(t.element.declared))
    if t.precision is not None:
        return Numeric(t.precision, t.scale)
    return _POSTGRES_TYPES[t.pg]()


def declared_type(ddl: str) -> str | None:
    """The [sink.columns] type whose column is of Postgres type ``ddl`` (as ddl_type spells
    it: 'numeric(14,2)', 'text[]'), or None for a type the pipeline does not write."""
    for declared in (*SCALARS, "jsonb"):
        if ddl_type(sink_type(declared)) == ddl:
            return declared
    if ddl.endswith("[]"):
        element = declared_type(ddl[:-2])
        return f"array<{element}>" if element and column_type(element).scalar else None
    m = re.fullmatch(r"numeric\((\d+),(\d+)\)", ddl)
    if m is None:
        return None
    try:
        return column_type(f"decimal({m[1]},{m[2]})").declared
    except KeyError:  # wider than decimal(p,s) declares
        return None


def record_rows(sink: SinkSettings, name: str = "record_rows") -> Table:
    """One row per record, keyed by its coordinates: what the executors stage (in this
    column order, run_id last) whatever the mode, and an append sink's results table
    (each mode's results table: pipeline/sinks/). The
    raw format keeps the record as it is, the JSON format the declared columns."""
    if sink.format == "raw":
        body = [Column("key", BYTEA), Column("value", BYTEA), Column("headers", JSONB),
                Column("kafka_timestamp", TIMESTAMPTZ)]
    else:
        body = [Column("kafka_timestamp", TIMESTAMPTZ)] + [
            Column(c.name, sink_type(c.type), nullable=not c.required) for c in sink.columns]
    if sink.envelope == "debezium":  # the columns a change left out (formats/debezium/)
        body.append(Column(UNAVAILABLE, postgresql.ARRAY(Text)))
        body += old_key_columns(sink)
    return Table(
        name, MetaData(schema=SCHEMA),
        _key("topic", Text), _key("partition", Integer), _key("offset", BigInteger), *body,
        Column("run_id", BigInteger, nullable=False),
        Column("ingested_at", TIMESTAMPTZ, nullable=False, server_default=func.now()))


def old_key_columns(sink: SinkSettings) -> list[Column]:
    """A staged change event's old key (``OLD_KEY``), typed as the key columns: NULL but
    for a primary-key change's create that left a column out."""
    declared = {c.name: c.type for c in sink.columns}
    return [Column(OLD_KEY + k, sink_type(declared[k])) for k in sink.key]


def business_key(sink: SinkSettings) -> list[Column]:
    """The key columns (an upsert's key, an aggregate's group_by), typed as declared."""
    declared = {c.name: c.type for c in sink.columns}
    return [_key(k, sink_type(declared[k])) for k in sink.key]


def aggregate_type(a, declared) -> TypeEngine:
    """count: bigint; min/max: the column's type; sum: the registry's sum type (bigint of
    integers, double of doubles, numeric(38, s) of decimal(p, s): a sum outgrows p;
    numeric of decimal)."""
    if a.function == "count":
        return BigInteger()
    kind = declared[a.of].type
    if a.function == "sum":
        return sink_type(column_type(kind).sum)
    return sink_type(kind)


def record_batch(sink: SinkSettings, name: str) -> Table:
    """A temp table (dropped at COMMIT) that takes a run's staged rows before they are
    merged (pipeline/sinks/): ``record_rows`` without constraints, and for an upsert sink
    whose tombstones delete, ``_tombstone`` (its tombstone lines end in 't')."""
    rows = record_rows(sink)
    return Table(name, MetaData(), *[Column(c.name, c.type) for c in written(rows)],
                 *([Column("_tombstone", Boolean, nullable=False, server_default=text("false"))]
                   if sink.deletes else []),
                 prefixes=["TEMPORARY"], postgresql_on_commit="DROP")


def tombstone_columns(sink: SinkSettings) -> list[str]:
    """What a tombstone line holds, in order (encode.Encoder); a line whose key fields are
    all NULL deletes every key (a Debezium truncate, sinks/upsert.py)."""
    return ["topic", "partition", "offset", "kafka_timestamp", *sink.key, "run_id",
            "_tombstone"]


def written(table: Table) -> list[Column]:
    """The columns a run writes into a table, in COPY order (the pipeline's ingested_at,
    updated_at and deleted_at are defaulted: by their server default, not their name, so
    a declared column called updated_at is written): for ``record_rows``, the executors'
    lines (encode.py, executor/transform/arrow_copy.py), which end with run_id."""
    return [c for c in table.columns if c.server_default is None]


def from_record(table: Table) -> list[Column]:
    """The columns a record's values fill (written, but for run_id), in COPY order."""
    return [c for c in written(table) if c.name != "run_id"]


# ---- a run's staging table (executor/stage.py writes it, driver/publish.py reads it) ----
def staging(name: str) -> Table:
    """UNLOGGED, keyless, one row per batch of records and kind (a blob of COPY rows). A
    blob's writer is its task attempt: ``task`` is Spark's taskAttemptId, unique in the
    SparkContext. (part, attempt) is not: Spark numbers task attempts from 0 again when it
    resubmits a stage, and PySpark does not expose the stage attempt."""
    return Table(
        name, MetaData(schema=SCHEMA),
        Column("part", Integer), Column("attempt", Integer), Column("task", BigInteger),
        Column("seq", Integer),
        Column("topic", Text), Column("partition", Integer), Column("kind", Text),
        Column("n", Integer), Column("min_offset", BigInteger), Column("max_offset", BigInteger),
        Column("blob", BYTEA),
        prefixes=["UNLOGGED"])


# ---- names -------------------------------------------------------------------------------
def ddl_type(type_: TypeEngine) -> str:
    """A type as Postgres DDL takes it: 'numeric(12,2)', 'timestamp with time zone'."""
    return type_.compile(dialect=_DIALECT).lower().replace(", ", ",")


def typed(columns) -> list[tuple[str, str]]:
    """(name, ddl_type) of columns: what Spark's COPY-text expressions are built from."""
    return [(c.name, ddl_type(c.type)) for c in columns]
