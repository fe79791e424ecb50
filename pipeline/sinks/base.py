"""What a sink mode is: one small interface, one module per mode (append.py, upsert.py,
aggregate.py), chosen once from the settings (``pipeline.sinks.for_settings``).

A sink owns what differs between modes: its tables, how a run's rows land in them (the
merge, inside the publishing transaction of pipeline/driver/publish.py), whether rows may be
copied straight into the results table, what happens to its rows when a topic is recreated,
and what it refuses. Exactly once comes from the transaction, not from here: a merge commits
with the offsets' compare-and-set or not at all (docs/reliability.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import psycopg
from psycopg import sql
from sqlalchemy import Table

from pipeline.config import SinkSettings
from pipeline.formats.types import column_type
from pipeline.store import tables
from pipeline.store.identifiers import qualified
from pipeline.store.run import Run


@dataclass(frozen=True)
class Merged:
    rows: int  # rows inserted or updated (append, upsert) / groups changed (aggregate)
    deleted: int = 0  # rows deleted by tombstones (upsert)


class Sink(ABC):
    """A pipeline's results, per ``[sink] mode``."""

    mode: str

    def __init__(self, sink: SinkSettings, schema: str, pipeline: str):
        self.settings, self.schema, self.pipeline = sink, schema, pipeline

    def t(self, name: str) -> sql.Identifier:
        """A table of this sink, schema-qualified."""
        return qualified(self.schema, name)

    def in_schema(self, schema: str) -> Sink:
        """The same sink, on tables of the same names in ``schema`` (a dry run's private
        copies: store/shadow.py)."""
        return type(self)(self.settings, schema, self.pipeline)

    @cached_property
    def records(self) -> Table:
        """One row per record: what the executors stage, whatever the mode."""
        return tables.record_rows(self.settings)

    @cached_property
    @abstractmethod
    def results(self) -> Table:
        """The results table ``sink.table``."""

    @property
    def tables(self) -> list[Table]:
        """Every table init-db creates for the sink."""
        return [self.results]

    def upgrades(self) -> list[sql.Composable]:
        """What init-db runs on the sink's tables after creating them: columns of the
        pipeline's own that a table made by an older version lacks (``info["upgrade"]``)."""
        return []

    def copies_directly(self, run: Run) -> bool:
        """May the run's rows be copied straight into the results table (when the planned
        ranges hold no row yet)? Else they go through a temp table and ``merge``."""
        return False

    def lock_merges(self, conn: psycopg.Connection) -> None:
        """The sink's merge lock, until COMMIT, if its merges must take turns (upsert).
        Taken by every publishing transaction (driver/publish.py, driver/replay.py) before
        its first statement on the sink's tables: the one lock order is this lock, the
        results, the dead-letter lock, the dead letters (store/dead_letters.py). A dry run
        merges into private copies (store/shadow.py) and takes it not."""
        return  # append and aggregate: no lock of their own

    @abstractmethod
    def merge(self, conn: psycopg.Connection, source: str, run: Run) -> Merged:
        """Merge the run's rows (temp table ``source``, tables.record_batch) into the
        results table; the caller holds ``lock_merges``."""

    def archive_recreated(self, conn: psycopg.Connection, topic: str,
                          archive_results: Callable[[], int]) -> int:
        """A recreated topic's rows (its offsets are reused by the new topic): moved to the
        archive by ``archive_results``; returns how many."""
        return archive_results()

    def refuses_reread(self, what: str) -> str | None:
        """Why the sink refuses ``what`` (a backfill, a rewind) that reads committed records
        again; None: it does not."""
        return None

    def growth_note(self) -> str:
        """What a topic that grew partitions means for this sink (job.py logs it)."""
        return ""

    # What ``pipeline verify`` recomputes (driver/verify_state.py, store/state.py): the state
    # the results table should hold, from the records re-read into the temp table ``rows``.
    # Append: every record is its row, compared only with the rows of the records re-read.
    state_is_whole_table = True
    # The state counts records of a topic before it was recreated (Kafka no longer has them).
    state_keeps_recreated_topics = False

    def state_sql(self, rows: sql.Identifier, state: sql.Identifier) -> list[sql.Composable]:
        """The statements that make the temp table ``state`` from ``rows``."""
        return [sql.SQL("CREATE TEMP TABLE {state} ON COMMIT DROP AS SELECT * FROM {rows}")
                .format(state=state, rows=rows)]

    def state_columns(self) -> list[str]:
        """The columns compared (a record's, coordinates included: a row must be the right
        record, not only hold the same values)."""
        return [c.name for c in tables.from_record(self.results)]

    def state_key(self) -> list[str]:
        """The columns that name a differing row."""
        return list(self.settings.key)

    def state_inexact(self) -> set[str]:
        """Columns compared within a relative 1e-9 (by a join on ``state_key``)."""
        return set()

    def state_scaled(self) -> set[str]:
        """Columns compared with their scale, as text: a decimal without precision keeps
        each value's own (1.50 is not 1.5 there), which numeric equality ignores."""
        return {c.name for c in self.settings.columns if column_type(c.type).own_scale}
