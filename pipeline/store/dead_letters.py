"""The pipeline's dead letters (pipeline_dead_letters): what ``pipeline dead-letters`` lists,
and the statements of every publishing transaction on them.

Moving a dead letter whose offset became a row (``move_of_rows``) is the one way a dead
letter leaves for a row, whichever run wrote the row: a replay (store/replay.py), a
backfill, a reprocess or an ingest (driver/publish.py). Every publishing transaction does
it, and writes its own dead letters (``merge_sql``: never beside a row of a results table),
under the dead-letter lock (``lock``), taken after its writes to the results tables: two
runs that publish the same offsets at once (an ingest and a backfill) then see each other's
rows and dead letters, so an offset never ends up both a row and a dead letter
(invariant 8)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from pipeline.plan.offsets import OffsetRange
from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.results import Sink, names_records
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters, dead_letters_replayed

KEY = ("topic", "partition", "offset")
# Transaction advisory lock of the statements on a pipeline's dead letters in a publishing
# transaction (store.LOCK_CLASS + 2; the upsert merge lock is + 1).
DEAD_LETTER_LOCK_CLASS = 7_400_003


def in_ranges(ranges: Sequence[OffsetRange]) -> tuple[sql.Composable, list[Any]]:
    """``unnest(...) AS g`` to join ``d`` (dead letters) with: the ranges as four arrays, one
    parameter each however many ranges; the join condition is ``_IN_G``."""
    return (sql.SQL("unnest(%s::text[], %s::int[], %s::bigint[], %s::bigint[]) AS g(topic, "
                    "p, lo, hi)"),
            [[r.topic for r in ranges], [r.partition for r in ranges],
             [r.from_offset for r in ranges], [r.until_offset for r in ranges]])


_IN_G = sql.SQL('d.topic = g.topic AND d."partition" = g.p AND d."offset" >= g.lo AND '
                'd."offset" < g.hi')


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters: by type, topic, partition, offsets [from, to), and the ``last``
    N newest (by failed_at, then offset)."""

    error_type: str | None = None
    topic: str | None = None
    partition: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None  # exclusive
    last: int | None = None

    def where(self, pipeline: str) -> tuple[sql.Composable, list[Any]]:
        conds, params = [sql.SQL("pipeline = %s")], [pipeline]
        for column, op, value in (("error_type", "=", self.error_type),
                                  ("topic", "=", self.topic),
                                  ("partition", "=", self.partition),
                                  ("offset", ">=", self.from_offset),
                                  ("offset", "<", self.to_offset)):
            if value is not None:
                conds.append(sql.SQL("{} " + op + " %s").format(sql.Identifier(column)))
                params.append(value)
        return sql.SQL(" AND ").join(conds), params

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


NEWEST = sql.SQL('failed_at DESC, topic, "partition", "offset" DESC')


