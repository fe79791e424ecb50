"""aggregate: per group (``group_by``), the run's sum/count/min/max added to the stored
ones. Its totals count each committed record once, so it refuses to read one again."""

from __future__ import annotations

from functools import cached_property

import psycopg
from psycopg import sql
from sqlalchemy import BigInteger, Column, MetaData, Table, func

from pipeline.sinks.base import Merged, Sink
from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.run import Run


class Aggregate(Sink):
    mode = "aggregate"

    @cached_property
    def results(self) -> Table:
        """The group_by columns as the key, one column per aggregate, the run that last
        changed the group and when."""
        sink = self.settings
        declared = {c.name: c for c in sink.columns}
        return Table(
            sink.table, MetaData(schema=tables.SCHEMA), *tables.business_key(sink),
            *[Column(a.name, tables.aggregate_type(a, declared)) for a in sink.aggregates],
            Column("run_id", BigInteger, nullable=False),
            Column("updated_at", tables.TIMESTAMPTZ, nullable=False,
                   server_default=func.now()))

    def merge(self, conn: psycopg.Connection, source: str, run: Run) -> Merged:
        return Merged(conn.execute(self.merge_sql(source), (run.id,)).rowcount)

    def merge_sql(self, source: str) -> sql.Composed:
        """The run's aggregates per group, added to the stored ones (%s: the run's id). A
        sum or count adds up; min and max keep the extreme; a NULL (no value yet) is no
        value."""
        sink = self.settings
        computed, merged = [], []
        for a in sink.aggregates:
            name = sql.Identifier(a.name)
            arg = sql.SQL("*") if a.of is None else sql.Identifier(a.of)
            computed.append(sql.SQL("{f}({arg})").format(f=sql.SQL(a.function), arg=arg))
            merged.append(sql.SQL("{n} = {how}").format(n=name, how=sql.SQL({
                "sum": "coalesce(g.{n} + EXCLUDED.{n}, g.{n}, EXCLUDED.{n})",
                "count": "coalesce(g.{n} + EXCLUDED.{n}, g.{n}, EXCLUDED.{n})",
                "min": "least(g.{n}, EXCLUDED.{n})",
                "max": "greatest(g.{n}, EXCLUDED.{n})"}[a.function]).format(n=name)))
        key = identifiers(sink.key)
        return sql.SQL(
            "INSERT INTO {res} AS g ({key}, {aggs}, run_id) SELECT {key}, {computed}, %s "
            "FROM {src} GROUP BY {key} ON CONFLICT ({key}) DO UPDATE SET {merged}, "
            "run_id = EXCLUDED.run_id, updated_at = now()").format(
            res=self.t(self.results.name), key=key,
            aggs=identifiers(a.name for a in sink.aggregates),
            computed=sql.SQL(", ").join(computed), src=sql.Identifier(source),
            merged=sql.SQL(", ").join(merged))

    state_keeps_recreated_topics = True  # totals kept through a recreation (archive_recreated)

    def state_sql(self, rows: sql.Identifier, state: sql.Identifier) -> list[sql.Composable]:
        """The totals per group of every record."""
        computed = [sql.SQL("{f}({arg}) AS {n}").format(
            f=sql.SQL(a.function), n=sql.Identifier(a.name),
            arg=sql.SQL("*") if a.of is None else sql.Identifier(a.of))
            for a in self.settings.aggregates]
        return [sql.SQL("CREATE TEMP TABLE {state} ON COMMIT DROP AS SELECT {key}, {computed} "
                        "FROM {rows} GROUP BY {key}").format(
                            state=state, key=identifiers(self.settings.key),
                            computed=sql.SQL(", ").join(computed), rows=rows)]

    def state_columns(self) -> list[str]:
        return [*self.settings.key, *(a.name for a in self.settings.aggregates)]

    def state_inexact(self) -> set[str]:
        """Sums over double columns: the sink adds a run's total to the stored one, verify
        sums every record at once, and float addition is not associative, so the two may
        differ in the last bits."""
        doubles = {c.name for c in self.settings.columns if c.type == "double"}
        return {a.name for a in self.settings.aggregates
                if a.function == "sum" and a.of in doubles}

    def state_scaled(self) -> set[str]:
        """Sums of decimals without precision: a sum's scale is its addends' largest,
        whatever their order (a min or max of equal values may keep either scale)."""
        scaled = super().state_scaled()
        return {a.name for a in self.settings.aggregates
                if a.function == "sum" and a.of in scaled}

    def archive_recreated(self, conn, topic, archive_results) -> int:
        # The totals stay: they count the old topic's records, which were read once.
        return 0

    def refuses_reread(self, what: str) -> str | None:
        name, table = self.pipeline, self.settings.table
        return (f"pipeline '{name}' aggregates (sink.mode = 'aggregate'): its totals in "
                f"{table} already count every committed record once, and {what} would count "
                "them again; refused, nothing changed - to rebuild the totals from what Kafka "
                f"still holds, empty {table} (TRUNCATE, as its owner) and rewind with "
                "'pipeline offsets set --to earliest'; to recount a range, keep an append "
                "pipeline of the topic and derive the totals from it in SQL")
