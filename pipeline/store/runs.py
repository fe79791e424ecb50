"""Run rows (pipeline_runs): a run starts, ends as noop, failed or succeeded, or is found
abandoned by the next run of its family."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, func, literal, select
from sqlalchemy import update as update_
from sqlalchemy.dialects.postgresql import JSONB, insert

from pipeline.config import mask  # Spark's error text may quote settings
from pipeline.plan.offsets import OffsetRange, PlannedPartition
from pipeline.store.run import FAMILIES, Kind, Run
from pipeline.store.staging import Staging
from pipeline.store.tables import runs

log = logging.getLogger(__name__)


class RunRows(Staging):
    def start_run(self, kind: Kind | str,
                  planned: Sequence[PlannedPartition] | Sequence[OffsetRange] = (),
                  details: dict | None = None) -> Run:
        kind = Kind(kind)
        run_id = self.run(insert(runs).values(
            pipeline=self.pipeline, kind=str(kind), status="running",
            planned=ranges_json(planned), lost=lost_json(planned), host=socket.gethostname(),
            pid=os.getpid(), details=details or {}).returning(runs.c.run_id)).scalar_one()
        return Run(run_id, kind, self.pipeline, self.settings.schema)

    def record_noop(self, kind: Kind | str, planned: Sequence[PlannedPartition],
                    timings: dict) -> int:
        return self.run(insert(runs).values(
            pipeline=self.pipeline, kind=str(Kind(kind)), status="noop",
            planned=ranges_json(planned), finished_at=func.clock_timestamp(), records_read=0,
            rows_written=0, dead_letters=0, timings=timings, exit_code=0,
            host=socket.gethostname(), pid=os.getpid()).returning(runs.c.run_id)).scalar_one()

    def fail_run(self, run: Run, error: str, exit_code: int, timings: dict) -> None:
        self.run(update_(runs).where(runs.c.run_id == run.id, runs.c.status == "running")
                 .values(status="failed", finished_at=func.clock_timestamp(), error=mask(error),
                         exit_code=exit_code, timings=timings))

    def succeed_run(self, run: Run, rows_deleted: int = 0, **counts: Any) -> None:
        """The run row of a published run (inside its publishing transaction): records_read,
        rows_written, dead_letters, per_partition, timings; an upsert's deletes go into
        details."""
        extra = {}
        if rows_deleted:
            extra["details"] = func.coalesce(runs.c.details, literal({}, JSONB)).op(
                "||", return_type=JSONB)(literal({"rows_deleted": rows_deleted}, JSONB))
        self.run(update_(runs).where(runs.c.run_id == run.id).values(
            status="succeeded", finished_at=func.clock_timestamp(), exit_code=0, **counts, **extra))

    def abandon_stale_runs(self, families: Sequence[str] = ("ingest",)) -> list[int]:
        """Runs of the families whose locks we hold, left 'running' by a crash (none of them
        is alive): mark them abandoned and drop their staging tables. A staging table of a
        run of another family that is still running is left alone: it is in use."""
        kinds = [str(k) for f in families for k in FAMILIES[f]] + (
            [str(k) for k in FAMILIES["offsets"]] if "ingest" in families else [])
        mine = and_(runs.c.pipeline == self.pipeline, runs.c.status == "running")
        stale = list(self.run(
            update_(runs).where(mine, runs.c.kind.in_(kinds))
            .values(status="abandoned", finished_at=func.clock_timestamp(), error=func.coalesce(
                runs.c.error, "process died before finishing (crash, kill or lost "
                "connection); nothing was published"))
            .returning(runs.c.run_id)).scalars())
        running = self.run(select(runs.c.run_id).where(mine)).scalars()
        leftovers = self.drop_leftover_staging(in_use=running)
        if stale or leftovers:
            log.info("cleaned up after crashed runs %s (%d staging tables)", stale, leftovers)
        return stale


    def run_status(self, run_id: int) -> str | None:
        return self.run(select(runs.c.status).where(runs.c.run_id == run_id)).scalar()

    def last_sequence(self, kind: Kind | str, key: dict) -> dict | None:
        """details.sequence of the newest run of ``kind`` in a backfill sequence with
        this ``key`` (what makes a rerun "the same backfill"), or None."""
        return self.run(
            select(runs.c.details["sequence"])
            .where(runs.c.pipeline == self.pipeline, runs.c.kind == str(Kind(kind)),
                   runs.c.details["sequence"]["key"] == literal(key, JSONB))
            .order_by(runs.c.run_id.desc()).limit(1)).scalar()

    def sequence_committed(self, kind: Kind | str, sequence_id: str) -> list[list[dict]]:
        """The planned ranges of each chunk run of a sequence that published, in order."""
        return list(self.run(
            select(runs.c.planned)
            .where(runs.c.pipeline == self.pipeline, runs.c.kind == str(Kind(kind)),
                   runs.c.status == "succeeded",
                   runs.c.details["sequence"]["id"].astext == sequence_id)
            .order_by(runs.c.run_id)).scalars())

def ranges_json(planned: Sequence[PlannedPartition] | Sequence[OffsetRange]) -> list[dict]:
    """pipeline_runs.planned: the ranges, in the shape run rows store."""
    return [(p.range if isinstance(p, PlannedPartition) else p).as_dict(count=False)
            for p in planned]


def lost_json(planned: Sequence[PlannedPartition] | Sequence[OffsetRange]) -> list[dict]:
    """pipeline_runs.lost: what retention deleted before it was read (on_data_loss=skip)."""
    return [p.lost.as_dict(count=False)
            for p in planned if isinstance(p, PlannedPartition) and p.lost]
