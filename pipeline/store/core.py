"""The Store: the driver's one Postgres session (session.py: the connection, transactions,
timeouts; it holds the pipeline's run lock while it is open) and its parts, one per
concern and module, each given the session when the Store opens:

- ``schema`` (schema.py): init-db and the checks before a run reads anything;
  ``evolution`` (evolve.py): the columns sink.evolve adds before a run reads (short
  transactions of their own)
- ``locks`` (locks.py): the run locks and who holds them
- ``runs`` (runs.py), ``staging`` (staging.py): run rows and a run's staging table (the Run
  itself: run.py)
- ``offsets`` (offsets.py), ``archive`` (archive.py): the stored offsets, and a recreated
  topic's archive
- ``dead_letters`` (dead_letters.py): what `pipeline dead-letters` lists, and the
  publishing transaction's statements on them; ``replay`` (replay.py): a replay's
- ``ledger`` (ledger.py): the ledger of published ranges (written on publish, read by
  verify); ``verification`` (verify.py): what `pipeline verify` reads
- ``shadow`` (shadow.py): a dry run's private copies of a sink's tables, to merge into
- ``source_transactions`` (source_transactions.py): the source transactions published whole
  ([sink] transactions)

What concerns one results table takes that table's sink (results.Sink; the caller builds it
from the settings with pipeline.sinks.for_settings and passes it): ``results(sink)``
(results.py, the publishing transaction's statements on the table besides the sink's
merge) and ``state(sink)`` (state.py, verify of its state). The checks before a run take
every sink the run writes.

Every column list comes from pipeline/store/tables.py or a sink. Nothing here runs on the
executors.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pipeline.config import Settings
from pipeline.store.archive import Archive
from pipeline.store.dead_letters import DeadLetters
from pipeline.store.evolve import Addition, Evolution
from pipeline.store.ledger import Ledger
from pipeline.store.locks import Locks
from pipeline.store.offsets import Offsets
from pipeline.store.replay import Replay
from pipeline.store.results import Results, Sink
from pipeline.store.runs import Runs
from pipeline.store.schema import Schema
from pipeline.store.session import Session
from pipeline.store.shadow import Shadow
from pipeline.store.source_transactions import SourceTransactions
from pipeline.store.staging import Staging
from pipeline.store.state import StateVerification
from pipeline.store.verify import Verification

log = logging.getLogger("pipeline")


class Store(Session):
    """The driver's one session and its parts; it holds the pipeline's run lock while it is
    open."""

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.evolution = Evolution(self)
        self.schema = Schema(self, self.evolution)
        self.locks = Locks(self)
        self.staging = Staging(self)
        self.runs = Runs(self, self.staging)
        self.archive = Archive(self)
        self.offsets = Offsets(self, self.archive)
        self.dead_letters = DeadLetters(self)
        self.replay = Replay(self, self.dead_letters)
        self.ledger = Ledger(self)
        self.verification = Verification(self)
        self.shadow = Shadow(self)
        self.source_transactions = SourceTransactions(self)

    def __enter__(self) -> Store:
        return self

    def results(self, sink: Sink) -> Results:
        """The statements on ``sink``'s results table."""
        return Results(self, sink)

    def state(self, sink: Sink) -> StateVerification:
        """Verify of the state ``sink``'s table holds."""
        return StateVerification(self, sink)

    def ready_for(self, what: str, sinks: Sequence[Sink], families: Sequence[str] = ("ingest",),
                  *, lock: bool = True) -> tuple[Addition, ...]:
        """Before a run reads anything: the schema and the ``sinks``' tables as the config
        says, then (``lock``; not for a dry run) the families' locks, held until close, and
        the clean-up after crashed runs of those families. Returns the columns sink.evolve
        will add (the run passes them to ``evolution.add_columns``)."""
        planned = self.tables_ready(sinks)
        if lock:
            self.lock_for(what, families)
        return planned

    def lock_for(self, what: str, families: Sequence[str] = ("ingest",)) -> None:
        """The families' locks, held until close, and the clean-up after crashed runs of
        those families (a run whose tables are known only once it holds them: a pattern's
        topics, checked by ``tables_ready`` next)."""
        self.schema.check([])
        self.locks.lock_or_fail(what, families=families)
        self.runs.abandon_stale(families)

    def tables_ready(self, sinks: Sequence[Sink], *, create: bool = False
                     ) -> tuple[Addition, ...]:
        """The schema and the ``sinks``' tables as the config says (``create``: a table
        not there yet is created first, in a short transaction of its own: a topic a
        pattern found since the last run); the columns sink.evolve will add."""
        if create and (made := self.schema.create_missing(sinks)):
            log.info("created %s for topics new to the pipeline", ", ".join(made),
                     extra={"event": "tables.created", "tables": made})
        self.schema.check(sinks)
        return self.schema.check_results_tables(sinks)
