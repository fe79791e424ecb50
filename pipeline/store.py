"""Postgres: schema, the run lock, offsets, run rows, staging tables, and the parts of the
publishing transaction that pipeline/publish.py puts together."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from pipeline.config import Settings, SinkSettings
from pipeline.errors import ConfigError, ConflictError, PipelineError, TransientError
from pipeline.offsets import OffsetRange, PlannedPartition, TopicPartition
from pipeline.stage import STAGING_DDL, staging_pattern, staging_table

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
LOCK_CLASS = 7_400_001  # first key of our advisory locks; the second is the pipeline's hash

# The dead-letter columns (besides pipeline and run_id) with their Postgres types.
DEAD_LETTER_TYPES = [("topic", "text"), ("partition", "integer"), ("offset", "bigint"),
                     ("key", "bytea"), ("value", "bytea"), ("headers", "jsonb"),
                     ("kafka_timestamp", "timestamptz"), ("error_type", "text"),
                     ("error_message", "text")]
DEAD_COLUMNS = [n for n, _ in DEAD_LETTER_TYPES]


def result_columns(sink: SinkSettings) -> list[tuple[str, str]]:
    """(name, Postgres type) of the results table, in order."""
    head = [("topic", "text NOT NULL"), ("partition", "integer NOT NULL"),
            ("offset", "bigint NOT NULL")]
    if sink.format == "raw":
        body = [("key", "bytea"), ("value", "bytea"), ("headers", "jsonb"),
                ("kafka_timestamp", "timestamptz")]
    else:
        body = [("kafka_timestamp", "timestamptz")] + [
            (c.name, c.pg_type + (" NOT NULL" if c.required else "")) for c in sink.columns]
    return head + body


# Connection failures that no retry fixes: the server refused our role or password, or the
# TLS settings on either side do not fit (libpq's and the server's own words).
_REFUSED = re.compile(
    r"password authentication failed|authentication failed for user|pg_hba\.conf|"
    r"password is required|no password supplied|role \"[^\"]*\" does not exist|"
    r"certificate verify failed|root certificate file|certificate .* does not match host|"
    r"server does not support SSL|invalid sslmode", re.I)


def _connect_error(url: str, e: Exception, connecting: bool = False) -> PipelineError:
    """Unreachable (transient), or, when ``connecting``, refused (permanent)."""
    from pipeline.config import redact_url

    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if connecting and (_REFUSED.search(str(e))
                       or (getattr(e, "sqlstate", None) or "").startswith("28")):
        user = make_url(url).username or "the default user"
        detail = " ".join(str(e).split())
        detail = detail[detail.find("FATAL:"):] if "FATAL:" in detail else detail
        text = str(e).lower()
        fix = ("point sslrootcert in database.url at the CA that signed the server's "
               "certificate (verify-full also checks its host name)"
               if "certificate" in text or "ssl" in text and "pg_hba" not in text else
               "connect as the server's pg_hba.conf allows this role (e.g. sslmode=verify-full"
               " for a hostssl-only role) or change pg_hba.conf" if "pg_hba" in text else
               f"fix the password of '{user}' in database.url / PIPELINE_DATABASE_URL (or "
               "ALTER ROLE ... PASSWORD on the server)")
        return ConfigError(f"Postgres at {redact_url(url)} refused role '{user}': "
                           f"{detail[:300]}; {fix}; not retried")
    return TransientError(f"Postgres unreachable at {redact_url(url)} ({first}); "
                          "check the server and database.url / PIPELINE_DATABASE_URL, then retry")


# The driver's connections live as long as a run, idle while Spark reads, and one holds
# the run lock: keepalives on both ends. The client's keep a NAT or firewall from dropping
# an idle connection; the server's (and tcp_user_timeout) end the session of a driver
# host that vanished within about a minute and a half, instead of the kernel's two hours
# during which every run of the pipeline would exit 75 on its lock.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
               "keepalives_count": 5}
_SESSION = ("-c TimeZone=UTC -c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 "
            "-c tcp_keepalives_count=5 -c tcp_user_timeout=60000")


def connect(url: str, **kwargs: Any) -> psycopg.Connection:
    try:
        return psycopg.connect(url, **{"connect_timeout": 10, "options": _SESSION,
                                       "application_name": "kafka-offset-pipeline",
                                       **_KEEPALIVES, **kwargs})
    except psycopg.OperationalError as e:
        raise _connect_error(url, e, connecting=True) from None


@contextmanager
def db_errors(url: str) -> Iterator[None]:
    """Sorts database failures: a lost connection is transient, anything else a bug."""
    try:
        yield
    except PipelineError:
        raise
    except (psycopg.errors.UniqueViolation, psycopg.errors.DeadlockDetected) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConflictError(
            f"another run (a backfill beside the ingest) published rows of the same offsets "
            f"first ({first}); rolled back, nothing written twice - rerun: it keeps those rows "
            "and adds the rest") from None
    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as e:
        from pipeline.config import redact_url

        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TransientError(
            f"Postgres at {redact_url(url)} cancelled the run's statement ({first}): a lock "
            "held by another session past database.lock_timeout_seconds, a statement longer "
            "than database.statement_timeout_seconds, or an operator; nothing committed - "
            "retry (see pg_locks / pg_stat_activity), or raise the timeout") from None
    except (psycopg.OperationalError, psycopg.errors.AdminShutdown) as e:
        raise _connect_error(url, e) from None


class Store:
    """The driver's one connection; it holds the pipeline's run lock while it is open."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.url = settings.database_url
        self.pipeline = settings.name
        self.schema = sql.Identifier(settings.schema)
        self.conn = connect(self.url, autocommit=True)

    def close(self) -> None:
        try:
            # Release the run lock now: closing does not wait for the server to end the
            # session, and a run started right after could still find the lock held.
            self.conn.execute("SELECT pg_advisory_unlock_all()")
        except Exception:  # noqa: BLE001 - a broken connection holds nothing for long
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass

    def t(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(self.schema, sql.Identifier(name))

    def execute(self, query, params: Sequence[Any] | dict | None = None):
        with db_errors(self.url):
            return self.conn.execute(query, params)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """Commits on exit, rolls back on any error (including KeyboardInterrupt)."""
        with db_errors(self.url), self.conn.transaction():
            yield self.conn

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
            for path in sorted(SQL_DIR.glob("*.sql")):
                conn.execute(path.read_text().replace("{schema}", f'"{self.settings.schema}"'))
                applied.append(path.name)
            conn.execute(self.results_ddl())
            applied.append(f"results table {self.settings.schema}.{self.settings.sink.table}")
        return applied

    def results_ddl(self) -> sql.Composed:
        cols = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
                for n, t in result_columns(self.settings.sink)]
        cols += [sql.SQL("run_id bigint NOT NULL"),
                 sql.SQL("ingested_at timestamptz NOT NULL DEFAULT now()"),
                 sql.SQL('PRIMARY KEY (topic, "partition", "offset")')]
        return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self.t(self.settings.sink.table), sql.SQL(", ").join(cols))

    def check_schema(self) -> None:
        offsets = f'"{self.settings.schema}".pipeline_offsets'
        row = self.execute(
            "SELECT to_regclass(%s), to_regclass(%s), EXISTS (SELECT 1 FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attname = 'topic_id' AND NOT attisdropped)",
            (offsets, f'"{self.settings.schema}"."{self.settings.sink.table}"',
             offsets)).fetchone()
        if row[0] is None or row[1] is None:
            raise ConfigError(f"tables missing in schema {self.settings.schema}: run "
                              f"'pipeline init-db --config {self.settings.source}' first")
        if not row[2]:
            raise ConfigError(f"schema {self.settings.schema} is older than this version "
                              f"(no topic IDs): run 'pipeline init-db --config "
                              f"{self.settings.source}' to upgrade it (keeps all data)")

    def check_results_table(self) -> None:
        """The results table must take the rows this config writes: compared before anything
        is read, so that drift is one clear error, not a COPY that fails after the whole
        read on every run. Extra columns are fine if they may stay NULL or have a default."""
        table = f'"{self.settings.schema}"."{self.settings.sink.table}"'
        have = {name: (ftype, notnull, hasdef) for name, ftype, notnull, hasdef in self.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, atthasdef "
            "FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
            "AND NOT attisdropped", (table,)).fetchall()}
        want = result_columns(self.settings.sink) + [("run_id", "bigint NOT NULL")]
        fixes = []
        for name, declared in want:
            pg_type = declared.replace(" NOT NULL", "")
            col = sql.Identifier(name).as_string(self.conn)
            if name not in have:
                fixes.append((f"column {name} is missing",
                              f"ADD COLUMN {col} {pg_type}"))
            elif _same_type(have[name][0]) != _same_type(pg_type):
                fixes.append((f"column {name} is {have[name][0]}, the config writes {pg_type}",
                              f"ALTER COLUMN {col} TYPE {pg_type}"))
            elif have[name][1] and not declared.endswith("NOT NULL"):
                fixes.append((f"column {name} is NOT NULL, the config allows nulls",
                              f"ALTER COLUMN {col} DROP NOT NULL"))
        written = {name for name, _ in want}
        for name, (_, notnull, hasdef) in have.items():
            if notnull and not hasdef and name not in written:
                fixes.append((f"column {name} is NOT NULL without a default and the pipeline "
                              "does not write it",
                              f"ALTER COLUMN {sql.Identifier(name).as_string(self.conn)} "
                              "DROP NOT NULL"))
        if fixes:
            raise ConfigError(
                f"results table {table} does not match [sink] of {self.settings.source}: "
                + "; ".join(why for why, _ in fixes) + f" - run 'ALTER TABLE {table} "
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

    def lock_key(self, family: str) -> str:
        return self.pipeline if family == "ingest" else f"{self.pipeline}:{family}"

    def try_lock(self, family: str = "ingest") -> bool:
        """Session advisory lock: one run per pipeline and family at a time."""
        return self.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                            (LOCK_CLASS, self.lock_key(family))).fetchone()[0]

    def lock_or_fail(self, what: str = "run", families: Sequence[str] = ("ingest",)) -> None:
        for family in families:
            if self.try_lock(family):
                continue
            kinds = [k for f in (family, "offsets") for k in self.FAMILIES[f]]
            holder = self.execute(
                sql.SQL("SELECT run_id, kind, host, pid, started_at FROM {} WHERE pipeline = %s "
                        "AND status = 'running' AND kind = ANY(%s) ORDER BY run_id DESC "
                        "LIMIT 1").format(self.t("pipeline_runs")),
                (self.pipeline, kinds)).fetchone()
            who = (f"run {holder[0]} ({holder[1]}, {holder[2]} pid {holder[3]}, started "
                   f"{holder[4]:%Y-%m-%d %H:%M:%S})" if holder else "another process")
            self.execute("SELECT pg_advisory_unlock_all()")  # none of them, then
            raise ConflictError(f"pipeline '{self.pipeline}' is busy: {who} holds its "
                                f"{family} lock; this {what} did nothing - retry when it has "
                                "finished ('pipeline unlock' shows the holder, and frees a "
                                "dead one)")

    # ---- reads -------------------------------------------------------------------------
    def load_offsets(self, topics: Sequence[str] | None = None) -> dict[TopicPartition, int]:
        rows = self.execute(
            sql.SQL('SELECT topic, "partition", next_offset FROM {} WHERE pipeline = %s')
            .format(self.t("pipeline_offsets")), (self.pipeline,)).fetchall()
        return {(t, p): o for t, p, o in rows if topics is None or t in topics}

    def load_topic_ids(self, topics: Sequence[str]) -> dict[str, set[str]]:
        """The Kafka topic IDs the stored offsets of each topic belong to (one, normally;
        rows stored before IDs were have none)."""
        out: dict[str, set[str]] = {}
        for topic, topic_id in self.execute(
                sql.SQL("SELECT DISTINCT topic, topic_id FROM {} WHERE pipeline = %s AND "
                        "topic = ANY(%s) AND topic_id IS NOT NULL")
                .format(self.t("pipeline_offsets")), (self.pipeline, list(topics))).fetchall():
            out.setdefault(topic, set()).add(topic_id)
        return out

    # ---- run rows ----------------------------------------------------------------------
    def start_run(self, kind: str, planned: Sequence[PlannedPartition] | Sequence[OffsetRange],
                  details: dict | None = None) -> int:
        return self.execute(
            sql.SQL("INSERT INTO {} (pipeline, kind, status, planned, lost, host, pid, details) "
                    "VALUES (%s, %s, 'running', %s, %s, %s, %s, %s) RETURNING run_id")
            .format(self.t("pipeline_runs")),
            (self.pipeline, kind, json.dumps(ranges_json(planned)),
             json.dumps(lost_json(planned)), socket.gethostname(), os.getpid(),
             json.dumps(details or {}))).fetchone()[0]

    def record_noop(self, kind: str, planned: Sequence[PlannedPartition],
                    timings: dict) -> int:
        return self.execute(
            sql.SQL("INSERT INTO {} (pipeline, kind, status, planned, finished_at, records_read, "
                    "rows_written, dead_letters, timings, exit_code, host, pid) VALUES "
                    "(%s, %s, 'noop', %s, now(), 0, 0, 0, %s, 0, %s, %s) RETURNING run_id")
            .format(self.t("pipeline_runs")),
            (self.pipeline, kind, json.dumps(ranges_json(planned)), json.dumps(timings),
             socket.gethostname(), os.getpid())).fetchone()[0]

    def fail_run(self, run_id: int, error: str, exit_code: int, timings: dict) -> None:
        from pipeline.config import mask

        error = mask(error)  # Spark's error text may quote settings
        self.execute(
            sql.SQL("UPDATE {} SET status = 'failed', finished_at = now(), error = %s, "
                    "exit_code = %s, timings = %s WHERE run_id = %s AND status = 'running'")
            .format(self.t("pipeline_runs")), (error, exit_code, json.dumps(timings), run_id))

    def abandon_stale_runs(self, families: Sequence[str] = ("ingest",)) -> list[int]:
        """Runs of the families whose locks we hold, left 'running' by a crash (none of them
        is alive): mark them abandoned and drop their staging tables. A staging table of a
        run of another family that is still running is left alone: it is in use."""
        kinds = [k for f in families for k in self.FAMILIES[f]] + (
            list(self.FAMILIES["offsets"]) if "ingest" in families else [])
        stale = [r[0] for r in self.execute(
            sql.SQL("UPDATE {} SET status = 'abandoned', finished_at = now(), "
                    "error = coalesce(error, 'process died before finishing (crash, kill or "
                    "lost connection); nothing was published') "
                    "WHERE pipeline = %s AND status = 'running' AND kind = ANY(%s) "
                    "RETURNING run_id").format(self.t("pipeline_runs")),
            (self.pipeline, kinds)).fetchall()]
        in_use = {self.staging_name(r[0]) for r in self.execute(
            sql.SQL("SELECT run_id FROM {} WHERE pipeline = %s AND status = 'running'")
            .format(self.t("pipeline_runs")), (self.pipeline,)).fetchall()}
        leftovers = [name for (name,) in self.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename ~ %s",
            (self.settings.schema, staging_pattern(self.pipeline))).fetchall()
            if name not in in_use]
        for name in leftovers:
            self.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.t(name)))
        if stale or leftovers:
            log.info("cleaned up after crashed runs %s (%d staging tables)", stale, len(leftovers))
        return stale

    # ---- staging ----------------------------------------------------------------------
    def staging_name(self, run_id: int) -> str:
        return staging_table(self.pipeline, run_id)

    def create_staging(self, run_id: int) -> str:
        name = self.staging_name(run_id)
        # UNLOGGED, keyless, one row per batch of records. The blobs are compressed with
        # LZ4 (Postgres >= 14 built with it): 5x smaller staging for the same CPU (1M
        # records: 22 MB instead of 105 MB, write 0.25-0.32 us and read 0.14 us per record
        # either way); without LZ4 they are stored uncompressed (EXTERNAL), as pglz would
        # cost CPU on blobs that are read once and dropped.
        self.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(
            self.t(name), sql.SQL(STAGING_DDL)))
        try:
            self.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN blob SET COMPRESSION lz4")
                         .format(self.t(name)))
        except psycopg.Error:
            self.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN blob SET STORAGE EXTERNAL")
                         .format(self.t(name)))
        return name

    def drop_staging(self, run_id: int) -> None:
        self.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.t(self.staging_name(run_id))))

    def _ranges_hold_rows(self, conn, ranges: Sequence[OffsetRange]) -> bool:
        """Does the results table already hold a row inside any planned range? (an index
        probe per range). Only then does publishing need ON CONFLICT."""
        results = self.t(self.settings.sink.table)
        for r in ranges:
            if conn.execute(sql.SQL(
                    'SELECT EXISTS (SELECT 1 FROM {} WHERE topic = %s AND "partition" = %s '
                    'AND "offset" >= %s AND "offset" < %s)').format(results),
                    (r.topic, r.partition, r.from_offset, r.until_offset)).fetchone()[0]:
                return True
        return False

    # ---- parts of the publishing transaction (pipeline/publish.py) ------------------
    def _merge_rows_sql(self, results, names, cols, key, overwrite: bool) -> sql.Composed:
        """Rows already present in a planned range: keep them (ON CONFLICT DO NOTHING), or
        replace them on reprocess."""
        if not overwrite:
            return sql.SQL("INSERT INTO {res} ({cols}) SELECT {cols} FROM _publish_rows "
                           "ON CONFLICT ({key}) DO NOTHING").format(res=results, cols=cols,
                                                                    key=key)
        updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
                                     for n in names[3:])
        return sql.SQL(
            "INSERT INTO {res} ({cols}) SELECT DISTINCT ON ({key}) {cols} FROM _publish_rows "
            "ON CONFLICT ({key}) DO UPDATE SET {upd}, ingested_at = now()").format(
            res=results, cols=cols, key=key, upd=updates)

    def _compare_and_set_offsets(self, conn, run_id: int, updates: Sequence[PlannedPartition],
                                 topic_ids: dict[str, str] | None = None) -> None:
        """Invariant 2: move each offset only from the value the plan started from. A stale
        plan, a zombie or a concurrent run matches no row, and the whole transaction rolls
        back."""
        table = self.t("pipeline_offsets")
        for u in updates:
            r = u.range
            if u.stored is None:
                n = conn.execute(sql.SQL(
                    'INSERT INTO {} (pipeline, topic, "partition", next_offset, run_id, '
                    "topic_id) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING")
                    .format(table), (self.pipeline, r.topic, r.partition, r.until_offset,
                                     run_id, (topic_ids or {}).get(r.topic))).rowcount
            else:
                # The plan checked the stored ID against Kafka's; a legacy row gets it here.
                n = conn.execute(sql.SQL(
                    "UPDATE {} SET next_offset = %s, updated_at = now(), run_id = %s, "
                    "topic_id = coalesce(%s, topic_id) "
                    'WHERE pipeline = %s AND topic = %s AND "partition" = %s '
                    "AND next_offset = %s").format(table),
                    (r.until_offset, run_id, (topic_ids or {}).get(r.topic), self.pipeline,
                     r.topic, r.partition, u.stored)).rowcount
            if n != 1:
                current = conn.execute(sql.SQL(
                    'SELECT next_offset FROM {} WHERE pipeline = %s AND topic = %s '
                    'AND "partition" = %s').format(table),
                    (self.pipeline, r.topic, r.partition)).fetchone()
                raise ConflictError(
                    f"{r.topic}[{r.partition}]: stored next offset is "
                    f"{current[0] if current else 'absent'}, expected "
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
        table = self.t("pipeline_offsets")
        archived = {}
        with self.transaction() as conn:
            self.set_timeouts(conn)
            for topic, old_ids in sorted((archive or {}).items()):
                archived[topic] = self._archive_topic(conn, topic, ", ".join(old_ids), run_id)
            for (topic, partition), offset in sorted(changes.items()):
                if offset is None:
                    conn.execute(sql.SQL(
                        'DELETE FROM {} WHERE pipeline = %s AND topic = %s AND "partition" = %s')
                        .format(table), (self.pipeline, topic, partition))
                    continue
                conn.execute(sql.SQL(
                    'INSERT INTO {} (pipeline, topic, "partition", next_offset, run_id, '
                    "topic_id) VALUES (%s, %s, %s, %s, %s, %s) "
                    'ON CONFLICT (pipeline, topic, "partition") '
                    "DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now(), "
                    "run_id = EXCLUDED.run_id, topic_id = EXCLUDED.topic_id").format(table),
                    (self.pipeline, topic, partition, offset, run_id,
                     (topic_ids or {}).get(topic)))
            conn.execute(sql.SQL(
                "UPDATE {} SET status = 'succeeded', finished_at = now(), exit_code = 0, "
                "details = coalesce(details, '{{}}') || %s::jsonb WHERE run_id = %s")
                .format(self.t("pipeline_runs")),
                (json.dumps({"archived": archived} if archived else {}), run_id))
        return archived

    def archive_table(self) -> str:
        return f"{self.settings.sink.table}_archived"

    def _archive_topic(self, conn, topic: str, old_id: str, run_id: int) -> dict[str, int]:
        """Move a recreated topic's result rows and dead letters to the archive tables."""
        results = self.t(self.settings.sink.table)
        archive = self.t(self.archive_table())
        columns = [(name, ftype) for name, ftype in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
            "attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f'"{self.settings.schema}"."{self.settings.sink.table}"',)).fetchall()]
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS)")
                     .format(archive, results))
        # A column added to the results table since the archive was created is added here.
        conn.execute(sql.SQL("ALTER TABLE {} {}").format(archive, sql.SQL(", ").join(
            [sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(n), sql.SQL(t))
             for n, t in columns] + [sql.SQL(
                 "ADD COLUMN IF NOT EXISTS topic_id text, ADD COLUMN IF NOT EXISTS "
                 "archived_at timestamptz NOT NULL DEFAULT now(), ADD COLUMN IF NOT EXISTS "
                 "archived_by_run bigint")])))
        cols = sql.SQL(", ").join(sql.Identifier(n) for n, _ in columns)
        rows = conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {res} WHERE topic = %s RETURNING {cols}) "
            "INSERT INTO {arc} ({cols}, topic_id, archived_by_run) "
            "SELECT {cols}, %s, %s FROM moved").format(res=results, arc=archive, cols=cols),
            (topic, old_id, run_id)).rowcount
        dead = self.t("pipeline_dead_letters")
        dcols = sql.SQL(", ").join(sql.Identifier(n) for n in
                                   ["pipeline", *DEAD_COLUMNS, "run_id", "failed_at"])
        dead_rows = conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {dl} WHERE pipeline = %s AND topic = %s "
            "RETURNING {cols}) INSERT INTO {arc} ({cols}, topic_id, archived_by_run) "
            "SELECT {cols}, %s, %s FROM moved").format(
            dl=dead, arc=self.t("pipeline_dead_letters_archived"), cols=dcols),
            (self.pipeline, topic, old_id, run_id)).rowcount
        log.warning("topic '%s' was recreated: archived %d result rows to %s and %d dead "
                    "letters to pipeline_dead_letters_archived (old topic ID %s)", topic, rows,
                    self.archive_table(), dead_rows, old_id)
        return {"topic_id": old_id, "rows": rows, "dead_letters": dead_rows}

    # ==== queries of the operator commands (pipeline/commands/) ==========================
    # What lag, offsets show, runs and unlock read (and unlock's one write), so that the
    # commands speak no SQL themselves; the queries are those of the old pipeline/ops.py and
    # pipeline/unlock.py, unchanged (issue 12).

    RUN_COLUMNS = ("run_id", "kind", "status", "started_at", "finished_at", "planned", "lost",
                   "records_read", "rows_written", "dead_letters", "per_partition", "timings",
                   "error", "exit_code", "host", "pid", "details")

    def offset_rows(self) -> list[dict[str, Any]]:
        """pipeline_offsets of this pipeline, with the run that last moved each offset."""
        cur = self.execute(sql.SQL(
            'SELECT o.topic, o."partition", o.next_offset, o.topic_id, o.updated_at, o.run_id, '
            "r.kind, r.finished_at FROM {offsets} o LEFT JOIN {runs} r ON r.run_id = o.run_id "
            'WHERE o.pipeline = %s ORDER BY o.topic, o."partition"').format(
            offsets=self.t("pipeline_offsets"), runs=self.t("pipeline_runs")), (self.pipeline,))
        names = ["topic", "partition", "next_offset", "topic_id", "updated_at", "run_id",
                 "run_kind", "run_finished_at"]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def last_success(self, kind: str = "ingest") -> dict[str, Any] | None:
        """The newest run of ``kind`` that succeeded (a noop counts: it found nothing new)."""
        row = self.execute(sql.SQL(
            "SELECT run_id, status, finished_at FROM {} WHERE pipeline = %s AND kind = %s "
            "AND status IN ('succeeded', 'noop') ORDER BY run_id DESC LIMIT 1").format(
            self.t("pipeline_runs")), (self.pipeline, kind)).fetchone()
        return None if row is None else {"run_id": row[0], "status": row[1],
                                         "finished_at": row[2]}

    def list_runs(self, last: int = 20, status: str | None = None,
                  kind: str | None = None) -> list[dict[str, Any]]:
        """The newest ``last`` run rows (every column), optionally of one status and kind."""
        where = [sql.SQL("pipeline = %s")]
        params: list[Any] = [self.pipeline]
        if status:
            where.append(sql.SQL("status = %s"))
            params.append(status)
        if kind:
            where.append(sql.SQL("kind = %s"))
            params.append(kind)
        cur = self.execute(sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY run_id DESC LIMIT %s")
                           .format(sql.SQL(", ").join(map(sql.Identifier, self.RUN_COLUMNS)),
                                   self.t("pipeline_runs"), sql.SQL(" AND ").join(where)),
                           [*params, last])
        return [dict(zip(self.RUN_COLUMNS, row, strict=True)) for row in cur.fetchall()]

    def lock_session(self, family: str) -> dict[str, Any] | None:
        """The Postgres session holding this pipeline's ``family`` lock, if any."""
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
        row = self.execute(
            sql.SQL("SELECT run_id, kind, host, pid, started_at FROM {} WHERE pipeline = %s "
                    "AND status = 'running' AND kind = ANY(%s) ORDER BY run_id DESC LIMIT 1")
            .format(self.t("pipeline_runs")), (self.pipeline, list(kinds))).fetchone()
        names = ["run_id", "kind", "host", "pid", "started_at"]
        return None if row is None else dict(zip(names, row, strict=True))

    def end_session(self, session_pid: int) -> bool:
        """Terminate a Postgres session (waits up to 10 s for it to go); False if it did not."""
        return self.execute("SELECT pg_terminate_backend(%s, 10000)",
                            (session_pid,)).fetchone()[0]

    # ==== end of the operator commands' queries =========================================


def _same_type(pg_type: str) -> str:
    """Postgres's own name of a type (format_type) and ours, made comparable."""
    t = pg_type.lower().replace(" ", "")
    return {"timestamptz": "timestampwithtimezone", "int": "integer", "int4": "integer",
            "int8": "bigint", "float8": "doubleprecision"}.get(t, t)


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
