"""The ledger of published ranges (pipeline_ranges, sql/006): written in the publishing
transaction from the staging table's range summaries (executor/staging.py, kind HASH) of the
attempts the publisher chose, read by ``pipeline verify`` (driver/ledger_check.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from psycopg import sql
from sqlalchemy import Table, and_, delete, func, or_, select, update

from pipeline.executor.content_hash import BLAKE2B
from pipeline.executor.staging import DEAD, HASH, ROW, TOMBSTONE
from pipeline.plan.offsets import OffsetRange
from pipeline.store.results import in_range
from pipeline.store.run import Run
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters, ranges


class LedgerRow(NamedTuple):
    run_id: int
    range: OffsetRange
    records: int
    rows: int
    dead_letters: int
    deletes: int
    skipped: int
    content_hash: bytes
    filtered: int = 0  # records a transform filtered out (in neither table)
    hash_kind: str = BLAKE2B


# One ledger row per range summary; its counts are those of the chosen attempts' blobs
# inside the range (a blob never spans two ranges: stage.range_stager makes them per range,
# transform/writer.blob_writer cuts a transform's rows by range). The built-in sinks' blobs are the
# summary's own attempt's; a transform's rows are staged by other tasks than its reads
# (executor/transform/feed.py), and what it filtered out is in neither table.
_RECORD = """
INSERT INTO {ranges} (pipeline, run_id, topic, "partition", from_offset, until_offset,
                      records, rows_written, dead_letters, deletes, skipped, filtered,
                      content_hash)
SELECT %(pipeline)s, %(run)s, h.topic, h."partition", h.min_offset, h.max_offset, h.n,
       coalesce(sum(b.n) FILTER (WHERE b.kind = %(row)s), 0),
       coalesce(sum(b.n) FILTER (WHERE b.kind = %(dead)s), 0),
       coalesce(sum(b.n) FILTER (WHERE b.kind = %(tombstone)s), 0),
       h.max_offset - h.min_offset - h.n,
       CASE WHEN %(transformed)s THEN greatest(h.n - coalesce(sum(b.n) FILTER (
            WHERE b.kind IN (%(row)s, %(dead)s)), 0), 0) ELSE 0 END,
       h.blob
  FROM {staging} h
  LEFT JOIN {staging} b
    ON {same_attempt} b.kind <> %(hash)s AND b.topic = h.topic
   AND b."partition" = h."partition" AND b.min_offset >= h.min_offset
   AND b.max_offset < h.max_offset
   AND (b.part, b.task) IN (SELECT * FROM unnest(%(parts)s::int[], %(tasks)s::bigint[]))
 WHERE h.kind = %(hash)s
   AND (h.part, h.task) IN (SELECT * FROM unnest(%(parts)s::int[], %(tasks)s::bigint[]))
 GROUP BY h.topic, h."partition", h.min_offset, h.max_offset, h.n, h.blob
"""


class Ledger:
    """The ledger on the Store's session (``store.ledger``)."""

    def __init__(self, db: Session):
        self.db = db

    def record(self, run: Run, parts: dict[int, int], transformed: bool = False) -> int:
        """In the open (publishing) transaction: the ledger rows of the chosen attempts
        (``parts``: Spark partition -> task attempt id); how many. ``transformed``: a user
        transform's run, whose rows are other attempts' than its range summaries and may
        be fewer than the records read (``filtered``)."""
        same = sql.SQL("" if transformed else "b.part = h.part AND b.task = h.task AND")
        return self.db.execute(sql.SQL(_RECORD).format(
            ranges=self.db.t(ranges.name), staging=run.staging, same_attempt=same), {
                "pipeline": self.db.pipeline, "run": run.id, "row": ROW, "dead": DEAD,
                "tombstone": TOMBSTONE, "hash": HASH, "parts": list(parts),
                "tasks": list(parts.values()), "transformed": transformed}).rowcount

    def cut_short(self, run: Run, cut: dict[OffsetRange, tuple[int, bytes, int, int, int]]
                  ) -> None:
        """In the open (publishing) transaction, after ``record``: the ledger rows of ranges
        a cut at whole source transactions published in part (driver/transaction_cut.py)
        become ``[from, cut)`` with its (records, content hash, rows, dead letters,
        deletes); a range of which nothing is published has no row."""
        c = ranges.c
        for r, (records, digest, rows, dead, deletes) in cut.items():
            row = and_(c.pipeline == self.db.pipeline, c.run_id == run.id,
                       c.topic == r.topic, c.partition == r.partition,
                       c.from_offset == r.from_offset)
            if r.count == 0:
                self.db.run(delete(ranges).where(row))
                continue
            self.db.run(update(ranges).where(row).values(
                until_offset=r.until_offset, records=records, content_hash=digest,
                rows_written=rows, dead_letters=dead, deletes=deletes,
                skipped=r.count - records, filtered=0))

    def rows(self, topic: str, partition: int, window: OffsetRange) -> Iterator[LedgerRow]:
        """The partition's ledger rows that overlap ``window``, by offset then run, a page
        at a time (keyset on (from_offset, run_id))."""
        c = ranges.c
        after = (-1, -1)
        while True:
            got = list(self.db.run(
                select(c.run_id, c.from_offset, c.until_offset, c.records, c.rows_written,
                       c.dead_letters, c.deletes, c.skipped, c.content_hash, c.filtered,
                       c.hash_kind)
                .where(c.pipeline == self.db.pipeline, c.topic == topic,
                       c.partition == partition, c.until_offset > window.from_offset,
                       c.from_offset < window.until_offset,
                       or_(c.from_offset > after[0],
                           and_(c.from_offset == after[0], c.run_id > after[1])))
                .order_by(c.from_offset, c.run_id).limit(1000)))
            for g in got:
                yield LedgerRow(g.run_id, OffsetRange(topic, partition, g.from_offset,
                                                      g.until_offset),
                                g.records, g.rows_written, g.dead_letters, g.deletes,
                                g.skipped, bytes(g.content_hash), g.filtered, g.hash_kind)
            if len(got) < 1000:
                return
            after = (got[-1].from_offset, got[-1].run_id)

    def table_counts(self, results: Table, r: OffsetRange) -> tuple[int, int]:
        """(result rows, dead letters) the tables hold inside ``r`` now (``results``: the
        results table the range's topic is published into)."""
        rows = self.db.run(select(func.count()).select_from(results)
                           .where(in_range(results, r))).scalar_one()
        dead = self.db.run(select(func.count()).select_from(dead_letters).where(
            in_range(dead_letters, r), dead_letters.c.pipeline == self.db.pipeline)
        ).scalar_one()
        return rows, dead
