"""Kafka Connect's replays ([sink] transactions): which records of a partition are changes
Kafka Connect wrote again. One rule, for a run (executor/segments.py marks them, the cut
leaves them out: plan/transactions.py) and for ``pipeline verify`` (driver/verify_state.py,
store/state.py), so that the replica a run publishes is the one verify recomputes.

Connect is at-least-once: after a worker's crash Debezium writes again the changes (and
END events) since its last committed source offset. Applied after the changes that
followed its original, such a change would take the replica back to an older state (an
account again owned by a customer the source has since deleted).

- A change's *identity* in its partition: its source transaction and its order in its
  table (the transaction id before ':' and ``data_collection_order``). Of a partition's
  changes with one identity the first is applied; each later one is a replay.
- The tombstone right after a change of its key (Debezium's after a delete) goes with that
  change: a replay if it is. "Right after" is within one run's range: a run's read task
  sees no record before its range, so verify starts afresh where each run's range started
  (``starts``).
- Any other record (a snapshot's read, a tombstone after no change) is never a replay.

A read task knows what is earlier in its range (``Replays``); what was earlier in an
earlier run's range is a transaction that run published whole (plan/transactions.py,
``published``: every change of it came then). Verify holds all of a partition's published
ranges, so it finds the first of each identity among them in Postgres (store/state.py:
memory does not grow with the partition).
"""

from __future__ import annotations

from collections.abc import Iterable

# A record's part in the rule: (transaction, order in its table, -1) for a change; for a
# tombstone right after a change, (its transaction, its order, the change's offset).
Identity = tuple[str, int, int]


class Identities:
    """``of(...)`` of a partition's records in offset order: each record's identity.
    ``starts``: where runs' ranges started (verify, reading many runs' ranges at once);
    a record there has none before it."""

    __slots__ = ("_last", "_starts", "_next")

    def __init__(self, starts: Iterable[int] = ()) -> None:
        self._last: tuple[int, bytes | None, Identity | None] | None = None
        self._starts = sorted(set(starts))
        self._next = 0

    def of(self, offset: int, key: bytes | None, tombstone: bool,
           source: tuple[str, int] | None) -> Identity | None:
        """The identity of the record at ``offset`` (``key``: its Kafka key;
        ``tombstone``: its value is null; ``source``: its (transaction, order), None for a
        record of none: formats.encode.Encoder.transactions)."""
        starts = self._starts
        while self._next < len(starts) and offset >= starts[self._next]:
            self._last = None
            self._next += 1
        last = self._last
        if source is not None:
            identity: Identity | None = (source[0], source[1], -1)
        elif (tombstone and last is not None and last[2] is not None and last[2][2] < 0
              and last[1] == key):
            identity = (last[2][0], last[2][1], last[0])
        else:
            identity = None
        self._last = (offset, key, identity)
        return identity


class Replays:
    """The rule over what ``add`` is given (one partition's records in offset order):
    ``add`` says whether a record is a replay; ``runs``: the replays' offsets as [first,
    last] runs; ``seen``: the changes' (transaction, order) met."""

    __slots__ = ("seen", "runs")

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()
        self.runs: list[list[int]] = []

    def add(self, offset: int, identity: Identity | None) -> bool:
        if identity is None:
            return False
        runs = self.runs
        tx, order, follows = identity
        if follows < 0:
            if (tx, order) not in self.seen:
                self.seen.add((tx, order))
                return False
        elif not (runs and runs[-1][1] == follows):  # its change was applied
            return False
        if runs and runs[-1][1] == offset - 1:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset])
        return True