class DeadLetters:
    """The dead-letter statements of the Store's session (``store.dead_letters``)."""

    def __init__(self, db: Session):
        self.db = db

    # ---- list ---------------------------------------------------------------------------
    def counts(self, f: DeadLetterFilter) -> list[dict[str, Any]]:
        """Per error type: how many, over how many partitions, first and last failed_at."""
        where, params = f.where(self.db.pipeline)
        source = self.chosen_sql(f, sql.SQL("*"), where)
        rows = self.db.execute(sql.SQL(
            "SELECT error_type, count(*), count(DISTINCT (topic, \"partition\")), "
            "min(failed_at), max(failed_at) FROM ({}) AS d GROUP BY 1 ORDER BY 2 DESC, 1"
        ).format(source), params).fetchall()
        return [dict(zip(("error_type", "count", "partitions", "first_failed_at",
                          "last_failed_at"), r, strict=True)) for r in rows]

    def newest(self, f: DeadLetterFilter, n: int) -> list[dict[str, Any]]:
        where, params = f.where(self.db.pipeline)
        names = ["topic", "partition", "offset", "error_type", "error_message", "run_id",
                 "failed_at", "kafka_timestamp"]
        rows = self.db.execute(sql.SQL(
            "SELECT {cols}, octet_length(value) FROM {dl} WHERE {where} ORDER BY {newest} "
            "LIMIT %s").format(cols=identifiers(names), dl=self.db.t(dead_letters.name),
                               where=where, newest=NEWEST), [*params, n]).fetchall()
        return [dict(zip([*names, "value_bytes"], r, strict=True)) for r in rows]

    def chosen_sql(self, f: DeadLetterFilter, cols: sql.Composable, where: sql.Composable,
                   lock: bool = False) -> sql.Composed:
        """The dead letters ``f`` chooses (``where``: its condition), newest first when it
        keeps the ``last`` N; ``lock``: FOR UPDATE."""
        return sql.SQL("SELECT {cols} FROM {dl} WHERE {where}{order}{lock}").format(
            cols=cols, dl=self.db.t(dead_letters.name), where=where,
            order=sql.SQL(" ORDER BY {} LIMIT {}").format(NEWEST, sql.Literal(f.last))
            if f.last else sql.SQL(""),
            lock=sql.SQL(" FOR UPDATE") if lock else sql.SQL(""))

    # ---- in a publishing transaction ---------------------------------------------------
    def lock(self, conn) -> None:
        """The dead-letter lock, until COMMIT: taken after the run's writes to the results
        table, before its statements on the dead letters (the one lock order: the sink's
        merge lock, the results, this lock, the dead letters)."""
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                     (DEAD_LETTER_LOCK_CLASS, self.db.pipeline))

    def in_ranges(self, ranges: Sequence[OffsetRange]) -> bool:
        """Does any dead letter lie inside the ranges? (an index probe per range: an
        ingest's new offsets hold none)"""
        if not ranges:
            return False
        g, params = in_ranges(ranges)
        return self.db.execute(sql.SQL(
            "SELECT EXISTS (SELECT FROM {g} JOIN {dl} AS d ON d.pipeline = %s AND {in_g})"
        ).format(g=g, dl=self.db.t(dead_letters.name), in_g=_IN_G),
            [*params, self.db.pipeline]).fetchone()[0]

    def move_of_rows(self, run_id: int, rows: sql.Composable,
                     ranges: Sequence[OffsetRange] | None = None) -> int:
        """The dead letters whose offsets are rows now (``rows``: a query of topic,
        partition, offset), inside ``ranges`` if given, moved to
        pipeline_dead_letters_replayed with the run that wrote the rows; how many."""
        cols = identifiers(c.name for c in dead_letters.columns)
        if ranges is not None:
            g, params = in_ranges(ranges)
            using, where = sql.SQL(" USING {}").format(g), sql.SQL(" AND {}").format(_IN_G)
        else:
            using, where, params = sql.SQL(""), sql.SQL(""), []
        return self.db.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {dl} AS d{using} WHERE d.pipeline = %s{where} AND "
            "(d.topic, d.\"partition\", d.\"offset\") IN ({rows}) RETURNING d.*) "
            "INSERT INTO {replayed} ({cols}, replayed_run_id) SELECT {cols}, %s FROM moved "
            "ORDER BY {key}").format(
            dl=self.db.t(dead_letters.name), using=using, where=where, rows=rows,
            replayed=self.db.t(dead_letters_replayed.name), cols=cols, key=identifiers(KEY)),
            [*params, self.db.pipeline, run_id]).rowcount

    def clear(self, ranges: Sequence[OffsetRange]) -> int:
        """A reprocess: the dead letters its ranges still hold (records that fail again, or
        that a transform now filters out) are deleted; its own replace them."""
        if not ranges:
            return 0
        g, params = in_ranges(ranges)
        return self.db.execute(sql.SQL(
            "DELETE FROM {dl} AS d USING {g} WHERE d.pipeline = %s AND {in_g}").format(
                dl=self.db.t(dead_letters.name), g=g, in_g=_IN_G),
            [*params, self.db.pipeline]).rowcount

    def _beside_a_row(self, sinks: Sequence[Sink]) -> sql.Composable | None:
        """'A row of a results table has the offset of staged dead letter s' (None: no
        table's rows name their records)."""
        tests = [sql.SQL("EXISTS (SELECT FROM {res} AS r WHERE r.topic = s.topic AND "
                         "r.\"partition\" = s.\"partition\" AND r.\"offset\" = s.\"offset\")"
                         ).format(res=self.db.t(sink.results.name))
                 for sink in sinks if names_records(sink.results)]
        return sql.SQL(" OR ").join(tests) if tests else None

    def merge_sql(self, source: str, overwrite: bool, sinks: Sequence[Sink]) -> sql.Composed:
        """The staged dead letters of a run (in temp table ``source``) into
        pipeline_dead_letters: kept if already there, replaced on reprocess. Never beside a
        row of the sinks' results tables: a record whose offset has a results row (a
        backfill re-reading it under an older config, say) keeps its row and gets no dead
        letter - an offset lives in one place (a reprocess cleared its ranges' rows first,
        so it replaces them). Parameters: the pipeline, the run's id."""
        beside = self._beside_a_row(sinks)
        return sql.SQL(
            "INSERT INTO {dl} (pipeline, {cols}, run_id) SELECT DISTINCT ON ({key}) "
            "%s, {cols}, %s FROM {src} AS s{not_beside} ON CONFLICT (pipeline, {key}) DO "
            "{action}").format(
            dl=self.db.t(dead_letters.name), src=sql.Identifier(source),
            not_beside=sql.SQL("") if beside is None else
            sql.SQL(" WHERE NOT ({})").format(beside),
            cols=identifiers(c.name for c in tables.DEAD_LETTER_FIELDS),
            key=identifiers(c.name for c in dead_letters.primary_key if c.name != "pipeline"),
            action=sql.SQL("UPDATE SET error_type = EXCLUDED.error_type, error_message "
                           "= EXCLUDED.error_message, run_id = EXCLUDED.run_id, "
                           "failed_at = now()") if overwrite else sql.SQL("NOTHING"))

    def beside_rows(self, source: str, sinks: Sequence[Sink], first: int = 5
                    ) -> tuple[int, list[tuple[str, int, int]]]:
        """The staged dead letters (temp table ``source``) whose offsets have a row in a
        results table of ``sinks``: what merge_sql leaves out (how many, and the first
        few), for the log."""
        beside = self._beside_a_row(sinks)
        if beside is None:
            return 0, []
        found = self.db.execute(sql.SQL(
            "SELECT count(*) OVER (), s.topic, s.\"partition\", s.\"offset\" FROM {src} AS s "
            "WHERE {beside} ORDER BY 2, 3, 4 LIMIT %s").format(
                src=sql.Identifier(source), beside=beside), (first,)).fetchall()
        return (found[0][0] if found else 0), [tuple(r[1:]) for r in found]
