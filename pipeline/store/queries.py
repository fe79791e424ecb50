"""What the operator commands (pipeline/commands/) read: lag, offsets show, runs, so that
the commands speak no SQL themselves. (unlock's are the lock queries, store/locks.py.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from pipeline.store.session import Session
from pipeline.store.tables import offsets, runs

RUN_COLUMNS = ("run_id", "kind", "status", "started_at", "finished_at", "planned", "lost",
               "records_read", "rows_written", "dead_letters", "per_partition", "timings",
               "error", "exit_code", "host", "pid", "details")


class Queries(Session):
    RUN_COLUMNS = RUN_COLUMNS

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
        query = (select(*(runs.c[name] for name in RUN_COLUMNS))
                 .where(runs.c.pipeline == self.pipeline)
                 .order_by(runs.c.run_id.desc()).limit(last))
        if status:
            query = query.where(runs.c.status == status)
        if kind:
            query = query.where(runs.c.kind == kind)
        return [dict(row._mapping) for row in self.run(query)]
