"""pipeline_source_transactions (sql/008): the source transactions a pipeline published
whole ([sink] transactions). A run looks up which of the transactions it read were
published before (Kafka Connect writes a transaction's events and END again after a
restart: no obstacle to the cut, plan/transactions.py), records those it publishes inside
its publishing transaction, and prunes what is older than ``KEEP``.

Why an age: a transaction written again follows the first writing in Kafka within the
connector's offset flush interval and its restart (minutes), so a run reads it within a few
runs of publishing the first; and Postgres reuses a transaction id after 2^32 transactions
(days at the fastest sources), which must not find the old one still recorded."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert

from pipeline.store.run import Run
from pipeline.store.session import Session
from pipeline.store.tables import source_transactions as table

KEEP = timedelta(days=2)


class SourceTransactions:
    """The published source transactions, on the Store's session
    (``store.source_transactions``)."""

    def __init__(self, db: Session):
        self.db = db

    def published(self, keys: Collection[str]) -> set[str]:
        """Which of ``keys`` this pipeline published (and has not pruned)."""
        if not keys:
            return set()
        c = table.c
        return set(self.db.run(select(c.tx).where(
            c.pipeline == self.db.pipeline, c.tx.in_(sorted(set(keys))))).scalars())

    def record(self, run: Run, keys: Collection[str]) -> int:
        """In the open (publishing) transaction: the transactions ``run`` publishes; one
        published before keeps its first run. Returns how many are new."""
        if not keys:
            return 0
        rows = [{"pipeline": self.db.pipeline, "tx": k, "run_id": run.id}
                for k in dict.fromkeys(keys)]
        return self.db.run(insert(table).values(rows).on_conflict_do_nothing()).rowcount

    def prune(self, keep: timedelta = KEEP) -> int:
        """Forget what was published more than ``keep`` ago; how many."""
        c = table.c
        return self.db.run(delete(table).where(
            c.pipeline == self.db.pipeline,
            c.published_at < func.now() - keep)).rowcount
