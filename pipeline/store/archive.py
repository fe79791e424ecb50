"""A topic deleted and recreated under the same name reuses its offsets: before the new
topic is read ('pipeline offsets reset'), the old topic's rows and dead letters move to
archive tables, so that the new records are written, not taken as present. What the sink
keeps or drops is the sink's policy (Sink.archive_recreated)."""

from __future__ import annotations

import logging

from psycopg import sql
from sqlalchemy.schema import CreateColumn

from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters

log = logging.getLogger(__name__)

# What an archive row adds (topic_id, archived_by_run; archived_at defaults), in that order.
_ARCHIVE_ORIGIN = identifiers(c.name for c in tables.RESULTS_ARCHIVE_COLUMNS
                              if c.name != "archived_at")


class Archive(Session):
    def archive_table(self) -> str:
        return f"{self.settings.sink.table}_archived"

    def archive_topic(self, conn, topic: str, old_id: str, run_id: int) -> dict[str, int]:
        """Move a recreated topic's result rows (as its sink says) and dead letters to the
        archive tables, in the caller's transaction."""
        rows = self.sink.archive_recreated(
            conn, topic, lambda: self._archive_results(conn, topic, old_id, run_id))
        dcols = identifiers(c.name for c in dead_letters.columns)
        dead_rows = conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {dl} WHERE pipeline = %s AND topic = %s "
            "RETURNING {cols}) INSERT INTO {arc} ({cols}, {arc_cols}) "
            "SELECT {cols}, %s, %s FROM moved").format(
            dl=self.t(dead_letters.name), arc=self.t(tables.dead_letters_archived.name),
            cols=dcols, arc_cols=_ARCHIVE_ORIGIN), (self.pipeline, topic, old_id, run_id)
        ).rowcount
        log.warning("topic '%s' was recreated: archived %d result rows to %s and %d dead "
                    "letters to pipeline_dead_letters_archived (old topic ID %s)", topic, rows,
                    self.archive_table(), dead_rows, old_id)
        return {"topic_id": old_id, "rows": rows, "dead_letters": dead_rows}

    def _archive_results(self, conn, topic: str, old_id: str, run_id: int) -> int:
        results = self.t(self.settings.sink.table)
        archive = self.t(self.archive_table())
        # The live columns, in Postgres's own spelling (they may include columns added by
        # hand, of any type): the archive takes each of them.
        columns = [(name, ftype) for name, ftype in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
            "attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f'"{self.settings.schema}"."{self.settings.sink.table}"',)).fetchall()]
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS)")
                     .format(archive, results))
        # A column added to the results table since the archive was created is added here.
        conn.execute(sql.SQL("ALTER TABLE {} {}").format(archive, sql.SQL(", ").join(
            [sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(n), sql.SQL(t))
             for n, t in columns] + [
                sql.SQL("ADD COLUMN IF NOT EXISTS {}").format(sql.SQL(str(
                    CreateColumn(c).compile(dialect=self.session.dialect))))
                for c in tables.RESULTS_ARCHIVE_COLUMNS])))
        cols = identifiers(n for n, _ in columns)
        return conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {res} WHERE topic = %s RETURNING {cols}) "
            "INSERT INTO {arc} ({cols}, {arc_cols}) SELECT {cols}, %s, %s FROM moved").format(
            res=results, arc=archive, cols=cols, arc_cols=_ARCHIVE_ORIGIN),
            (topic, old_id, run_id)).rowcount
