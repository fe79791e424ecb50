"""The run locks: session advisory locks, one per pipeline and family (store/run.py,
FAMILIES), held by the Store's session while it is open; and who holds one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select

from pipeline.errors import ConflictError
from pipeline.store.run import kinds_of, lock_key
from pipeline.store.session import Session
from pipeline.store.tables import runs

LOCK_CLASS = 7_400_001  # first key of our advisory locks; the second is the pipeline's hash


class Locks:
    """The run locks of the Store's session (``store.locks``): held until it closes."""

    def __init__(self, db: Session):
        self.db = db

    def key(self, family: str) -> str:
        return lock_key(self.db.pipeline, family)

    def try_lock(self, family: str = "ingest") -> bool:
        """Session advisory lock: one run per pipeline and family at a time."""
        return self.db.run(select(func.pg_try_advisory_lock(
            LOCK_CLASS, func.hashtext(self.key(family))))).scalar_one()

    def lock_or_fail(self, what: str = "run", families: Sequence[str] = ("ingest",)) -> None:
        for family in families:
            if self.try_lock(family):
                continue
            holder = self.running_run(family)
            who = (f"run {holder['run_id']} ({holder['kind']}, {holder['host']} pid "
                   f"{holder['pid']}, started {holder['started_at']:%Y-%m-%d %H:%M:%S})"
                   if holder else "another process")
            self.db.execute("SELECT pg_advisory_unlock_all()")  # none of them, then
            raise ConflictError(f"pipeline '{self.db.pipeline}' is busy: {who} holds its "
                                f"{family} lock; this {what} did nothing - retry when it has "
                                "finished ('pipeline unlock' shows the holder, and frees a "
                                "dead one)")

    def running_run(self, family: str) -> dict[str, Any] | None:
        """The newest run still marked running of a kind that may hold ``family``'s lock:
        who holds it, as far as pipeline_runs knows."""
        row = self.db.run(
            select(runs.c.run_id, runs.c.kind, runs.c.host, runs.c.pid, runs.c.started_at)
            .where(runs.c.pipeline == self.db.pipeline, runs.c.status == "running",
                   runs.c.kind.in_([str(k) for k in kinds_of(family)]))
            .order_by(runs.c.run_id.desc()).limit(1)).first()
        return None if row is None else dict(row._mapping)

    def lock_session(self, family: str) -> dict[str, Any] | None:
        """The Postgres session holding this pipeline's ``family`` lock, if any. (Catalog
        views, not our tables: plain SQL.)"""
        row = self.db.execute(
            "SELECT a.pid, a.application_name, coalesce(host(a.client_addr) || ':' || "
            "a.client_port, 'local socket'), a.backend_start, coalesce(a.state, 'unknown'), "
            "a.state_change FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND l.classid = %s::oid AND l.objid = hashtext(%s)::oid AND l.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            (LOCK_CLASS, self.key(family))).fetchone()
        names = ["session_pid", "application", "client", "session_started", "state",
                 "state_since"]
        return None if row is None else dict(zip(names, row, strict=True))

    def end_session(self, session_pid: int) -> bool:
        """Terminate a Postgres session (waits up to 10 s for it to go); False if it did not."""
        return self.db.run(select(func.pg_terminate_backend(session_pid, 10000))).scalar_one()
