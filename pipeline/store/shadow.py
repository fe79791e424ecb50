"""A dry run's private copy of a sink's tables: only the stored rows a merge of the run's
rows would meet (same key), in temporary tables named like the real ones, with the columns
sink.evolve would add. The sink's own merge, pointed at them (schema ``pg_temp``), then
says exactly what a real run would write, while the real tables are only read: no ALTER, no
row lock, no merge lock, nothing another session could wait on (invariant 10). The copies
go with the dry run's rolled-back transaction."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from pipeline.store.evolve import Addition
from pipeline.store.identifiers import identifiers
from pipeline.store.results import Sink
from pipeline.store.session import Session

TEMP = "pg_temp"  # the session's own schema for temporary tables


class Shadow:
    """Dry-run copies on the Store's session (``store.shadow``)."""

    def __init__(self, db: Session):
        self.db = db

    def of(self, sink: Sink, conn, rows: str, additions: Sequence[Addition] = ()) -> Sink:
        """Copies of ``sink``'s tables holding the stored rows whose keys the temp table
        ``rows`` (tables.record_batch) holds, with the planned ``additions``; the same sink,
        merging into them."""
        for table in sink.tables:
            name, key = table.name, identifiers(c.name for c in table.primary_key)
            copy = sql.Identifier(TEMP, name)
            conn.execute(sql.SQL(
                "CREATE TEMP TABLE {copy} (LIKE {real} INCLUDING DEFAULTS INCLUDING "
                "CONSTRAINTS INCLUDING INDEXES) ON COMMIT DROP").format(
                    copy=copy, real=self.db.t(name)))
            conn.execute(sql.SQL(
                "INSERT INTO {copy} SELECT * FROM {real} WHERE ({key}) IN (SELECT {key} FROM "
                "{rows})").format(copy=copy, real=self.db.t(name), key=key,
                                  rows=sql.Identifier(rows)))
            mine = [a for a in additions if a.table == name]
            if mine:
                conn.execute(sql.SQL("ALTER TABLE {} {}").format(
                    copy, sql.SQL(", ").join(a.clause() for a in mine)))
        return sink.in_schema(TEMP)
