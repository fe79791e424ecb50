"""The driver's one Postgres session: its connection, transactions and timeouts (the Store,
pipeline/store/core.py, is this session with its parts; each part takes it).

SQLAlchemy Core where it is the well-kept way: the engine (pipeline/store/database.py),
reflection, and the simple statements on offsets, runs and dead letters. psycopg, on the
same session and in the same transaction, for what Core does not express well: COPY, the
migration scripts, ``INSERT ... SELECT`` merges, ``LIKE``, column compression. Nothing here
runs on the executors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import Connection, CursorResult

from pipeline.config import Settings
from pipeline.store import database, tables
from pipeline.store.database import db_errors
from pipeline.store.identifiers import qualified

log = logging.getLogger(__name__)


class Session:
    """The connection the Store lives on: it holds the pipeline's run lock while open."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.url = settings.database_url
        self.pipeline = settings.name
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

    def __enter__(self):
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

    def t(self, name: str) -> sql.Identifier:
        """A table of the pipeline's schema."""
        return qualified(self.settings.schema, name)

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

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read-only REPEATABLE READ transaction: every table as of one moment, so that a
        run publishing meanwhile changes nothing a reader (verify) sees."""
        with self.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

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


def _roll_back(tx) -> None:
    """Roll back, keeping the error that caused it: a rollback on a connection that is gone
    fails too, and the server has rolled back already."""
    try:
        tx.rollback()
    except Exception:  # noqa: BLE001
        log.debug("rollback failed (the connection is gone)", exc_info=True)
