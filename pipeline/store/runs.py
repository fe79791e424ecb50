"""Run rows (pipeline_runs): a run starts, ends as noop, failed or succeeded, or is found
abandoned by the next run of its family; and what the operator commands read of them."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb
from sqlalchemy import and_, func, literal, select
from sqlalchemy import update as update_
from sqlalchemy.dialects.postgresql import JSONB, insert

from pipeline.config import mask  # Spark's error text may quote settings
from pipeline.plan.offsets import OffsetRange, PlannedPartition
from pipeline.store.run import FAMILIES, Kind, Run
from pipeline.store.session import Session
from pipeline.store.staging import Staging
from pipeline.store.tables import runs

log = logging.getLogger(__name__)

RUN_COLUMNS = ("run_id", "kind", "status", "started_at", "finished_at", "planned", "lost",
               "records_read", "rows_written", "dead_letters", "per_partition", "timings",
               "error", "exit_code", "host", "pid", "details")


class Runs:
    """The run rows of the Store's session (``store.runs``); a crashed run's staging table
    goes with its row (``abandon_stale``)."""

    def __init__(self, db: Session, staging: Staging):
        self.db, self.staging = db, staging

    def start(self, kind: Kind | str,
              planned: Sequence[PlannedPartition] | Sequence[OffsetRange] = (),
              details: dict | None = None) -> Run:
        kind = Kind(kind)
        db = self.db
        run_id = db.run(insert(runs).values(
            pipeline=db.pipeline, kind=str(kind), status="running",
            planned=ranges_json(planned), lost=lost_json(planned), host=socket.gethostname(),
            pid=os.getpid(), details=details or {}).returning(runs.c.run_id)).scalar_one()
        return Run(run_id, kind, db.pipeline, db.settings.schema)

    def record_noop(self, kind: Kind | str, planned: Sequence[PlannedPartition],
                    timings: dict) -> int:
        return self.db.run(insert(runs).values(
            pipeline=self.db.pipeline, kind=str(Kind(kind)), status="noop",
            planned=ranges_json(planned), finished_at=func.clock_timestamp(), records_read=0,
            rows_written=0, dead_letters=0, timings=timings, exit_code=0,
            host=socket.gethostname(), pid=os.getpid()).returning(runs.c.run_id)).scalar_one()

    def fail(self, run: Run, error: str, exit_code: int, timings: dict) -> None:
        self.db.run(update_(runs).where(runs.c.run_id == run.id, runs.c.status == "running")
                    .values(status="failed", finished_at=func.clock_timestamp(),
                            error=mask(error), exit_code=exit_code, timings=timings))

    def succeed(self, run: Run, rows_deleted: int = 0, details: dict | None = None,
                **counts: Any) -> None:
        """The run row of a published run (inside its publishing transaction): records_read,
        rows_written, dead_letters, per_partition, timings; an upsert's deletes and
        ``details`` (the run's tables) go into details."""
        extra = {}
        added = {**({"rows_deleted": rows_deleted} if rows_deleted else {}), **(details or {})}
        if added:
            extra["details"] = func.coalesce(runs.c.details, literal({}, JSONB)).op(
                "||", return_type=JSONB)(literal(added, JSONB))
        self.db.run(update_(runs).where(runs.c.run_id == run.id).values(
            status="succeeded", finished_at=func.clock_timestamp(), exit_code=0, **counts,
            **extra))

    def finish_noop(self, run_id: int, timings: dict) -> None:
        """A run that found nothing to do after it started (a replay of no dead letter)."""
        self.db.execute(sql.SQL(
            "UPDATE {runs} SET status = 'noop', finished_at = clock_timestamp(), "
            "exit_code = 0, "
            "records_read = 0, rows_written = 0, dead_letters = 0, timings = %s "
            "WHERE run_id = %s").format(runs=self.db.t(runs.name)),
            (Jsonb(timings), run_id))

    def add_details(self, run_id: int, details: dict[str, Any]) -> None:
        self.db.execute(sql.SQL("UPDATE {runs} SET details = coalesce(details, '{{}}') || %s "
                                "WHERE run_id = %s").format(runs=self.db.t(runs.name)),
                        (Jsonb(details), run_id))

    def set_planned(self, run_id: int, ranges) -> None:
        """A replay's run row: the offsets its dead letters spanned (what `pipeline runs`
        shows), known only once they are read."""
        self.db.execute(sql.SQL("UPDATE {runs} SET planned = %s WHERE run_id = %s").format(
            runs=self.db.t(runs.name)),
            (Jsonb([r.as_dict(count=False) for r in ranges]), run_id))

    def abandon_stale(self, families: Sequence[str] = ("ingest",)) -> list[int]:
        """Runs of the families whose locks we hold, left 'running' by a crash (none of them
        is alive): mark them abandoned and drop their staging tables. A staging table of a
        run of another family that is still running is left alone: it is in use."""
        kinds = [str(k) for f in families for k in FAMILIES[f]] + (
            [str(k) for k in FAMILIES["offsets"]] if "ingest" in families else [])
        mine = and_(runs.c.pipeline == self.db.pipeline, runs.c.status == "running")
        stale = list(self.db.run(
            update_(runs).where(mine, runs.c.kind.in_(kinds))
            .values(status="abandoned", finished_at=func.clock_timestamp(), error=func.coalesce(
                runs.c.error, "process died before finishing (crash, kill or lost "
                "connection); nothing was published"))
            .returning(runs.c.run_id)).scalars())
        running = self.db.run(select(runs.c.run_id).where(mine)).scalars()
        leftovers = self.staging.drop_leftovers(in_use=running)
        if stale or leftovers:
            log.info("cleaned up after crashed runs %s (%d staging tables)", stale, leftovers)
        return stale

    def status(self, run_id: int) -> str | None:
        return self.db.run(select(runs.c.status).where(runs.c.run_id == run_id)).scalar()

    def last_sequence(self, kind: Kind | str, key: dict) -> dict | None:
        """details.sequence of the newest run of ``kind`` in a backfill sequence with
        this ``key`` (what makes a rerun "the same backfill"), or None."""
        return self.db.run(
            select(runs.c.details["sequence"])
            .where(runs.c.pipeline == self.db.pipeline, runs.c.kind == str(Kind(kind)),
                   runs.c.details["sequence"]["key"] == literal(key, JSONB))
            .order_by(runs.c.run_id.desc()).limit(1)).scalar()

    def sequence_committed(self, kind: Kind | str, sequence_id: str) -> list[list[dict]]:
        """The planned ranges of each chunk run of a sequence that published, in order."""
        return list(self.db.run(
            select(runs.c.planned)
            .where(runs.c.pipeline == self.db.pipeline, runs.c.kind == str(Kind(kind)),
                   runs.c.status == "succeeded",
                   runs.c.details["sequence"]["id"].astext == sequence_id)
            .order_by(runs.c.run_id)).scalars())

    # ---- what the operator commands read (pipeline/commands/: they speak no SQL) --------
    def last_success(self, kind: str = "ingest") -> dict[str, Any] | None:
        """The newest run of ``kind`` that succeeded (a noop counts: it found nothing new)."""
        row = self.db.run(
            select(runs.c.run_id, runs.c.status, runs.c.finished_at)
            .where(runs.c.pipeline == self.db.pipeline, runs.c.kind == kind,
                   runs.c.status.in_(("succeeded", "noop")))
            .order_by(runs.c.run_id.desc()).limit(1)).first()
        return None if row is None else dict(row._mapping)

    def newest(self, last: int = 20, status: str | None = None,
               kind: str | None = None) -> list[dict[str, Any]]:
        """The newest ``last`` run rows (every column), optionally of one status and kind."""
        query = (select(*(runs.c[name] for name in RUN_COLUMNS))
                 .where(runs.c.pipeline == self.db.pipeline)
                 .order_by(runs.c.run_id.desc()).limit(last))
        if status:
            query = query.where(runs.c.status == status)
        if kind:
            query = query.where(runs.c.kind == kind)
        return [dict(row._mapping) for row in self.db.run(query)]


def ranges_json(planned: Sequence[PlannedPartition] | Sequence[OffsetRange]) -> list[dict]:
    """pipeline_runs.planned: the ranges, in the shape run rows store."""
    return [(p.range if isinstance(p, PlannedPartition) else p).as_dict(count=False)
            for p in planned]


def lost_json(planned: Sequence[PlannedPartition] | Sequence[OffsetRange]) -> list[dict]:
    """pipeline_runs.lost: what retention deleted before it was read (on_data_loss=skip)."""
    return [p.lost.as_dict(count=False)
            for p in planned if isinstance(p, PlannedPartition) and p.lost]
