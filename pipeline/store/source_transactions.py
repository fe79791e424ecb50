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

import json
from collections.abc import Collection
from datetime import timedelta

from sqlalchemy import BigInteger, Text, bindparam, cast, delete, func, literal, select
from sqlalchemy.dialects.postgresql import JSONB, insert

from pipeline.store.run import Run
from pipeline.store.session import Session
from pipeline.store.tables import source_transactions as table

KEEP = timedelta(days=2)


class SourceTransactions:
    """The published source transactions, on the Store's session
    (``store.source_transactions``)."""

    def __init__(self, db: Session):
        self.db = db

    # Both statements bind the keys as ONE parameter: a run's backlog may hold more
    # transactions than the 65,535 parameters Postgres takes in a statement.
    def published(self, keys: Collection[str]) -> set[str]:
        """Which of ``keys`` this pipeline published (and has not pruned)."""
        if not keys:
            return set()
        c = table.c
        k = _keys(keys)
        return set(self.db.run(select(c.tx).where(
            c.pipeline == self.db.pipeline, c.tx.in_(select(k.c.tx)))).scalars())

    def record(self, run: Run, keys: Collection[str]) -> int:
        """In the open (publishing) transaction: the transactions ``run`` publishes; one
        published before keeps its first run. Returns how many are new.

        An anti-join, not ON CONFLICT DO NOTHING, whose speculative insertion of every row
        cost ~1.7x as much (50,000 transactions: ~0.25 CPU-s more of the publishing
        transaction): only an ingest run records (the cut), and one at a time per pipeline
        (its run lock), so no other transaction inserts the same keys meanwhile."""
        if not keys:
            return 0
        c = table.c
        k = _keys(keys)  # distinct
        known = select(c.tx).where(c.pipeline == self.db.pipeline, c.tx == k.c.tx)
        rows = select(literal(self.db.pipeline, Text), k.c.tx, literal(run.id, BigInteger)
                      ).where(~known.exists())
        return self.db.run(insert(table).from_select(["pipeline", "tx", "run_id"], rows)
                           ).rowcount

    def prune(self, keep: timedelta = KEEP) -> int:
        """Forget what was published more than ``keep`` ago; how many."""
        c = table.c
        return self.db.run(delete(table).where(
            c.pipeline == self.db.pipeline,
            c.published_at < func.now() - keep)).rowcount


def _keys(keys: Collection[str]):
    """``keys``, distinct, as the rows ``k(tx)`` of ONE parameter: a JSON array's text (a
    list bound as text[] is dumped element by element on the driver, ~55 ms for 50,000,
    between the read and the publish; this ~10)."""
    text = json.dumps(list(dict.fromkeys(keys)))
    return func.jsonb_array_elements_text(cast(bindparam("keys", text, type_=Text), JSONB)
                                          ).table_valued("tx").render_derived(name="k")
