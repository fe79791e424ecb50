"""What ``pipeline dead-letters`` reads and writes: the pipeline's dead letters by type and
range, and a replay's statements inside its one transaction (driver/replay.py): lock the
chosen dead letters, page through their bytes, move the ones that became rows to
pipeline_dead_letters_replayed, give the ones that still fail their new reason."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy.schema import CreateTable

from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters, dead_letters_replayed

CHOSEN = "_replay_chosen"  # temp tables of a replay, dropped at COMMIT
REFAILED = "_replay_dead"
PAGE = 5_000
_KEY = ("topic", "partition", "offset")


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
    def choose_dead_letters(self, f: DeadLetterFilter) -> int:
        """Lock the chosen dead letters (FOR UPDATE: a concurrent reprocess or replay of
        the same offsets waits, then sees them gone) and keep their keys; how many."""
        where, params = f.where(self.pipeline)
        return self.execute(sql.SQL(
            "CREATE TEMP TABLE {chosen} ON COMMIT DROP AS WITH c AS ({locked}) SELECT * "
            "FROM c").format(chosen=sql.Identifier(CHOSEN),
                             locked=self._chosen_sql(f, identifiers(_KEY), where, lock=True)),
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

    def move_replayed(self, run_id: int) -> int:
        """The chosen dead letters that became rows (not among the re-failed), moved to
        pipeline_dead_letters_replayed; how many."""
        cols = identifiers(c.name for c in dead_letters.columns)
        key = identifiers(_KEY)
        return self.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {dl} AS d USING {chosen} AS c WHERE d.pipeline = %s "
            "AND (d.topic, d.\"partition\", d.\"offset\") = (c.topic, c.\"partition\", "
            "c.\"offset\") AND NOT EXISTS (SELECT FROM {refailed} AS r WHERE "
            "(r.topic, r.\"partition\", r.\"offset\") = (c.topic, c.\"partition\", "
            "c.\"offset\")) RETURNING d.*) INSERT INTO {replayed} ({cols}, replayed_run_id) "
            "SELECT {cols}, %s FROM moved ORDER BY {key}").format(
            dl=self.t(dead_letters.name), chosen=sql.Identifier(CHOSEN),
            refailed=sql.Identifier(REFAILED), replayed=self.t(dead_letters_replayed.name),
            cols=cols, key=key), (self.pipeline, run_id)).rowcount

    def update_refailed(self) -> int:
        """The ones that still fail keep their row (and the run that first wrote it); their
        reason becomes today's if it changed. How many changed."""
        return self.execute(sql.SQL(
            "UPDATE {dl} AS d SET error_type = r.error_type, error_message = "
            "r.error_message, failed_at = now() FROM {refailed} AS r WHERE d.pipeline = %s "
            "AND (d.topic, d.\"partition\", d.\"offset\") = (r.topic, r.\"partition\", "
            "r.\"offset\") AND (d.error_type, d.error_message) IS DISTINCT FROM "
            "(r.error_type, r.error_message)").format(
            dl=self.t(dead_letters.name), refailed=sql.Identifier(REFAILED)),
            (self.pipeline,)).rowcount

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
            "UPDATE {runs} SET status = 'noop', finished_at = now(), exit_code = 0, "
            "records_read = 0, rows_written = 0, dead_letters = 0, timings = %s "
            "WHERE run_id = %s").format(runs=self.t(tables.runs.name)),
            (Jsonb(timings), run_id))
