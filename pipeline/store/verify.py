"""What ``pipeline verify`` reads: the ranges succeeded runs published, the runs that
archived a recreated topic, the partitions the results and dead-letter tables hold rows of,
and the offsets they hold, paged by offset (keyset: an index range scan per page, bounded
memory, no server-side cursor)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql
from sqlalchemy import Table, and_, func, not_, or_, select

from pipeline.plan.offsets import OffsetRange
from pipeline.store.results import in_range
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters, offsets, runs

PUBLISHING_KINDS = ("ingest", "backfill", "reprocess")
PAGE = 10_000

# The distinct partitions of a table keyed by (topic, partition, offset): one index probe per
# partition (a loose index scan), not a scan of every row.
_PARTITIONS = """
WITH RECURSIVE tp AS (
    (SELECT topic, "partition" FROM {table} WHERE {owned} ORDER BY topic, "partition" LIMIT 1)
  UNION ALL
    SELECT n.topic, n."partition" FROM tp CROSS JOIN LATERAL (
        SELECT t.topic, t."partition" FROM {table} t
         WHERE {owned} AND (t.topic, t."partition") > (tp.topic, tp."partition")
         ORDER BY t.topic, t."partition" LIMIT 1) n
)
SELECT topic, "partition" FROM tp
"""
_PARTITION_PLANS = """
SELECT r.run_id, e.planned, r.details->'transactions'->'cut' FROM {runs} r
 CROSS JOIN LATERAL jsonb_array_elements(r.planned) AS e(planned)
 WHERE r.pipeline = %s AND r.status = 'succeeded' AND r.kind = ANY(%s)
   AND e.planned->>'topic' = %s AND (e.planned->>'partition')::int = %s
 ORDER BY r.run_id
"""


class Verification:
    """What verify reads, on the Store's session (``store.verification``), inside its
    snapshot (``Store.snapshot``): the run rows and the tables as of one moment."""

    def __init__(self, db: Session):
        self.db = db

    def published_plans(self, tp: tuple[str, int] | None = None
                        ) -> list[tuple[int, list[dict[str, Any]]]]:
        """(run_id, published ranges) of every succeeded run that wrote rows, oldest first;
        given ``tp``, only the runs that planned that partition, with its range only. A
        run cut at whole source transactions published its planned ranges up to its cut
        (details.transactions.cut): the rest was read again by the next run."""
        if tp is not None:
            plans: dict[int, list[dict[str, Any]]] = {}
            for run_id, planned, cut in self.db.execute(sql.SQL(_PARTITION_PLANS).format(
                    runs=self.db.t(runs.name)), (self.db.pipeline, list(PUBLISHING_KINDS), *tp)):
                plans.setdefault(run_id, []).extend(_up_to_cut([planned], cut))
            return list(plans.items())
        return [(row.run_id, _up_to_cut(row.planned, row.cut)) for row in self.db.run(
            select(runs.c.run_id, runs.c.planned,
                   runs.c.details["transactions"]["cut"].label("cut"))
            .where(runs.c.pipeline == self.db.pipeline, runs.c.status == "succeeded",
                   runs.c.kind.in_(PUBLISHING_KINDS))
            .order_by(runs.c.run_id))]

    def stored_offsets(self, tp: tuple[str, int] | None = None
                       ) -> dict[tuple[str, int], tuple[int, int | None]]:
        """Each partition's (or only ``tp``'s) stored next offset and the run that wrote
        it."""
        where = [offsets.c.pipeline == self.db.pipeline]
        if tp is not None:
            where += [offsets.c.topic == tp[0], offsets.c.partition == tp[1]]
        return {(r.topic, r.partition): (r.next_offset, r.run_id) for r in self.db.run(
            select(offsets.c.topic, offsets.c.partition, offsets.c.next_offset,
                   offsets.c.run_id).where(*where))}

    def table_partitions(self, results: Sequence[Table]) -> set[tuple[str, int]]:
        """Every (topic, partition) the ``results`` tables or the pipeline's dead letters
        hold a row of: rows of a partition no run published are verify's to find too."""
        out: set[tuple[str, int]] = set()
        for table in (*results, dead_letters):
            owned = sql.SQL("pipeline = %(pipeline)s" if table is dead_letters else "true")
            out.update(map(tuple, self.db.execute(sql.SQL(_PARTITIONS).format(
                table=self.db.t(table.name), owned=owned), {"pipeline": self.db.pipeline})))
        return out

    def offset_writers(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """run id -> its kind, status, planned ranges and details (the runs that wrote the
        stored offsets)."""
        if not run_ids:
            return {}
        return {r.run_id: {"kind": r.kind, "status": r.status, "planned": r.planned or [],
                           "details": r.details or {}} for r in self.db.run(
            select(runs.c.run_id, runs.c.kind, runs.c.status, runs.c.planned, runs.c.details)
            .where(runs.c.pipeline == self.db.pipeline, runs.c.run_id.in_(sorted(set(run_ids)))))}

    def archiving_runs(self) -> dict[str, int]:
        """topic -> the newest offsets run that archived its rows (a recreated topic)."""
        out: dict[str, int] = {}
        for run_id, archived in self.db.run(
                select(runs.c.run_id, runs.c.details["archived"])
                .where(runs.c.pipeline == self.db.pipeline, runs.c.kind == "offsets",
                       runs.c.status == "succeeded",
                       runs.c.details.has_key("archived"))  # noqa: W601 - JSONB ?, not dict
                .order_by(runs.c.run_id)):
            for topic in archived or {}:
                out[topic] = run_id
        return out

    def _owned(self, table: Table):
        return dead_letters.c.pipeline == self.db.pipeline if table is dead_letters else None

    def offsets_in(self, table: Table, r: OffsetRange, page: int = PAGE) -> Iterator[int]:
        """The offsets ``table`` holds inside ``r``, ascending, read a page at a time."""
        offset = table.c["offset"]
        after = r.from_offset - 1
        while True:
            query = (select(offset).where(in_range(table, r), offset > after)
                     .order_by(offset).limit(page))
            if (owned := self._owned(table)) is not None:
                query = query.where(owned)
            got = list(self.db.run(query).scalars())
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
        count = self.db.run(select(func.count()).select_from(table).where(*where)).scalar_one()
        first = list(self.db.run(select(offset).where(*where).order_by(offset).limit(keep))
                     .scalars()) if count else []
        return count, first


def _up_to_cut(planned: list[dict[str, Any]] | None, cut: list[dict[str, Any]] | None
               ) -> list[dict[str, Any]]:
    """A run's planned ranges, each ended at its cut where the run cut it short."""
    until = {(c["topic"], c["partition"]): c["until"] for c in cut or ()}
    return [{**d, "until": until.get((d["topic"], d["partition"]), d["until"])}
            for d in planned or ()]
