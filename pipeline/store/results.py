"""The statements on the results and dead-letter tables that the publishing transaction
(pipeline/driver/publish.py) runs besides the sink's merge."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql
from sqlalchemy import ColumnElement, Table, and_, delete, exists, or_, select

from pipeline.plan.offsets import OffsetRange
from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.session import Session
from pipeline.store.tables import dead_letters


def in_range(table: Table, r: OffsetRange) -> ColumnElement[bool]:
    """Rows of ``table`` (keyed by topic, partition, offset) inside ``[from, until)``."""
    offset = table.c["offset"]
    return and_(table.c["topic"] == r.topic, table.c["partition"] == r.partition,
                offset >= r.from_offset, offset < r.until_offset)


class Results(Session):
    def ranges_hold_rows(self, ranges: Sequence[OffsetRange]) -> bool:
        """Does the results table already hold a row inside any planned range? (an index
        probe per range). Only then does publishing need ON CONFLICT."""
        return any(self.run(select(exists().where(in_range(self.results, r)))).scalar_one()
                   for r in ranges)

    def results_hold_rows(self) -> bool:
        """Does the results table hold any row? (an aggregate's totals may be rewound only
        when empty)"""
        return self.run(select(exists().select_from(self.results))).scalar_one()

    def clear_rows(self, ranges: Sequence[OffsetRange]) -> None:
        """Reprocess replaces what the planned ranges held: a record that was a result and
        is now a dead letter (or is filtered out by a transform) keeps no old row. Inside
        the publishing transaction, after the sink's merge lock; its dead letters are
        cleared after the dead-letter lock (DeadLetterRows.clear_dead_letters)."""
        if not ranges:
            return
        # An upsert sink's rows and tombstones of records in the ranges: their keys are
        # derived again from the ranges (a newer record elsewhere is left as it is).
        for table in self.sink_tables:
            self.run(delete(table).where(or_(*(in_range(table, r) for r in ranges))))

    @property
    def rows_hold_offsets(self) -> bool:
        """Does a results row name its record (topic, partition, offset)? Not an aggregate's:
        a group holds many records."""
        return {"topic", "partition", "offset"} <= {c.name for c in self.results.columns}

    def merge_dead_letters_sql(self, source: str, overwrite: bool) -> sql.Composed:
        """The staged dead letters of a run (in temp table ``source``) into
        pipeline_dead_letters: kept if already there, replaced on reprocess. Never beside a
        row: a record whose offset has a results row (a backfill re-reading it under an
        older config, say) keeps its row and gets no dead letter - an offset lives in one
        place (a reprocess cleared its ranges' rows first, so it replaces them)."""
        beside_row = sql.SQL(" WHERE NOT EXISTS (SELECT FROM {res} AS r WHERE r.topic = "
                             "s.topic AND r.\"partition\" = s.\"partition\" AND r.\"offset\" = "
                             "s.\"offset\")").format(res=self.t(self.results.name)) \
            if self.rows_hold_offsets else sql.SQL("")
        return sql.SQL(
            "INSERT INTO {dl} (pipeline, {cols}, run_id) SELECT DISTINCT ON ({key}) "
            "%s, {cols}, %s FROM {src} AS s{beside_row} ON CONFLICT (pipeline, {key}) DO "
            "{action}").format(
            dl=self.t(dead_letters.name), src=sql.Identifier(source), beside_row=beside_row,
            cols=identifiers(c.name for c in tables.DEAD_LETTER_FIELDS),
            key=identifiers(c.name for c in dead_letters.primary_key if c.name != "pipeline"),
            action=sql.SQL("UPDATE SET error_type = EXCLUDED.error_type, error_message "
                           "= EXCLUDED.error_message, run_id = EXCLUDED.run_id, "
                           "failed_at = now()") if overwrite else sql.SQL("NOTHING"))

    def dead_letters_beside_rows(self, source: str, first: int = 5
                                 ) -> tuple[int, list[tuple[str, int, int]]]:
        """The staged dead letters (temp table ``source``) whose offsets have a results row:
        what merge_dead_letters_sql leaves out (how many, and the first few), for the log."""
        if not self.rows_hold_offsets:
            return 0, []
        found = self.execute(sql.SQL(
            "SELECT count(*) OVER (), s.topic, s.\"partition\", s.\"offset\" FROM {src} AS s "
            "WHERE EXISTS (SELECT FROM {res} AS r WHERE r.topic = s.topic AND r.\"partition\" "
            "= s.\"partition\" AND r.\"offset\" = s.\"offset\") ORDER BY 2, 3, 4 LIMIT %s").format(
            src=sql.Identifier(source), res=self.t(self.results.name)), (first,)).fetchall()
        return (found[0][0] if found else 0), [tuple(r[1:]) for r in found]
