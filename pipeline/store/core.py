"""The Store: the driver's one Postgres session and everything it does with it, one module
per concern (composed here so that callers hold one object):

- session.py: the connection, transactions, timeouts, and the pipeline's sink
- schema.py: init-db and the checks before a run reads anything; evolve.py: the columns
  sink.evolve adds before a run reads (short transactions of their own)
- locks.py: the run locks and who holds them
- runs.py, staging.py: run rows and a run's staging table (the Run itself: run.py)
- offsets.py, archive.py: the stored offsets, and a recreated topic's archive
- results.py: the publishing transaction's statements besides the sink's merge
- queries.py: what the operator commands read; verify.py: what `pipeline verify` reads
- ledger.py: the ledger of published ranges (written on publish, read by verify);
  state.py: verify of an upsert or aggregate sink (its state recomputed in temp tables)
- dead_letters.py: what `pipeline dead-letters` lists, a replay's statements, and moving
  a dead letter out when its offset becomes a row (every publishing run)
- shadow.py: a dry run's private copies of the sink's tables, to merge into

Every column list comes from pipeline/store/tables.py or the sink (pipeline/sinks/).
Nothing here runs on the executors.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.store.dead_letters import DeadLetterRows
from pipeline.store.ledger import Ledger
from pipeline.store.locks import Locks
from pipeline.store.offsets import Offsets
from pipeline.store.queries import Queries
from pipeline.store.results import Results
from pipeline.store.runs import RunRows
from pipeline.store.schema import Schema
from pipeline.store.shadow import Shadow
from pipeline.store.state import StateVerification
from pipeline.store.verify import Verification


class Store(Schema, Locks, RunRows, Offsets, Results, Queries, Verification,
            DeadLetterRows, Ledger, StateVerification, Shadow):
    """The driver's one session; it holds the pipeline's run lock while it is open."""

    def __enter__(self) -> Store:
        return self

    def ready_for(self, what: str, families: Sequence[str] = ("ingest",), *,
                  lock: bool = True) -> None:
        """Before a run reads anything: the schema and the results table as the config
        says, then (``lock``; not for a dry run) the families' locks, held until close, and
        the clean-up after crashed runs of those families."""
        self.check_schema()
        self.check_results_table()
        if lock:
            self.lock_or_fail(what, families=families)
            self.abandon_stale_runs(families)
