"""A dead-letter replay's statements inside its one transaction (driver/replay.py): keep the
chosen dead letters (locked, unless a dry run), page through their bytes, move the ones that
became rows to pipeline_dead_letters_replayed, give the ones that still fail their new
reason; or, for a dry run, count what that would do."""

from __future__ import annotations

from collections.abc import Iterator

from psycopg import sql
from sqlalchemy.schema import CreateTable

from pipeline.store import tables
from pipeline.store.dead_letters import KEY, DeadLetterFilter, DeadLetters
from pipeline.store.identifiers import identifiers
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters

CHOSEN = "_replay_chosen"  # temp tables of a replay, dropped at COMMIT
REFAILED = "_replay_dead"
PAGE = 5_000
# A re-failed dead letter (r) whose stored one (d) has another reason.
_CHANGED = sql.SQL(
    "d.pipeline = %s AND (d.topic, d.\"partition\", d.\"offset\") = (r.topic, "
    "r.\"partition\", r.\"offset\") AND (d.error_type, d.error_message) IS DISTINCT FROM "
    "(r.error_type, r.error_message)")


class Replay:
    """A replay's statements on the Store's session (``store.replay``)."""

    def __init__(self, db: Session, dead: DeadLetters):
        self.db, self.dead = db, dead

    def choose(self, f: DeadLetterFilter, lock: bool = True) -> int:
        """Keep the chosen dead letters' keys; how many. ``lock``: FOR UPDATE (a concurrent
        replay of the same offsets waits, then sees them gone); a dry run locks nothing."""
        where, params = f.where(self.db.pipeline)
        return self.db.execute(sql.SQL(
            "CREATE TEMP TABLE {chosen} ON COMMIT DROP AS WITH c AS ({locked}) SELECT * "
            "FROM c").format(chosen=sql.Identifier(CHOSEN),
                             locked=self.dead.chosen_sql(f, identifiers(KEY), where, lock=lock)),
            params).rowcount

    def chosen_pages(self, page: int = PAGE) -> Iterator[list[tuple]]:
        """The chosen dead letters' records, in (topic, partition, offset) order, a page at
        a time (keyset: bounded memory): topic, partition, offset, key, value, headers,
        the Kafka timestamp in epoch ms (exact for any year; NULL if it was none Postgres
        holds) and the stored error_type and error_message."""
        after: tuple = ("", -1, -1)
        while True:
            rows = self.db.execute(sql.SQL(
                "SELECT d.topic, d.\"partition\", d.\"offset\", d.key, d.value, d.headers, "
                "(extract(epoch FROM d.kafka_timestamp) * 1000)::bigint, d.error_type, "
                "d.error_message FROM {dl} AS d JOIN {chosen} AS c USING "
                "(topic, \"partition\", \"offset\") WHERE d.pipeline = %s AND "
                "(d.topic, d.\"partition\", d.\"offset\") > (%s, %s, %s) ORDER BY 1, 2, 3 "
                "LIMIT %s").format(dl=self.db.t(dead_letters.name), chosen=sql.Identifier(CHOSEN)),
                (self.db.pipeline, *after, page)).fetchall()
            if rows:
                yield rows
            if len(rows) < page:
                return
            after = rows[-1][:3]

    def refailed_table(self) -> None:
        """The temp table that takes the dead-letter lines of what still fails."""
        self.db.run(CreateTable(tables.dead_letter_batch(REFAILED)))

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
        return self.dead.move_of_rows(run_id, self._replayed_rows())

    def update_refailed(self) -> int:
        """The ones that still fail keep their row (and the run that first wrote it); their
        reason becomes today's if it changed. How many changed."""
        return self.db.execute(sql.SQL(
            "UPDATE {dl} AS d SET error_type = r.error_type, error_message = "
            "r.error_message, failed_at = now() FROM {refailed} AS r WHERE {changed}").format(
            dl=self.db.t(dead_letters.name), refailed=sql.Identifier(REFAILED),
            changed=_CHANGED), (self.db.pipeline,)).rowcount

    def count_replayed(self) -> int:
        """A dry run: how many ``move_replayed`` would move (nothing is locked or moved)."""
        return self.db.execute(sql.SQL("SELECT count(*) FROM ({}) AS m").format(
            self._replayed_rows())).fetchone()[0]

    def count_refailed_changed(self) -> int:
        """A dry run: how many reasons ``update_refailed`` would change."""
        return self.db.execute(sql.SQL(
            "SELECT count(*) FROM {dl} AS d JOIN {refailed} AS r ON {changed}").format(
            dl=self.db.t(dead_letters.name), refailed=sql.Identifier(REFAILED),
            changed=_CHANGED), (self.db.pipeline,)).fetchone()[0]

