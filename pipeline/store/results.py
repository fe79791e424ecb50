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

    def clear_ranges(self, ranges: Sequence[OffsetRange]) -> None:
        """Reprocess replaces what the planned ranges held: a record that was a result and
        is now a dead letter (or is filtered out by a transform) keeps no old row, and no
        offset stays in both tables. Inside the publishing transaction, like the rest."""
        if not ranges:
            return
        # An upsert sink's rows and tombstones of records in the ranges: their keys are
        # derived again from the ranges (a newer record elsewhere is left as it is).
        for table in self.sink_tables:
            self.run(delete(table).where(or_(*(in_range(table, r) for r in ranges))))
        self.run(delete(dead_letters).where(
            dead_letters.c.pipeline == self.pipeline,
            or_(*(in_range(dead_letters, r) for r in ranges))))

    def merge_dead_letters_sql(self, source: str, overwrite: bool) -> sql.Composed:
        """The staged dead letters of a run (in temp table ``source``) into
        pipeline_dead_letters: kept if already there, replaced on reprocess."""
        return sql.SQL(
            "INSERT INTO {dl} (pipeline, {cols}, run_id) SELECT DISTINCT ON ({key}) "
            "%s, {cols}, %s FROM {src} ON CONFLICT (pipeline, {key}) DO {action}").format(
            dl=self.t(dead_letters.name), src=sql.Identifier(source),
            cols=identifiers(c.name for c in tables.DEAD_LETTER_FIELDS),
            key=identifiers(c.name for c in dead_letters.primary_key if c.name != "pipeline"),
            action=sql.SQL("UPDATE SET error_type = EXCLUDED.error_type, error_message "
                           "= EXCLUDED.error_message, run_id = EXCLUDED.run_id, "
                           "failed_at = now()") if overwrite else sql.SQL("NOTHING"))
