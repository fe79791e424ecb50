"""``[sink] evolve = "add_columns"``: a column declared in [sink.columns] that the results
table lacks is added by the run that first writes it, with ``ALTER TABLE ... ADD COLUMN`` in
a short transaction of its own, before the run reads anything (driver/job.py) or a replay
opens its transaction (driver/replay.py).

Why not inside the publishing transaction: ALTER TABLE takes ACCESS EXCLUSIVE, and every
new reader of the table queues behind it, first while it waits for the readers already
there, then until the transaction that holds it commits - a whole merge and COMMIT. Alone,
the ALTER holds it for an instant (adding a nullable column is a catalog change), and it
waits at most ALTER_LOCK_WAIT at a time: behind a long reader it gives up, lets the queue
through and tries again later, until database.lock_timeout_seconds have passed (then exit
75, naming the session in the way). It is never held together with another lock of ours
(the upsert merge lock, the dead-letter lock), so no lock order between them exists to get
wrong. A run that fails after it leaves the column (NULL in every row); its rerun fills it.

Only additions: a dropped column, another type or nullability stay schema.py's exit-2
error. A new NOT NULL column is added only to an empty table: rows already there would
have no value for it. ALTER TABLE needs the table's owner, or a member of the owning role
(sql/grants/evolve.sql, docs/operations.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from sqlalchemy import Table

from pipeline.config import SinkSettings
from pipeline.errors import ConfigError, TransientError
from pipeline.store import tables
from pipeline.store.session import Session

log = logging.getLogger(__name__)

# How long one ALTER TABLE may wait for the table: every new reader queues behind it that long
# at most. Then it steps aside and tries again after a pause (PAUSES, then the last one over
# and over) until database.lock_timeout_seconds have passed.
ALTER_LOCK_WAIT = 1.0
PAUSES = (0.5, 1.0, 2.0, 4.0)


class _TableBusy(Exception):
    """One ALTER TABLE gave up waiting for the table (lock_timeout): rolled back."""


@dataclass(frozen=True)
class Addition:
    """A column a run adds to one of the sink's tables."""

    table: str
    column: str
    pg_type: str  # tables.ddl_type: from the column-type registry, safe as SQL
    not_null: bool

    def __str__(self) -> str:
        return f"{self.column} {self.pg_type}{' NOT NULL' if self.not_null else ''}"

    def clause(self) -> sql.Composed:
        return sql.SQL("ADD COLUMN IF NOT EXISTS {} {}{}").format(
            sql.Identifier(self.column), sql.SQL(self.pg_type),
            sql.SQL(" NOT NULL" if self.not_null else ""))


def additions(table: Table, have: Collection[str], sink: SinkSettings) -> list[Addition]:
    """The columns of ``table`` the run writes, the live table lacks (``have``: its column
    names) and the run may add: only with evolve on, and only ones declared in
    [sink.columns] (a fixed column that is missing is damage, not evolution)."""
    if sink.evolve != "add_columns" or not have:
        return []
    declared = {c.name for c in sink.columns}
    return [Addition(table.name, c.name, tables.ddl_type(c.type), not c.nullable)
            for c in tables.written(table) if c.name in declared and c.name not in have]


