"""What ``pipeline verify`` reads: the ranges succeeded runs published, the runs that
archived a recreated topic, and the offsets the results and dead-letter tables hold, paged
by offset (keyset: an index range scan per page, bounded memory, no server-side cursor)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Table, and_, func, not_, or_, select

from pipeline.plan.offsets import OffsetRange
from pipeline.store.results import in_range
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters, offsets, runs

PUBLISHING_KINDS = ("ingest", "backfill", "reprocess")
PAGE = 10_000


class Verification(Session):
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read-only REPEATABLE READ transaction: the run rows and both tables as of one
        moment, so that a run publishing meanwhile changes nothing verify sees."""
        with self.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

    def published_plans(self) -> list[tuple[int, list[dict[str, Any]]]]:
        """(run_id, planned ranges) of every succeeded run that wrote rows, oldest first."""
        return [(row.run_id, row.planned) for row in self.run(
            select(runs.c.run_id, runs.c.planned)
            .where(runs.c.pipeline == self.pipeline, runs.c.status == "succeeded",
                   runs.c.kind.in_(PUBLISHING_KINDS))
            .order_by(runs.c.run_id))]

    def stored_offsets(self) -> dict[tuple[str, int], tuple[int, int | None]]:
        """Each partition's stored next offset and the run that wrote it."""
        return {(r.topic, r.partition): (r.next_offset, r.run_id) for r in self.run(
            select(offsets.c.topic, offsets.c.partition, offsets.c.next_offset,
                   offsets.c.run_id).where(offsets.c.pipeline == self.pipeline))}

    def offset_writers(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """run id -> its kind, status, planned ranges and details (the runs that wrote the
        stored offsets)."""
        if not run_ids:
            return {}
        return {r.run_id: {"kind": r.kind, "status": r.status, "planned": r.planned or [],
                           "details": r.details or {}} for r in self.run(
            select(runs.c.run_id, runs.c.kind, runs.c.status, runs.c.planned, runs.c.details)
            .where(runs.c.pipeline == self.pipeline, runs.c.run_id.in_(sorted(set(run_ids)))))}

    def archiving_runs(self) -> dict[str, int]:
        """topic -> the newest offsets run that archived its rows (a recreated topic)."""
        out: dict[str, int] = {}
        for run_id, archived in self.run(
                select(runs.c.run_id, runs.c.details["archived"])
                .where(runs.c.pipeline == self.pipeline, runs.c.kind == "offsets",
                       runs.c.status == "succeeded",
                       runs.c.details.has_key("archived"))  # noqa: W601 - JSONB ?, not dict
                .order_by(runs.c.run_id)):
            for topic in archived or {}:
                out[topic] = run_id
        return out

    def _owned(self, table: Table):
        return dead_letters.c.pipeline == self.pipeline if table is dead_letters else None

    def offsets_in(self, table: Table, r: OffsetRange, page: int = PAGE) -> Iterator[int]:
        """The offsets ``table`` holds inside ``r``, ascending, read a page at a time."""
        offset = table.c["offset"]
        after = r.from_offset - 1
        while True:
            query = (select(offset).where(in_range(table, r), offset > after)
                     .order_by(offset).limit(page))
            if (owned := self._owned(table)) is not None:
                query = query.where(owned)
            got = list(self.run(query).scalars())
            yield from got
            if len(got) < page:
                return
            after = got[-1]

    def outside(self, table: Table, window: OffsetRange, ranges: Sequence[OffsetRange],
                keep: int) -> tuple[int, list[int]]:
        """Offsets ``table`` holds inside ``window`` that none of ``ranges`` covers: how
        many, and the first ``keep`` of them."""
        offset = table.c["offset"]
        where = [in_range(table, window)]
        if ranges:
            where.append(not_(or_(*(and_(offset >= r.from_offset, offset < r.until_offset)
                                    for r in ranges))))
        if (owned := self._owned(table)) is not None:
            where.append(owned)
        count = self.run(select(func.count()).select_from(table).where(*where)).scalar_one()
        first = list(self.run(select(offset).where(*where).order_by(offset).limit(keep))
                     .scalars()) if count else []
        return count, first
