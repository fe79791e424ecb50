"""A topic deleted and recreated under the same name reuses its offsets: before the new
topic is read ('pipeline offsets reset'), the old topic's rows and dead letters move to
archive tables, so that the new records are written, not taken as present. What a sink
keeps or drops of its rows is the sink's policy (Sink.archive_recreated)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from psycopg import sql
from sqlalchemy.schema import CreateColumn

from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.results import Sink
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters

log = logging.getLogger(__name__)

# What an archive row adds (topic_id, archived_by_run; archived_at defaults), in that order.
_ARCHIVE_ORIGIN = identifiers(c.name for c in tables.RESULTS_ARCHIVE_COLUMNS
                              if c.name != "archived_at")


def archive_table(sink: Sink) -> str:
    """Where a results table's archived rows go."""
    return f"{sink.settings.table}_archived"


class Archive:
    """The archive of recreated topics, on the Store's session (``store.archive``)."""

    def __init__(self, db: Session):
        self.db = db

    def archive_topic(self, conn, topic: str, old_id: str, run_id: int,
                      sinks: Sequence[Sink]) -> dict[str, int]:
        """Move a recreated topic's result rows (as each sink says) and dead letters to the
        archive tables, in the caller's transaction."""
        db = self.db
        rows = sum(sink.archive_recreated(
            conn, topic, lambda sink=sink: self._archive_results(conn, sink, topic, old_id,
                                                                 run_id))
            for sink in sinks)
        dcols = identifiers(c.name for c in dead_letters.columns)
        dead_rows = conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {dl} WHERE pipeline = %s AND topic = %s "
            "RETURNING {cols}) INSERT INTO {arc} ({cols}, {arc_cols}) "
            "SELECT {cols}, %s, %s FROM moved").format(
            dl=db.t(dead_letters.name), arc=db.t(tables.dead_letters_archived.name),
            cols=dcols, arc_cols=_ARCHIVE_ORIGIN), (db.pipeline, topic, old_id, run_id)
        ).rowcount
        log.warning("topic '%s' was recreated: archived %d result rows to %s and %d dead "
                    "letters to pipeline_dead_letters_archived (old topic ID %s)", topic, rows,
                    ", ".join(archive_table(s) for s in sinks), dead_rows, old_id)
        return {"topic_id": old_id, "rows": rows, "dead_letters": dead_rows}

    def _archive_results(self, conn, sink: Sink, topic: str, old_id: str, run_id: int) -> int:
        db = self.db
        results = db.t(sink.settings.table)
        archive = db.t(archive_table(sink))
        # The live columns, in Postgres's own spelling (they may include columns added by
        # hand, of any type): the archive takes each of them.
        columns = [(name, ftype) for name, ftype in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
            "attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (f'"{db.settings.schema}"."{sink.settings.table}"',)).fetchall()]
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS)")
                     .format(archive, results))
        # A column added to the results table since the archive was created is added here.
        conn.execute(sql.SQL("ALTER TABLE {} {}").format(archive, sql.SQL(", ").join(
            [sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(n), sql.SQL(t))
             for n, t in columns] + [
                sql.SQL("ADD COLUMN IF NOT EXISTS {}").format(sql.SQL(str(
                    CreateColumn(c).compile(dialect=db.session.dialect))))
                for c in tables.RESULTS_ARCHIVE_COLUMNS])))
        cols = identifiers(n for n, _ in columns)
        return conn.execute(sql.SQL(
            "WITH moved AS (DELETE FROM {res} WHERE topic = %s RETURNING {cols}) "
            "INSERT INTO {arc} ({cols}, {arc_cols}) SELECT {cols}, %s, %s FROM moved").format(
            res=results, arc=archive, cols=cols, arc_cols=_ARCHIVE_ORIGIN),
            (topic, old_id, run_id)).rowcount
