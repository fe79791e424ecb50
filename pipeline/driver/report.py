"""What a run tells: its result, its timings, what it learnt as it went, and its first and
last log records and metrics (``reported``), whatever its outcome."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pipeline import logs
from pipeline.config import Settings, mask
from pipeline.driver import metrics
from pipeline.errors import EXIT_INTERNAL
from pipeline.plan.offsets import OffsetRange, Plan

log = logging.getLogger("pipeline")


@dataclass
class RunResult:
    kind: str
    status: str  # succeeded | noop | planned (dry run)
    run_id: int | None
    plan: list[dict]
    lost: list[dict] = field(default_factory=list)
    records_read: int = 0
    rows_written: int = 0
    rows_deleted: int = 0  # an upsert sink's tombstones
    dead_letters: int = 0
    per_partition: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    # Per table: its mode and topics, and (published) its counts (publish.Published.tables).
    tables: dict = field(default_factory=dict)
    # [sink] transactions: the run's cut at whole source transactions (RunCut.summary).
    transactions: dict = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Timer:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.last = self.t0
        self.stages: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.monotonic()
        self.stages[stage] = round(now - self.last, 3)
        self.last = now

    def as_dict(self) -> dict[str, float]:
        return {**self.stages, "total": round(time.monotonic() - self.t0, 3)}


@dataclass
class Seen:
    """What a run learnt as it went, for its last log record and its metrics (a run that
    fails has no RunResult)."""
    run_id: int | None = None
    plan: Plan | None = None
    latest: dict[tuple[str, int], int] = field(default_factory=dict)
    result: RunResult | None = None

    def started(self, run_id: int) -> None:
        self.run_id = run_id
        logs.bind(run_id=run_id)

    def lag(self, committed: bool) -> dict[tuple[str, int], int] | None:
        """Per partition, what Kafka held (when the run planned) beyond the next offset to
        read after the run: the planned end if it committed, else the planned start."""
        if self.plan is None:
            return None
        return {p.range.tp: max(0, self.latest.get(p.range.tp, 0) - (
                    p.range.until_offset if committed else p.range.from_offset))
                for p in self.plan.partitions}


def describe(ranges: Sequence[OffsetRange]) -> str:
    return ", ".join(str(r) for r in ranges) or "nothing"


@contextmanager
def reported(settings: Settings, kind: str, timer: Timer, seen: Seen, *,
             export_metrics: bool, dry_run: bool = False) -> Iterator[None]:
    """A run's first and last log records (run.start, then run.done or run.failed), and
    its metrics when asked: after the outcome is final, so exporting cannot change it."""
    logs.bind(pipeline=settings.name, run_id=None)
    log.info("%s run of pipeline %s%s", kind, settings.name, " (dry run)" if dry_run else "",
             extra={"event": "run.start", "kind": kind, "dry_run": dry_run})
    try:
        try:
            yield
        except BaseException as e:
            code = getattr(e, "exit_code", EXIT_INTERNAL)
            timings = timer.as_dict()
            error = mask(getattr(e, "message", None) or f"{type(e).__name__}: {e}")
            log.warning("run %s (%s) failed with exit code %d after %.1f s",
                        seen.run_id or "-", kind, code, timings["total"],
                        extra={"event": "run.failed", "kind": kind, "exit_code": code,
                               "error": error[:2000], "duration": timings["total"],
                               "timings": timings})
            if export_metrics:
                metrics.export(settings, metrics.RunOutcome(
                    kind, "failed", code, seen.run_id, timings=timings,
                    lag=seen.lag(committed=False)))
            raise
        result = seen.result
        if result is None or result.status == "planned":
            return
        total = result.timings.get("total", 0.0)
        log.info("run %s (%s) %s in %.1f s", result.run_id, kind, result.status, total,
                 extra={"event": "run.done", "kind": kind, "status": result.status,
                        "records": result.records_read, "rows": result.rows_written,
                        "deleted": result.rows_deleted, "dead_letters": result.dead_letters,
                        "duration": total,
                        "timings": result.timings})
        if export_metrics:
            metrics.export(settings, metrics.RunOutcome(
                kind, result.status, 0, result.run_id, result.records_read,
                result.rows_written, result.dead_letters, result.rows_deleted,
                result.timings, seen.lag(committed=True)))
    finally:
        logs.bind(pipeline=None, run_id=None)
