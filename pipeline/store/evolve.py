"""``[sink] evolve = "add_columns"``: a column declared in [sink.columns] that the results
table lacks is added by the run that first writes it, with ``ALTER TABLE ... ADD COLUMN``
inside that run's publishing transaction (driver/publish.py, driver/replay.py). Postgres
DDL is transactional: the column commits with the rows that fill it, the offsets and the
run row, or not at all (docs/reliability.md).

Only additions: a dropped column, another type or nullability stay schema.py's exit-2
error. A new NOT NULL column is added only to an empty table: rows already there would
have no value for it. ALTER TABLE needs the table's owner, or a member of the owning role
(sql/grants/evolve.sql, docs/operations.md).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from sqlalchemy import Table

from pipeline.config import SinkSettings
from pipeline.errors import ConfigError
from pipeline.store import tables
from pipeline.store.session import Session

log = logging.getLogger(__name__)


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


class Evolution(Session):
    """The additions the check before reading found (``plan_additions``), made in the
    publishing transaction (``add_columns``)."""

    additions: tuple[Addition, ...] = ()

    def _qualified(self, table: str) -> str:
        return f'"{self.settings.schema}"."{table}"'

    def plan_additions(self, found: Sequence[Addition]) -> None:
        """Before anything is read: a NOT NULL addition to a table with rows is refused."""
        for a in found:
            if a.not_null and self.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(
                    self.t(a.table))).fetchone()[0]:
                raise self._not_null_refused(a)
        self.additions = tuple(found)
        if found:
            log.info("sink.evolve = 'add_columns': %s will be added to %s in the publishing "
                     "transaction", ", ".join(map(str, found)),
                     ", ".join(sorted({self._qualified(a.table) for a in found})),
                     extra={"event": "evolve.planned",
                            "columns": [a.column for a in found]})

    def _not_null_refused(self, a: Addition) -> ConfigError:
        name = self._qualified(a.table)
        return ConfigError(
            f"sink.evolve = 'add_columns' cannot add column {a.column} as NOT NULL to {name}: "
            f"the table has rows, which would hold no value for it - declare it without "
            f"'not null' in [sink.columns] of {self.settings.source} (rows lacking it then "
            f"hold NULL), or add it by hand with a default (ALTER TABLE {name} ADD COLUMN "
            f"{sql.Identifier(a.column).as_string(self.conn)} {a.pg_type} NOT NULL DEFAULT "
            "...); nothing was read")

    def add_columns(self, conn: psycopg.Connection, run_id: int) -> list[str]:
        """In the caller's (publishing) transaction, before its rows reach the table: the
        planned additions still missing (a backfill's earlier chunk may have committed
        them). Returns the columns added; they are in the run row's details too."""
        missing = []
        for a in self.additions:
            there = conn.execute(
                "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attname = %s AND attnum > 0 AND NOT attisdropped)",
                (self._qualified(a.table), a.column)).fetchone()[0]
            if not there:
                missing.append(a)
        for table in sorted({a.table for a in missing}):
            mine = [a for a in missing if a.table == table]
            try:
                conn.execute(sql.SQL("ALTER TABLE {} {}").format(
                    self.t(table), sql.SQL(", ").join(a.clause() for a in mine)))
            except psycopg.errors.InsufficientPrivilege as e:
                raise self._not_owner(table, e) from None
            except psycopg.errors.NotNullViolation:  # rows arrived since the check
                raise self._not_null_refused(next(a for a in mine if a.not_null)) from None
            log.info("run %s adds %s to %s (sink.evolve = 'add_columns'); it commits with "
                     "the run's rows", run_id, ", ".join(map(str, mine)),
                     self._qualified(table),
                     extra={"event": "evolve.add_columns", "run_id": run_id,
                            "table": table, "columns": [a.column for a in mine]})
        return [a.column for a in missing]

    def _not_owner(self, table: str, e: BaseException) -> ConfigError:
        name = self._qualified(table)
        return ConfigError(
            f"sink.evolve = 'add_columns' must ALTER TABLE {name} and the job's role may not "
            f"({str(e).splitlines()[0]}): Postgres lets only the table's owner (or a member "
            "of the owning role) add a column - apply sql/grants/evolve.sql as the owner "
            "(docs/operations.md, 'Schema evolution'), or add the column by hand as the "
            "owner; nothing committed")