class Evolution:
    """sink.evolve on the Store's session (``store.evolution``): the additions the check
    before reading plans (``plan``, a value the run passes on), made before the run reads,
    each table's in a short transaction of its own (``add_columns``)."""

    def __init__(self, db: Session):
        self.db = db

    def _qualified(self, table: str) -> str:
        return f'"{self.db.settings.schema}"."{table}"'

    def plan(self, found: Sequence[Addition]) -> tuple[Addition, ...]:
        """Before anything is read: a NOT NULL addition to a table with rows is refused.
        Returns the additions the run makes."""
        for a in found:
            if a.not_null and self.db.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(
                    self.db.t(a.table))).fetchone()[0]:
                raise self._not_null_refused(a)
        if found:
            log.info("sink.evolve = 'add_columns': %s will be added to %s before the run "
                     "writes (ALTER TABLE in a short transaction of its own)",
                     ", ".join(map(str, found)),
                     ", ".join(sorted({self._qualified(a.table) for a in found})),
                     extra={"event": "evolve.planned",
                            "columns": [a.column for a in found]})
        return tuple(found)

    def _not_null_refused(self, a: Addition) -> ConfigError:
        name = self._qualified(a.table)
        return ConfigError(
            f"sink.evolve = 'add_columns' cannot add column {a.column} as NOT NULL to {name}: "
            f"the table has rows, which would hold no value for it - declare it without "
            f"'not null' in [sink.columns] of {self.db.settings.source} (rows lacking it then "
            f"hold NULL), or add it by hand with a default (ALTER TABLE {name} ADD COLUMN "
            f"{sql.Identifier(a.column).as_string(self.db.conn)} {a.pg_type} NOT NULL DEFAULT "
            "...); nothing was read")

    def missing(self, planned: Sequence[Addition]) -> list[Addition]:
        """The planned additions the tables still lack (an earlier chunk of a backfill, or
        another run, may have added them since the check)."""
        return [a for a in planned if not self.db.execute(
            "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND attname = %s AND attnum > 0 AND NOT attisdropped)",
            (self._qualified(a.table), a.column)).fetchone()[0]]

    def add_columns(self, run_id: int, planned: Sequence[Addition]) -> list[str]:
        """The ``planned`` additions still missing, each table's in one short transaction of
        its own (no transaction may be open). Returns the columns added; the run row's
        details name them too."""
        if self.db.session.in_transaction():  # SET LOCAL and a COMMIT of its own
            raise RuntimeError("add_columns runs outside any transaction")
        missing = self.missing(planned)
        for table in sorted({a.table for a in missing}):
            mine = [a for a in missing if a.table == table]
            self._alter_when_free(table, mine, run_id)
            log.info("run %s added %s to %s (sink.evolve = 'add_columns')", run_id,
                     ", ".join(map(str, mine)), self._qualified(table),
                     extra={"event": "evolve.add_columns", "run_id": run_id,
                            "table": table, "columns": [a.column for a in mine]})
        added = [a.column for a in missing]
        if added:
            self.db.execute(sql.SQL("UPDATE {} SET details = coalesce(details, '{{}}') || %s "
                                    "WHERE run_id = %s").format(self.db.t(tables.runs.name)),
                            (Jsonb({"columns_added": added}), run_id))
        return added

    def _alter_when_free(self, table: str, mine: Sequence[Addition], run_id: int) -> None:
        """ALTER TABLE, waiting at most ALTER_LOCK_WAIT at a time for the table, with pauses
        in between (readers go on meanwhile), for up to database.lock_timeout_seconds."""
        statement = sql.SQL("ALTER TABLE {} {}").format(
            self.db.t(table), sql.SQL(", ").join(a.clause() for a in mine))
        budget = self.db.settings.lock_timeout_seconds or float("inf")  # 0: no limit
        deadline = time.monotonic() + budget
        attempt = 0
        while True:
            # Who holds the table now: the session in the way, even if it is gone by the
            # time the ALTER has given up.
            before = self.table_holders(table)
            try:
                with self.db.transaction() as conn:
                    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                        sql.Literal(f"{int(ALTER_LOCK_WAIT * 1000)}ms")))
                    try:
                        conn.execute(statement)
                    except psycopg.errors.LockNotAvailable:
                        raise _TableBusy from None
                    except psycopg.errors.InsufficientPrivilege as e:
                        raise self._not_owner(table, e) from None
                    except psycopg.errors.NotNullViolation:  # rows arrived since the check
                        raise self._not_null_refused(
                            next(a for a in mine if a.not_null)) from None
                return
            except _TableBusy:
                pause = PAUSES[min(attempt, len(PAUSES) - 1)]
                attempt += 1
                holders = self.table_holders(table) or before
                if time.monotonic() + pause >= deadline:
                    raise TransientError(
                        f"sink.evolve = 'add_columns' could not add {', '.join(map(str, mine))}"
                        f" to {self._qualified(table)}: the table stayed in use by "
                        f"{holders or 'another session'} for database.lock_timeout_seconds = "
                        f"{self.db.settings.lock_timeout_seconds:g} ({attempt} tries, each "
                        f"waiting at most {ALTER_LOCK_WAIT:g} s so that readers never queue "
                        f"behind it longer); run {run_id} wrote nothing - retry when that "
                        "session is done (or end it)") from None
                log.warning("ALTER TABLE %s waited %g s for the table, held by %s: trying "
                            "again in %g s (readers are not held meanwhile)",
                            self._qualified(table), ALTER_LOCK_WAIT,
                            holders or "another session", pause,
                            extra={"event": "evolve.table_busy", "table": table,
                                   "attempt": attempt, "holders": holders})
                time.sleep(pause)

    def table_holders(self, table: str) -> str:
        """Who holds a lock on ``table`` now (other sessions), oldest transaction first, as
        far as this role may see: "pid N (user U, application 'A', in a transaction since
        T)"; empty if nobody."""
        rows = self.db.execute(
            "SELECT DISTINCT ON (l.pid) l.pid, a.usename, a.application_name, a.xact_start, "
            "l.mode FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE "
            "l.locktype = 'relation' AND l.relation = to_regclass(%s) AND l.granted AND "
            "l.pid <> pg_backend_pid() ORDER BY l.pid", (self._qualified(table),)).fetchall()
        rows.sort(key=lambda r: (r[3] is None, r[3] or 0, r[0]))
        return "; ".join(
            f"pid {pid} (user {user or '?'}, application '{app or ''}'"
            + (f", in a transaction since {since:%Y-%m-%d %H:%M:%S %Z}" if since else "")
            + f", {mode})" for pid, user, app, since, mode in rows[:3])

    def _not_owner(self, table: str, e: BaseException) -> ConfigError:
        name = self._qualified(table)
        return ConfigError(
            f"sink.evolve = 'add_columns' must ALTER TABLE {name} and the job's role may not "
            f"({str(e).splitlines()[0]}): Postgres lets only the table's owner (or a member "
            "of the owning role) add a column - apply sql/grants/evolve.sql as the owner "
            "(docs/operations.md, 'Schema evolution'), or add the column by hand as the "
            "owner; nothing committed")
