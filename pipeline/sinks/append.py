"""append: one row per record, keyed by its coordinates (topic, partition, offset)."""

from __future__ import annotations

from functools import cached_property

import psycopg
from psycopg import sql
from sqlalchemy import Table

from pipeline.sinks.base import Merged, Sink
from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.run import Run


class Append(Sink):
    mode = "append"
    state_is_whole_table = False

    def state_key(self) -> list[str]:
        return ["topic", "partition", "offset"]

    @cached_property
    def results(self) -> Table:
        return tables.record_rows(self.settings, self.settings.table)

    def copies_directly(self, run: Run) -> bool:
        # Nothing to replace: the rows go straight into the keyed table.
        return not run.overwrite

    def merge(self, conn: psycopg.Connection, source: str, run: Run) -> Merged:
        return Merged(conn.execute(self.merge_sql(source, run.overwrite)).rowcount)

    def merge_sql(self, source: str, overwrite: bool) -> sql.Composed:
        """Rows already present in a planned range: keep them (ON CONFLICT DO NOTHING), or
        replace them on reprocess."""
        names = [c.name for c in tables.written(self.results)]
        keys = [c.name for c in self.results.primary_key]
        fmt = {"res": self.t(self.results.name), "src": sql.Identifier(source),
               "cols": identifiers(names), "key": identifiers(keys)}
        if not overwrite:
            return sql.SQL("INSERT INTO {res} ({cols}) SELECT {cols} FROM {src} "
                           "ON CONFLICT ({key}) DO NOTHING").format(**fmt)
        updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
                                     for n in names if n not in keys)
        return sql.SQL(
            "INSERT INTO {res} ({cols}) SELECT DISTINCT ON ({key}) {cols} FROM {src} "
            "ON CONFLICT ({key}) DO UPDATE SET {upd}, ingested_at = now()").format(
            **fmt, upd=updates)
