"""The driver's Postgres: schema checks, the run locks, offsets, run rows, staging tables,
and the statements of the publishing transaction that pipeline/driver/publish.py puts together.

SQLAlchemy Core where it is the well-kept way: the engine (pipeline/driver/database.py),
reflection, and the simple statements on offsets, runs and dead letters. psycopg, on the
same session and in the same transaction, for what Core does not express well: COPY, the
migration scripts, ``INSERT ... SELECT`` merges, ``LIKE``, column compression. Every column
list comes from pipeline/store/tables.py. Nothing here runs on the executors.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import re
import socket
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import (
    ColumnElement,
    Table,
    and_,
    delete,
    exists,
    func,
    inspect,
    literal,
    or_,
    select,
)
from sqlalchemy import update as update_
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.engine import Connection, CursorResult
from sqlalchemy.exc import CompileError, SAWarning
from sqlalchemy.schema import CreateColumn, CreateTable, DropTable

from pipeline.config import Settings, mask  # mask: Spark's error text may quote settings
from pipeline.driver import database
from pipeline.driver.database import db_errors
from pipeline.errors import ConfigError, ConflictError
from pipeline.executor.stage import staging_pattern, staging_table
from pipeline.plan.offsets import OffsetRange, PlannedPartition, TopicPartition
from pipeline.store import tables
from pipeline.store.tables import dead_letters, offsets, runs

log = logging.getLogger(__name__)

# The migrations ship inside the package (pipeline/sql links to the repository's sql/), so a
# wheel installed anywhere applies them; in a checkout the link leads to the same files.
SQL_DIR = importlib.resources.files("pipeline") / "sql"
# What an archive row adds (topic_id, archived_by_run; archived_at defaults), in that order.
_ARCHIVE_ORIGIN = sql.SQL(", ").join(sql.Identifier(c.name) for c in tables.RESULTS_ARCHIVE_COLUMNS
                                     if c.name != "archived_at")
LOCK_CLASS = 7_400_001  # first key of our advisory locks; the second is the pipeline's hash


def in_range(table: Table, r: OffsetRange) -> ColumnElement[bool]:
    """Rows of ``table`` (keyed by topic, partition, offset) inside ``[from, until)``."""
    offset = table.c["offset"]
    return and_(table.c["topic"] == r.topic, table.c["partition"] == r.partition,
                offset >= r.from_offset, offset < r.until_offset)


def migrations() -> list:
    """The schema scripts in the order they apply (sql/NNN_*.sql)."""
    return sorted((p for p in SQL_DIR.iterdir() if p.name.endswith(".sql")),
                  key=lambda p: p.name)


class Store:
    """The driver's one session; it holds the pipeline's run lock while it is open."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.url = settings.database_url
        self.pipeline = settings.name
        self.schema = sql.Identifier(settings.schema)
        self.results = tables.results(settings.sink)
        self.records = tables.record_rows(settings.sink)  # what the executors stage
        self.sink_tables = tables.sink_tables(settings.sink)
        self.engine = database.engine(self.url)
        try:
            with db_errors(self.url):
                connection = self.engine.connect()
        except BaseException:
            self.engine.dispose()
            raise
        # preserve_rowcount: an INSERT's rowcount is read (offsets compare-and-set), and
        # SQLAlchemy keeps it only for UPDATE and DELETE otherwise.
        self._session = connection.execution_options(
            schema_translate_map={tables.SCHEMA: settings.schema}, preserve_rowcount=True)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            # Release the run lock now: closing does not wait for the server to end the
            # session, and a run started right after could still find the lock held.
            self.execute("SELECT pg_advisory_unlock_all()")
        except Exception:  # noqa: BLE001 - a broken connection holds nothing for long
            pass
        try:
            self._session.close()
        except Exception:  # noqa: BLE001
            pass
        self.engine.dispose()  # closes the pooled connections: the sessions end here

    # ---- the session and its transactions ----------------------------------------------
    @property
    def session(self) -> Connection:
        """The SQLAlchemy connection the Store lives on. Never silently replaced: it holds
        the run lock, and SQLAlchemy would reconnect an invalidated one on its next use."""
        if self._session.invalidated or self._session.closed:
            raise database.unreachable(self.url, "the connection was lost")
        return self._session

    @property
    def conn(self) -> psycopg.Connection:
        """The session's psycopg connection: COPY and psycopg-composed SQL."""
        return self.session.connection.driver_connection

    def t(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(self.schema, sql.Identifier(name))

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """Commits on exit, rolls back on any error (including KeyboardInterrupt). Yields
        the psycopg connection; Core statements (``run``) go into the same transaction.
        Inside an open transaction, joins it."""
        session = self.session
        with db_errors(self.url):
            if session.in_transaction():
                yield self.conn
                return
            tx = session.begin()
            try:
                yield self.conn
            except BaseException:
                _roll_back(tx)
                raise
            tx.commit()

    def run(self, statement) -> CursorResult:
        """A Core statement, in the open transaction or in one of its own."""
        with self.transaction():
            return self.session.execute(statement)

    def execute(self, query, params: Sequence[Any] | dict | None = None) -> psycopg.Cursor:
        """A psycopg statement (psycopg.sql, %s parameters), in the open transaction or in
        one of its own."""
        with self.transaction() as conn:
            return conn.execute(query, params)

    def set_timeouts(self, conn) -> None:
        """The configured lock and statement timeouts, for the current transaction only."""
        for name, seconds in (("lock_timeout", self.settings.lock_timeout_seconds),
                              ("statement_timeout", self.settings.statement_timeout_seconds)):
            conn.execute(sql.SQL("SET LOCAL {} = {}").format(
                sql.Identifier(name), sql.Literal(f"{int(seconds * 1000)}ms")))

    # ---- schema ------------------------------------------------------------------------
    def init_db(self) -> list[str]:
        applied = []
        with self.transaction() as conn:
            # Serialize concurrent init-db calls; IF NOT EXISTS alone races.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_CLASS,))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(self.schema))
            for path in migrations():  # scripts: psycopg runs them whole
                conn.execute(path.read_text().replace("{schema}", f'"{self.settings.schema}"'))
                applied.append(path.name)
            for table in self.sink_tables:
                self.session.execute(CreateTable(table, if_not_exists=True))
                applied.append(f"{self.settings.sink.mode} table {self.settings.schema}."
                               f"{table.name}")
        return applied

    def _reflect(self, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The live columns of the tables ``names`` that exist (one catalog query). It takes
        a share lock on each table (pg_get_expr of the defaults): a lock held elsewhere (a
        DBA's ALTER) is waited for as long as the publishing transaction would wait."""
        with self.transaction() as conn, warnings.catch_warnings():
            self.set_timeouts(conn)
            # A column of a type SQLAlchemy does not know (an extension's) is reflected as
            # NullType with a warning; only its nullability and default are looked at.
            warnings.simplefilter("ignore", SAWarning)
            found = inspect(self.session).get_multi_columns(
                schema=self.settings.schema, filter_names=list(names))
        return {name: columns for (_, name), columns in found.items()}

    def check_schema(self) -> None:
        """Every table of pipeline/store/tables.py is there, with every column it declares."""
        fixed = list(tables.metadata.tables.values())
        live = self._reflect([t.name for t in fixed + self.sink_tables])
        if offsets.name not in live or any(t.name not in live for t in self.sink_tables):
            raise ConfigError(f"tables missing in schema {self.settings.schema}: run "
                              f"'pipeline init-db --config {self.settings.source}' first")
        missing = [t.name for t in fixed if t.name not in live] + [
            f"{t.name}.{c.name}" for t in fixed if t.name in live for c in t.columns
            if c.name not in {col["name"] for col in live[t.name]}]
        if missing:
            raise ConfigError(f"schema {self.settings.schema} is older than this version (no "
                              f"{', '.join(missing)}): run 'pipeline init-db --config "
                              f"{self.settings.source}' to upgrade it (keeps all data)")

    def check_results_table(self) -> None:
        """The sink's tables must take the rows this config writes: compared before anything
        is read, so that drift is one clear error, not a COPY that fails after the whole
        read on every run. Extra columns are fine if they may stay NULL or have a default;
        the key must be the mode's (ON CONFLICT needs it)."""
        live = self._reflect([t.name for t in self.sink_tables])
        with self.transaction():
            keys = inspect(self.session).get_multi_pk_constraint(
                schema=self.settings.schema, filter_names=[t.name for t in self.sink_tables])
        for table in self.sink_tables:
            have = {c["name"]: c for c in live.get(table.name, [])}
            key = keys.get((self.settings.schema, table.name), {}).get("constrained_columns", [])
            self._check_table(table, have, key)

    def _check_table(self, table: Table, have: dict[str, dict], key: list[str]) -> None:
        name = f'"{self.settings.schema}"."{table.name}"'
        want_key = [c.name for c in table.primary_key]
        if have and key != want_key:
            mode = self.settings.sink.mode
            raise ConfigError(
                f"table {name} is keyed by ({', '.join(key) or 'nothing'}), sink.mode = "
                f"'{mode}' of {self.settings.source} needs the key ({', '.join(want_key)}): "
                "point sink.table at a new table and run 'pipeline init-db', or rebuild this "
                "one by hand; nothing was read")
        want = tables.written(table)
        fixes = []
        for column in want:
            cname, pg_type = column.name, tables.ddl_type(column.type)
            col = sql.Identifier(cname).as_string(self.conn)
            if cname not in have:
                fixes.append((f"column {cname} is missing", f"ADD COLUMN {col} {pg_type}"))
            elif _type_name(have[cname]["type"]) != pg_type:
                fixes.append((f"column {cname} is {_type_name(have[cname]['type'])}, the "
                              f"config writes {pg_type}", f"ALTER COLUMN {col} TYPE {pg_type}"))
            elif not have[cname]["nullable"] and column.nullable:
                fixes.append((f"column {cname} is NOT NULL, the config allows nulls",
                              f"ALTER COLUMN {col} DROP NOT NULL"))
        written = {c.name for c in want}
        for cname, c in have.items():
            if not c["nullable"] and c["default"] is None and cname not in written:
                fixes.append((f"column {cname} is NOT NULL without a default and the pipeline "
                              "does not write it",
                              f"ALTER COLUMN {sql.Identifier(cname).as_string(self.conn)} "
                              "DROP NOT NULL"))
        if fixes:
            raise ConfigError(
                f"results table {name} does not match [sink] of {self.settings.source}: "
                + "; ".join(why for why, _ in fixes) + f" - run 'ALTER TABLE {name} "
                + ", ".join(fix for _, fix in fixes) + "' or change [sink.columns]; "
                "nothing was read")

    # ---- the run locks -----------------------------------------------------------------
    # Two per pipeline. "ingest" serialises what moves the offsets (scheduled runs); a
    # "backfill" or reprocess, which never moves them, takes its own, so a long backfill
    # runs beside the scheduled ingest instead of making it exit 75 for hours. Both write
    # results idempotently; two runs writing the same offsets at once are told apart by the
    # results table's key (one waits, then conflicts and retries: see db_errors). 'offsets'
    # changes take both.
    FAMILIES = {"ingest": ("ingest",), "backfill": ("backfill", "reprocess"),
                "offsets": ("offsets",)}

    @staticmethod
    def family(kind: str) -> str:
        return "backfill" if kind in ("backfill", "reprocess") else "ingest"

    @classmethod
    def kinds_of(cls, family: str) -> tuple[str, ...]:
        """The kinds of run that may hold ``family``'s lock: its own, and an 'offsets'
        change (it takes both locks)."""
        return cls.FAMILIES[family] + cls.FAMILIES["offsets"]

    def lock_key(self, family: str) -> str:
        return self.pipeline if family == "ingest" else f"{self.pipeline}:{family}"

    def try_lock(self, family: str = "ingest") -> bool:
        """Session advisory lock: one run per pipeline and family at a time."""
        return self.run(select(func.pg_try_advisory_lock(
            LOCK_CLASS, func.hashtext(self.lock_key(family))))).scalar_one()

    def lock_or_fail(self, what: str = "run", families: Sequence[str] = ("ingest",)) -> None:
        for family in families:
            if self.try_lock(family):
                continue
            holder = self.run(
                select(runs.c.run_id, runs.c.kind, runs.c.host, runs.c.pid, runs.c.started_at)
                .where(runs.c.pipeline == self.pipeline, runs.c.status == "running",
                       runs.c.kind.in_(self.kinds_of(family)))
                .order_by(runs.c.run_id.desc()).limit(1)).first()
            who = (f"run {holder[0]} ({holder[1]}, {holder[2]} pid {holder[3]}, started "
                   f"{holder[4]:%Y-%m-%d %H:%M:%S})" if holder else "another process")
            self.execute("SELECT pg_advisory_unlock_all()")  # none of them, then
            raise ConflictError(f"pipeline '{self.pipeline}' is busy: {who} holds its "
                                f"{family} lock; this {what} did nothing - retry when it has "
                                "finished ('pipeline unlock' shows the holder, and frees a "
                                "dead one)")

    # ---- reads -------------------------------------------------------------------------
    def load_offsets(self, topics: Sequence[str] | None = None) -> dict[TopicPartition, int]:
        rows = self.run(select(offsets.c.topic, offsets.c.partition, offsets.c.next_offset)
                        .where(offsets.c.pipeline == self.pipeline)).all()
        return {(t, p): o for t, p, o in rows if topics is None or t in topics}

    def load_topic_ids(self, topics: Sequence[str]) -> dict[str, set[str]]:
        """The Kafka topic IDs the stored offsets of each topic belong to (one, normally;
        rows stored before IDs were have none)."""
        out: dict[str, set[str]] = {}
        for topic, topic_id in self.run(
                select(offsets.c.topic, offsets.c.topic_id).distinct()
                .where(offsets.c.pipeline == self.pipeline, offsets.c.topic.in_(list(topics)),
                       offsets.c.topic_id.is_not(None))).all():
            out.setdefault(topic, set()).add(topic_id)
        return out

    # ---- run rows ----------------------------------------------------------------------
    def start_run(self, kind: str, planned: Sequence[PlannedPartition] | Sequence[OffsetRange],
                  details: dict | None = None) -> int:
        return self.run(insert(runs).values(
            pipeline=self.pipeline, kind=kind, status="running", planned=ranges_json(planned),
            lost=lost_json(planned), host=socket.gethostname(), pid=os.getpid(),
            details=details or {}).returning(runs.c.run_id)).scalar_one()

    def record_noop(self, kind: str, planned: Sequence[PlannedPartition],
                    timings: dict) -> int:
        return self.run(insert(runs).values(
            pipeline=self.pipeline, kind=kind, status="noop", planned=ranges_json(planned),
            finished_at=func.now(), records_read=0, rows_written=0, dead_letters=0,
            timings=timings, exit_code=0, host=socket.gethostname(), pid=os.getpid())
            .returning(runs.c.run_id)).scalar_one()

    def fail_run(self, run_id: int, error: str, exit_code: int, timings: dict) -> None:
        self.run(update_(runs).where(runs.c.run_id == run_id, runs.c.status == "running")
                 .values(status="failed", finished_at=func.now(), error=mask(error),
                         exit_code=exit_code, timings=timings))

    def succeed_run(self, run_id: int, rows_deleted: int = 0, **counts: Any) -> None:
        """The run row of a published run (inside its publishing transaction): records_read,
        rows_written, dead_letters, per_partition, timings; an upsert's deletes go into
        details."""
        extra = {}
        if rows_deleted:
            extra["details"] = func.coalesce(runs.c.details, literal({}, JSONB)).op(
                "||", return_type=JSONB)(literal({"rows_deleted": rows_deleted}, JSONB))
        self.run(update_(runs).where(runs.c.run_id == run_id).values(
            status="succeeded", finished_at=func.now(), exit_code=0, **counts, **extra))

    def abandon_stale_runs(self, families: Sequence[str] = ("ingest",)) -> list[int]:
        """Runs of the families whose locks we hold, left 'running' by a crash (none of them
        is alive): mark them abandoned and drop their staging tables. A staging table of a
        run of another family that is still running is left alone: it is in use."""
        kinds = [k for f in families for k in self.FAMILIES[f]] + (
            list(self.FAMILIES["offsets"]) if "ingest" in families else [])
        mine = and_(runs.c.pipeline == self.pipeline, runs.c.status == "running")
        stale = list(self.run(
            update_(runs).where(mine, runs.c.kind.in_(kinds))
            .values(status="abandoned", finished_at=func.now(), error=func.coalesce(
                runs.c.error, "process died before finishing (crash, kill or lost "
                "connection); nothing was published"))
            .returning(runs.c.run_id)).scalars())
        in_use = {self.staging_name(r) for r in self.run(select(runs.c.run_id).where(mine))
                  .scalars()}
        pattern = re.compile(staging_pattern(self.pipeline))
        with self.transaction():
            names = inspect(self.session).get_table_names(schema=self.settings.schema)
        leftovers = [n for n in names if pattern.search(n) and n not in in_use]
        for name in leftovers:
            self.run(DropTable(tables.staging(name), if_exists=True))
        if stale or leftovers:
            log.info("cleaned up after crashed runs %s (%d staging tables)", stale, len(leftovers))
        return stale

    # ---- staging ----------------------------------------------------------------------
    def staging_name(self, run_id: int) -> str:
        return staging_table(self.pipeline, run_id)

    def create_staging(self, run_id: int) -> str:
        name = self.staging_name(run_id)
        self.run(CreateTable(tables.staging(name)))
        # The blobs are compressed with LZ4 (Postgres >= 14 built with it): 5x smaller
        # staging for the same CPU (1M records: 22 MB instead of 105 MB, write 0.25-0.32 us
        # and read 0.14 us per record either way); without LZ4 they are stored uncompressed
        # (EXTERNAL), as pglz would cost CPU on blobs that are read once and dropped.
        try:
            self.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN blob SET COMPRESSION lz4")
                         .format(self.t(name)))
        except psycopg.Error:
            self.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN blob SET STORAGE EXTERNAL")
                         .format(self.t(name)))
        return name

    def staging_copy(self, run_id: int) -> tuple[str, list[str]]:
        """What an executor needs to stage its blobs (it imports no SQLAlchemy): the binary
        COPY into this run's staging table, and its column types as psycopg names them."""
        table = tables.staging(self.staging_name(run_id))
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            self.t(table.name), _identifiers(c.name for c in table.columns))
        return statement.as_string(self.conn), [tables.ddl_type(c.type) for c in table.columns]

    def drop_staging(self, run_id: int) -> None:
        self.run(DropTable(tables.staging(self.staging_name(run_id)), if_exists=True))

    # ---- parts of the publishing transaction (pipeline/driver/publish.py) ------------------
    def ranges_hold_rows(self, ranges: Sequence[OffsetRange]) -> bool:
        """Does the results table already hold a row inside any planned range? (an index
        probe per range). Only then does publishing need ON CONFLICT."""
        return any(self.run(select(exists().where(in_range(self.results, r)))).scalar_one()
                   for r in ranges)

    def results_hold_rows(self) -> bool:
        """Does the results table hold any row? (an aggregate's totals may be rewound only
        when empty)"""
        return self.run(select(exists().select_from(self.results))).scalar_one()

    def clear_ranges(self, ranges: Sequence[OffsetRange]) -> None:
        """Reprocess replaces what the planned ranges held: a record that was a result and
        is now a dead letter (or is filtered out by a transform) keeps no old row, and no
        offset stays in both tables. Inside the publishing transaction, like the rest."""
        if not ranges:
            return
        # An upsert sink's rows and tombstones of records in the ranges: their keys are
        # derived again from the ranges (a newer record elsewhere is left as it is).
        for table in self.sink_tables:
            self.run(delete(table).where(or_(*(in_range(table, r) for r in ranges))))
        self.run(delete(dead_letters).where(
            dead_letters.c.pipeline == self.pipeline,
            or_(*(in_range(dead_letters, r) for r in ranges))))

    def merge_dead_letters_sql(self, source: str, overwrite: bool) -> sql.Composed:
        """The staged dead letters of a run (in temp table ``source``) into
        pipeline_dead_letters: kept if already there, replaced on reprocess."""
        return sql.SQL(
            "INSERT INTO {dl} (pipeline, {cols}, run_id) SELECT DISTINCT ON ({key}) "
            "%s, {cols}, %s FROM {src} ON CONFLICT (pipeline, {key}) DO {action}").format(
            dl=self.t(dead_letters.name), src=sql.Identifier(source),
            cols=_identifiers(c.name for c in tables.DEAD_LETTER_FIELDS),
            key=_identifiers(c.name for c in dead_letters.primary_key if c.name != "pipeline"),
            action=sql.SQL("UPDATE SET error_type = EXCLUDED.error_type, error_message "
                           "= EXCLUDED.error_message, run_id = EXCLUDED.run_id, "
                           "failed_at = now()") if overwrite else sql.SQL("NOTHING"))

    def compare_and_set_offsets(self, run_id: int, updates: Sequence[PlannedPartition],
                                topic_ids: dict[str, str] | None = None) -> None:
        """Invariant 2: move each offset only from the value the plan started from. A stale
        plan, a zombie or a concurrent run matches no row, and the whole transaction rolls
        back."""
        for u in updates:
            r = u.range
            topic_id = (topic_ids or {}).get(r.topic)
            if u.stored is None:
                n = self.run(insert(offsets).values(
                    pipeline=self.pipeline, topic=r.topic, partition=r.partition,
                    next_offset=r.until_offset, run_id=run_id, topic_id=topic_id)
                    .on_conflict_do_nothing()).rowcount
            else:
                # The plan checked the stored ID against Kafka's; a legacy row gets it here.
                n = self.run(update_(offsets).where(
                    offsets.c.pipeline == self.pipeline, offsets.c.topic == r.topic,
                    offsets.c.partition == r.partition, offsets.c.next_offset == u.stored)
                    .values(next_offset=r.until_offset, updated_at=func.now(), run_id=run_id,
                            topic_id=func.coalesce(topic_id, offsets.c.topic_id))).rowcount
            if n != 1:
                current = self.run(select(offsets.c.next_offset).where(
                    offsets.c.pipeline == self.pipeline, offsets.c.topic == r.topic,
                    offsets.c.partition == r.partition)).scalar()
                raise ConflictError(
                    f"{r.topic}[{r.partition}]: stored next offset is "
                    f"{'absent' if current is None else current}, expected "
                    f"{'absent' if u.stored is None else u.stored}: another run already "
                    f"published [{r.from_offset}, {r.until_offset}); rolled back, nothing "
                    "written twice - rerun to plan from the stored offsets")

    # ---- offsets admin (used by ops commands) -------------------------------------------
    def set_offsets(self, changes: dict[TopicPartition, int | None], run_id: int,
                    topic_ids: dict[str, str] | None = None,
                    archive: dict[str, list[str]] | None = None) -> dict[str, dict[str, int]]:
        """Set (or, for None, forget) stored offsets, with their topic's Kafka ID, and mark
        the run that records the change succeeded: one transaction, so a failure half-way
        changes nothing. ``archive``: topics recreated under the same name (old IDs) whose
        result rows and dead letters move to the archive tables in the same transaction,
        so the new topic's records at reused offsets are written, not taken as present."""
        archived = {}
        with self.transaction() as conn:
            self.set_timeouts(conn)
            for topic, old_ids in sorted((archive or {}).items()):
                archived[topic] = self._archive_topic(conn, topic, ", ".join(old_ids), run_id)
            for (topic, partition), offset in sorted(changes.items()):
                if offset is None:
                    self.run(delete(offsets).where(
                        offsets.c.pipeline == self.pipeline, offsets.c.topic == topic,
                        offsets.c.partition == partition))
                    continue
                row = insert(offsets).values(
                    pipeline=self.pipeline, topic=topic, partition=partition,
                    next_offset=offset, run_id=run_id, topic_id=(topic_ids or {}).get(topic))
                self.run(row.on_conflict_do_update(
                    index_elements=list(offsets.primary_key), set_={
                        "next_offset": row.excluded.next_offset, "updated_at": func.now(),
                        "run_id": row.excluded.run_id, "topic_id": row.excluded.topic_id}))
            self.run(update_(runs).where(runs.c.run_id == run_id).values(
                status="succeeded", finished_at=func.now(), exit_code=0,
                details=func.coalesce(runs.c.details, literal({}, JSONB)).op(
                    "||", return_type=JSONB)(
                    literal({"archived": archived} if archived else {}, JSONB))))
        return archived

    def archive_table(self) -> str:
        return f"{self.settings.sink.table}_archived"

    def _archive_topic(self, conn, topic: str, old_id: str, run_id: int) -> dict[str, int]:
        """Move a recreated topic's result rows and dead letters to the archive tables. An
        aggregate sink's totals stay (they count the old topic's records, which were read
        once); an upsert sink's tombstones of the old topic are dropped (their offsets are
        the old topic's, and would hide the new topic's records)."""
        rows = 0
        if self.settings.sink.mode != "aggregate":
            rows = self._archive_results(conn, topic, old_id, run_id)
        if self.settings.sink.mode == "upsert":
            gone = tables.deleted(self.settings.sink)
            conn.execute(sql.SQL("DELETE FROM {} WHERE topic = %s").format(self.t(gone.name)),
                         (topic,))
        dcols = _identifiers(c.name for c in dead_letters.columns)
        dead_rows = conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {dl} WHERE pipeline = %s AND topic = %s "
            "RETURNING {cols}) INSERT INTO {arc} ({cols}, {arc_cols}) "
            "SELECT {cols}, %s, %s FROM moved").format(
            dl=self.t(dead_letters.name), arc=self.t(tables.dead_letters_archived.name),
            cols=dcols, arc_cols=_ARCHIVE_ORIGIN), (self.pipeline, topic, old_id, run_id)
        ).rowcount
        log.warning("topic '%s' was recreated: archived %d result rows to %s and %d dead "
                    "letters to pipeline_dead_letters_archived (old topic ID %s)", topic, rows,
                    self.archive_table(), dead_rows, old_id)
        return {"topic_id": old_id, "rows": rows, "dead_letters": dead_rows}

    def _archive_results(self, conn, topic: str, old_id: str, run_id: int) -> int:
        results = self.t(self.settings.sink.table)
        archive = self.t(self.archive_table())
        # The live columns, in Postgres's own spelling (they may include columns added by
        # hand, of any type): the archive takes each of them.
        columns = [(name, ftype) for name, ftype in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
            "attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f'"{self.settings.schema}"."{self.settings.sink.table}"',)).fetchall()]
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS)")
                     .format(archive, results))
        # A column added to the results table since the archive was created is added here.
        conn.execute(sql.SQL("ALTER TABLE {} {}").format(archive, sql.SQL(", ").join(
            [sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(n), sql.SQL(t))
             for n, t in columns] + [
                sql.SQL("ADD COLUMN IF NOT EXISTS {}").format(sql.SQL(str(
                    CreateColumn(c).compile(dialect=self.session.dialect))))
                for c in tables.RESULTS_ARCHIVE_COLUMNS])))
        cols = _identifiers(n for n, _ in columns)
        return conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {res} WHERE topic = %s RETURNING {cols}) "
            "INSERT INTO {arc} ({cols}, {arc_cols}) SELECT {cols}, %s, %s FROM moved").format(
            res=results, arc=archive, cols=cols, arc_cols=_ARCHIVE_ORIGIN),
            (topic, old_id, run_id)).rowcount

    # ==== queries of the operator commands (pipeline/commands/) ==========================
    # What lag, offsets show, runs and unlock read (and unlock's one write), so that the
    # commands speak no SQL themselves.

    RUN_COLUMNS = ("run_id", "kind", "status", "started_at", "finished_at", "planned", "lost",
                   "records_read", "rows_written", "dead_letters", "per_partition", "timings",
                   "error", "exit_code", "host", "pid", "details")

    def offset_rows(self) -> list[dict[str, Any]]:
        """pipeline_offsets of this pipeline, with the run that last moved each offset."""
        o, r = offsets, runs
        return [dict(row._mapping) for row in self.run(
            select(o.c.topic, o.c.partition, o.c.next_offset, o.c.topic_id, o.c.updated_at,
                   o.c.run_id, r.c.kind.label("run_kind"),
                   r.c.finished_at.label("run_finished_at"))
            .select_from(o.outerjoin(r, r.c.run_id == o.c.run_id))
            .where(o.c.pipeline == self.pipeline).order_by(o.c.topic, o.c.partition))]

    def last_success(self, kind: str = "ingest") -> dict[str, Any] | None:
        """The newest run of ``kind`` that succeeded (a noop counts: it found nothing new)."""
        row = self.run(
            select(runs.c.run_id, runs.c.status, runs.c.finished_at)
            .where(runs.c.pipeline == self.pipeline, runs.c.kind == kind,
                   runs.c.status.in_(("succeeded", "noop")))
            .order_by(runs.c.run_id.desc()).limit(1)).first()
        return None if row is None else dict(row._mapping)

    def list_runs(self, last: int = 20, status: str | None = None,
                  kind: str | None = None) -> list[dict[str, Any]]:
        """The newest ``last`` run rows (every column), optionally of one status and kind."""
        query = (select(*(runs.c[name] for name in self.RUN_COLUMNS))
                 .where(runs.c.pipeline == self.pipeline)
                 .order_by(runs.c.run_id.desc()).limit(last))
        if status:
            query = query.where(runs.c.status == status)
        if kind:
            query = query.where(runs.c.kind == kind)
        return [dict(row._mapping) for row in self.run(query)]

    def lock_session(self, family: str) -> dict[str, Any] | None:
        """The Postgres session holding this pipeline's ``family`` lock, if any. (Catalog
        views, not our tables: plain SQL.)"""
        row = self.execute(
            "SELECT a.pid, a.application_name, coalesce(host(a.client_addr) || ':' || "
            "a.client_port, 'local socket'), a.backend_start, coalesce(a.state, 'unknown'), "
            "a.state_change FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND l.classid = %s::oid AND l.objid = hashtext(%s)::oid AND l.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_CLASS, self.lock_key(family))).fetchone()
        names = ["session_pid", "application", "client", "session_started", "state",
                 "state_since"]
        return None if row is None else dict(zip(names, row, strict=True))

    def running_run(self, kinds: Sequence[str]) -> dict[str, Any] | None:
        """The newest run of one of ``kinds`` still marked running."""
        row = self.run(
            select(runs.c.run_id, runs.c.kind, runs.c.host, runs.c.pid, runs.c.started_at)
            .where(runs.c.pipeline == self.pipeline, runs.c.status == "running",
                   runs.c.kind.in_(list(kinds)))
            .order_by(runs.c.run_id.desc()).limit(1)).first()
        return None if row is None else dict(row._mapping)

    def end_session(self, session_pid: int) -> bool:
        """Terminate a Postgres session (waits up to 10 s for it to go); False if it did not."""
        return self.run(select(func.pg_terminate_backend(session_pid, 10000))).scalar_one()

    # ==== end of the operator commands' queries =========================================


def _roll_back(tx) -> None:
    """Roll back, keeping the error that caused it: a rollback on a connection that is gone
    fails too, and the server has rolled back already."""
    try:
        tx.rollback()
    except Exception:  # noqa: BLE001
        log.debug("rollback failed (the connection is gone)", exc_info=True)


def _type_name(type_) -> str:
    """A reflected column type as Postgres DDL spells it (tables.ddl_type)."""
    try:
        return tables.ddl_type(type_)
    except CompileError:  # NullType: a type SQLAlchemy does not know
        return "a type unknown to the pipeline"


def _identifiers(names) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, names))


def _key(table: Table) -> sql.Composed:
    return _identifiers(c.name for c in table.primary_key)


def ranges_json(planned) -> list[dict]:
    out = []
    for p in planned:
        r = p.range if isinstance(p, PlannedPartition) else p
        out.append({"topic": r.topic, "partition": r.partition, "from": r.from_offset,
                    "until": r.until_offset})
    return out


def lost_json(planned) -> list[dict]:
    return [{"topic": p.lost.topic, "partition": p.lost.partition, "from": p.lost.from_offset,
             "until": p.lost.until_offset}
            for p in planned if isinstance(p, PlannedPartition) and p.lost]
