"""A results table, as the store sees it: what it needs of the table's sink (``Sink``, a
protocol: pipeline/sinks/base.Sink is it; the store imports no sink, the caller passes
one), and the publishing transaction's statements on the table besides the sink's merge.

A pipeline may one day publish into several results tables in one transaction (one sink
each): what concerns one table takes its sink, a check before a run takes them all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import psycopg
from psycopg import sql
from sqlalchemy import ColumnElement, Table, and_, delete, exists, or_, select

from pipeline.config import SinkSettings
from pipeline.plan.offsets import OffsetRange
from pipeline.store.session import Session

COORDINATES = ("topic", "partition", "offset")


class Sink(Protocol):
    """What the store needs of the sink of one results table (pipeline/sinks/base.py says
    what each member means)."""

    mode: str
    settings: SinkSettings
    state_is_whole_table: bool

    @property
    def results(self) -> Table: ...

    @property
    def records(self) -> Table: ...

    @property
    def tables(self) -> list[Table]: ...

    def upgrades(self) -> list[sql.Composable]: ...

    def archive_recreated(self, conn: psycopg.Connection, topic: str,
                          archive_results: Callable[[], int]) -> int: ...

    def in_schema(self, schema: str) -> Sink: ...

    def state_sql(self, rows: sql.Identifier, state: sql.Identifier
                  ) -> list[sql.Composable]: ...

    def state_columns(self) -> list[str]: ...

    def state_key(self) -> list[str]: ...

    def state_inexact(self) -> set[str]: ...


def in_range(table: Table, r: OffsetRange) -> ColumnElement[bool]:
    """Rows of ``table`` (keyed by topic, partition, offset) inside ``[from, until)``."""
    offset = table.c["offset"]
    return and_(table.c["topic"] == r.topic, table.c["partition"] == r.partition,
                offset >= r.from_offset, offset < r.until_offset)


def names_records(table: Table) -> bool:
    """Does a row of ``table`` name its record (topic, partition, offset)? Not an
    aggregate's: a group holds many records."""
    return set(COORDINATES) <= {c.name for c in table.columns}


class Results:
    """One results table's statements, on the Store's session (``Store.results(sink)``)."""

    def __init__(self, db: Session, sink: Sink):
        self.db, self.sink = db, sink

    def hold_rows_in(self, ranges: Sequence[OffsetRange]) -> bool:
        """Does the results table already hold a row inside any planned range? (an index
        probe per range). Only then does publishing need ON CONFLICT."""
        results = self.sink.results
        return any(self.db.run(select(exists().where(in_range(results, r)))).scalar_one()
                   for r in ranges)

    def hold_rows(self) -> bool:
        """Does the results table hold any row? (an aggregate's totals may be rewound only
        when empty)"""
        return self.db.run(select(exists().select_from(self.sink.results))).scalar_one()

    def clear(self, ranges: Sequence[OffsetRange]) -> None:
        """Reprocess replaces what the planned ranges held: a record that was a result and
        is now a dead letter (or is filtered out by a transform) keeps no old row. Inside
        the publishing transaction, after the sink's merge lock; its dead letters are
        cleared after the dead-letter lock (DeadLetters.clear)."""
        if not ranges:
            return
        # An upsert sink's rows and tombstones of records in the ranges: their keys are
        # derived again from the ranges (a newer record elsewhere is left as it is).
        for table in self.sink.tables:
            self.db.run(delete(table).where(or_(*(in_range(table, r) for r in ranges))))
