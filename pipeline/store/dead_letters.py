"""What ``pipeline dead-letters`` reads and writes: the pipeline's dead letters by type and
range, and a replay's statements inside its one transaction (driver/replay.py): lock the
chosen dead letters, page through their bytes, move the ones that became rows to
pipeline_dead_letters_replayed, give the ones that still fail their new reason.

Moving a dead letter whose offset became a row (``move_dead_letters_of_rows``) is the one
way a dead letter leaves for a row, whichever run wrote the row: a replay, a backfill, a
reprocess or an ingest (driver/publish.py). Every publishing transaction does it, and
writes its own dead letters, under the dead-letter lock (``lock_dead_letters``), taken after
its writes to the results table: two runs that publish the same offsets at once (an ingest
and a backfill) then see each other's rows and dead letters, so an offset never ends up
both a row and a dead letter (invariant 8)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy.schema import CreateTable

from pipeline.plan.offsets import OffsetRange
from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters, dead_letters_replayed

CHOSEN = "_replay_chosen"  # temp tables of a replay, dropped at COMMIT
REFAILED = "_replay_dead"
PAGE = 5_000
_KEY = ("topic", "partition", "offset")
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


_NEWEST = sql.SQL('failed_at DESC, topic, "partition", "offset" DESC')


class DeadLetterRows(Session):
    # ---- list ---------------------------------------------------------------------------
    def dead_letter_counts(self, f: DeadLetterFilter) -> list[dict[str, Any]]:
        """Per error type: how many, over how many partitions, first and last failed_at."""
        where, params = f.where(self.pipeline)
        source = self._chosen_sql(f, sql.SQL("*"), where)
        rows = self.execute(sql.SQL(
            "SELECT error_type, count(*), count(DISTINCT (topic, \"partition\")), "
            "min(failed_at), max(failed_at) FROM ({}) AS d GROUP BY 1 ORDER BY 2 DESC, 1"
        ).format(source), params).fetchall()
        return [dict(zip(("error_type", "count", "partitions", "first_failed_at",
                          "last_failed_at"), r, strict=True)) for r in rows]

    def newest_dead_letters(self, f: DeadLetterFilter, n: int) -> list[dict[str, Any]]:
        where, params = f.where(self.pipeline)
        names = ["topic", "partition", "offset", "error_type", "error_message", "run_id",
                 "failed_at", "kafka_timestamp"]
        rows = self.execute(sql.SQL(
            "SELECT {cols}, octet_length(value) FROM {dl} WHERE {where} ORDER BY {newest} "
            "LIMIT %s").format(cols=identifiers(names), dl=self.t(dead_letters.name),
                               where=where, newest=_NEWEST), [*params, n]).fetchall()
        return [dict(zip([*names, "value_bytes"], r, strict=True)) for r in rows]

    def _chosen_sql(self, f: DeadLetterFilter, cols: sql.Composable, where: sql.Composable,
                    lock: bool = False) -> sql.Composed:
        return sql.SQL("SELECT {cols} FROM {dl} WHERE {where}{order}{lock}").format(
            cols=cols, dl=self.t(dead_letters.name), where=where,
            order=sql.SQL(" ORDER BY {} LIMIT {}").format(_NEWEST, sql.Literal(f.last))
            if f.last else sql.SQL(""),
            lock=sql.SQL(" FOR UPDATE") if lock else sql.SQL(""))

    # ---- replay (inside its transaction) ------------------------------------------------
    def choose_dead_letters(self, f: DeadLetterFilter, lock: bool = True) -> int:
        """Keep the chosen dead letters' keys; how many. ``lock``: FOR UPDATE (a concurrent
        replay of the same offsets waits, then sees them gone); a dry run locks nothing."""
        where, params = f.where(self.pipeline)
        return self.execute(sql.SQL(
            "CREATE TEMP TABLE {chosen} ON COMMIT DROP AS WITH c AS ({locked}) SELECT * "
            "FROM c").format(chosen=sql.Identifier(CHOSEN),
                             locked=self._chosen_sql(f, identifiers(_KEY), where, lock=lock)),
            params).rowcount

    def chosen_pages(self, page: int = PAGE) -> Iterator[list[tuple]]:
        """The chosen dead letters' records, in (topic, partition, offset) order, a page at
        a time (keyset: bounded memory): topic, partition, offset, key, value, headers,
        the Kafka timestamp in epoch ms (exact for any year; NULL if it was none Postgres
        holds) and the stored error_type and error_message."""
        after: tuple = ("", -1, -1)
        while True:
            rows = self.execute(sql.SQL(
                "SELECT d.topic, d.\"partition\", d.\"offset\", d.key, d.value, d.headers, "
                "(extract(epoch FROM d.kafka_timestamp) * 1000)::bigint, d.error_type, "
                "d.error_message FROM {dl} AS d JOIN {chosen} AS c USING "
                "(topic, \"partition\", \"offset\") WHERE d.pipeline = %s AND "
                "(d.topic, d.\"partition\", d.\"offset\") > (%s, %s, %s) ORDER BY 1, 2, 3 "
                "LIMIT %s").format(dl=self.t(dead_letters.name), chosen=sql.Identifier(CHOSEN)),
                (self.pipeline, *after, page)).fetchall()
            if rows:
                yield rows
            if len(rows) < page:
                return
            after = rows[-1][:3]

    def refailed_table(self) -> None:
        """The temp table that takes the dead-letter lines of what still fails."""
        self.run(CreateTable(tables.dead_letter_batch(REFAILED)))

    # ---- a dead letter whose offset became a row (a replay, or any publishing run) -----
    def lock_dead_letters(self, conn) -> None:
        """The dead-letter lock, until COMMIT: taken after the run's writes to the results
        table, before its statements on the dead letters (the one lock order: the sink's
        merge lock, the results, this lock, the dead letters)."""
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                     (DEAD_LETTER_LOCK_CLASS, self.pipeline))

    def dead_letters_in_ranges(self, ranges: Sequence[OffsetRange]) -> bool:
        """Does any dead letter lie inside the ranges? (an index probe per range: an
        ingest's new offsets hold none)"""
        if not ranges:
            return False
        g, params = in_ranges(ranges)
        return self.execute(sql.SQL(
            "SELECT EXISTS (SELECT FROM {g} JOIN {dl} AS d ON d.pipeline = %s AND {in_g})"
        ).format(g=g, dl=self.t(dead_letters.name), in_g=_IN_G),
            [*params, self.pipeline]).fetchone()[0]

    def move_dead_letters_of_rows(self, run_id: int, rows: sql.Composable,
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
        return self.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {dl} AS d{using} WHERE d.pipeline = %s{where} AND "
            "(d.topic, d.\"partition\", d.\"offset\") IN ({rows}) RETURNING d.*) "
            "INSERT INTO {replayed} ({cols}, replayed_run_id) SELECT {cols}, %s FROM moved "
            "ORDER BY {key}").format(
            dl=self.t(dead_letters.name), using=using, where=where, rows=rows,
            replayed=self.t(dead_letters_replayed.name), cols=cols, key=identifiers(_KEY)),
            [*params, self.pipeline, run_id]).rowcount

    def clear_dead_letters(self, ranges: Sequence[OffsetRange]) -> int:
        """A reprocess: the dead letters its ranges still hold (records that fail again, or
        that a transform now filters out) are deleted; its own replace them."""
        if not ranges:
            return 0
        g, params = in_ranges(ranges)
        return self.execute(sql.SQL("DELETE FROM {dl} AS d USING {g} WHERE d.pipeline = %s "
                                    "AND {in_g}").format(dl=self.t(dead_letters.name), g=g,
                                                         in_g=_IN_G),
                            [*params, self.pipeline]).rowcount

    def _replayed_rows(self) -> sql.Composed:
        """The chosen dead letters that became rows: not among the re-failed."""
        return sql.SQL(
            "SELECT c.topic, c.\"partition\", c.\"offset\" FROM {chosen} AS c WHERE NOT "
            "EXISTS (SELECT FROM {refailed} AS r WHERE (r.topic, r.\"partition\", r.\"offset\") "
            "= (c.topic, c.\"partition\", c.\"offset\"))").format(
            chosen=sql.Identifier(CHOSEN), refailed=sql.Identifier(REFAILED))

    def move_replayed(self, run_id: int) -> int:
        """The chosen dead letters that became rows (not among the re-failed), moved to
        pipeline_dead_letters_replayed; how many."""
        return self.move_dead_letters_of_rows(run_id, self._replayed_rows())

    _CHANGED = sql.SQL(
        "d.pipeline = %s AND (d.topic, d.\"partition\", d.\"offset\") = (r.topic, "
        "r.\"partition\", r.\"offset\") AND (d.error_type, d.error_message) IS DISTINCT FROM "
        "(r.error_type, r.error_message)")

    def update_refailed(self) -> int:
        """The ones that still fail keep their row (and the run that first wrote it); their
        reason becomes today's if it changed. How many changed."""
        return self.execute(sql.SQL(
            "UPDATE {dl} AS d SET error_type = r.error_type, error_message = "
            "r.error_message, failed_at = now() FROM {refailed} AS r WHERE {changed}").format(
            dl=self.t(dead_letters.name), refailed=sql.Identifier(REFAILED),
            changed=self._CHANGED), (self.pipeline,)).rowcount

    def count_replayed(self) -> int:
        """A dry run: how many ``move_replayed`` would move (nothing is locked or moved)."""
        return self.execute(sql.SQL("SELECT count(*) FROM ({}) AS m").format(
            self._replayed_rows())).fetchone()[0]

    def count_refailed_changed(self) -> int:
        """A dry run: how many reasons ``update_refailed`` would change."""
        return self.execute(sql.SQL(
            "SELECT count(*) FROM {dl} AS d JOIN {refailed} AS r ON {changed}").format(
            dl=self.t(dead_letters.name), refailed=sql.Identifier(REFAILED),
            changed=self._CHANGED), (self.pipeline,)).fetchone()[0]

    def add_run_details(self, run_id: int, details: dict[str, Any]) -> None:
        from psycopg.types.json import Jsonb

        self.execute(sql.SQL("UPDATE {runs} SET details = coalesce(details, '{{}}') || %s "
                             "WHERE run_id = %s").format(runs=self.t(tables.runs.name)),
                     (Jsonb(details), run_id))

    def set_planned(self, run_id: int, ranges) -> None:
        """A replay's run row: the offsets its dead letters spanned (what `pipeline runs`
        shows), known only once they are read."""
        from psycopg.types.json import Jsonb

        self.execute(sql.SQL("UPDATE {runs} SET planned = %s WHERE run_id = %s").format(
            runs=self.t(tables.runs.name)),
            (Jsonb([r.as_dict(count=False) for r in ranges]), run_id))

    def finish_noop(self, run_id: int, timings: dict) -> None:
        """A replay that found nothing to replay."""
        from psycopg.types.json import Jsonb

        self.execute(sql.SQL(
            "UPDATE {runs} SET status = 'noop', finished_at = clock_timestamp(), "
            "exit_code = 0, "
            "records_read = 0, rows_written = 0, dead_letters = 0, timings = %s "
            "WHERE run_id = %s").format(runs=self.t(tables.runs.name)),
            (Jsonb(timings), run_id))
