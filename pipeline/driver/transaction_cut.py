"""A run's cut at whole source transactions ([sink] transactions), on the driver.

After the read tasks staged their ranges with a summary by source transaction
(executor/segments.py), the driver reads the transaction topic's END events
(driver/transaction_topic.py), looks up which of the transactions were published before
(store/source_transactions.py) and lets plan/transactions.cut_at_transactions decide where
each partition's published part ends. The publisher then leaves out what lies at or after
a partition's cut (rows, tombstones, dead letters), and the changes Kafka Connect wrote
again (``TransactionCut.replays``), records the ledger of ``[from, cut)``,
moves the offsets to the cut and the transaction topic's to ``metadata_next``
(``RunCut``); what was left out is read again by the next run.

A cut that publishes nothing while the plan capped a range (kafka.max_records_per_*) would
never progress when one source transaction is larger than the budget: the run then plans
again without the caps (``NeedsUncapped``), so such a transaction is published whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipeline.config import Settings
from pipeline.driver.transaction_prefetch import TransactionPrefetch
from pipeline.driver.transaction_topic import (
    PARTITION,
    TransactionTopicRead,
    check_position,
    read_transaction_ends,
)
from pipeline.plan.offsets import OffsetRange, PlannedPartition, TopicPartition
from pipeline.plan.transactions import TransactionCut, collection_topics, cut_at_transactions
from pipeline.store.segments import StagedRange, read_partitions

log = logging.getLogger("pipeline")


class NeedsUncapped(Exception):
    """The cut publishes nothing and the plan capped a range: plan again without caps."""


def check_transaction_topic(settings: Settings, meta, store) -> None:
    """Before anything is read: the transaction topic exists (exit 2 naming
    provide.transaction.metadata) with one partition, and under on_data_loss = fail none of
    it was deleted before it was read (exit 3 naming the lost offsets)."""
    topic = settings.sink.transactions
    check_position(settings, meta, store.offsets.load([topic]))


@dataclass(frozen=True)
class RunCut:
    """What the publisher needs of the cut: ``until`` per read partition, the ledger of a
    range cut short, the offset updates and what the run row says."""

    cut: TransactionCut
    metadata: TransactionTopicRead
    staged: Mapping[TopicPartition, StagedRange]
    ranges: Sequence[OffsetRange]  # the planned ranges read

    def cut_short(self) -> dict[TopicPartition, OffsetRange]:
        """The ranges published only in part: [from, cut) of each."""
        return {r.tp: OffsetRange(r.topic, r.partition, r.from_offset, self.cut.until[r.tp])
                for r in self.cut.cut_short(self.ranges)}

    def ledger_at(self, tp: TopicPartition) -> tuple[int, bytes]:
        """(records, content hash) of the partition's published part."""
        return self.staged[tp].ledger_at(self.cut.until[tp])

    def offset_updates(self, planned: Sequence[PlannedPartition]) -> list[PlannedPartition]:
        """The plan's offset updates with each range ended at its cut, and the transaction
        topic's to ``metadata_next``."""
        out = []
        for u in planned:
            until = self.cut.until.get(u.range.tp, u.range.until_offset)
            u = replace(u, range=OffsetRange(u.range.topic, u.range.partition,
                                             u.range.from_offset, until))
            if u.moves_offset or u.lost is not None:
                out.append(u)
        metadata = self.metadata.offset_update(self.cut.metadata_next)
        return out + ([metadata] if metadata is not None else [])

    def summary(self) -> dict[str, Any]:
        """The run row's and --json's ``transactions``."""
        c, m = self.cut, self.metadata
        return {
            "topic": m.topic,
            "metadata": {"from": m.start, "until": c.metadata_next or m.start,
                         "latest": m.latest, **({"lost": m.lost.as_dict()} if m.lost else {})},
            "included": len(c.included), "passed": len(c.passed),
            "replayed": sum(b - a + 1 for runs in c.replays.values() for a, b in runs),
            "cut": [r.as_dict() for r in self.cut_short().values()],
            "blocked": None if c.blocked is None else {
                "tx": c.blocked.tx, "missing": {t: {"read": h, "events": w}
                                                for t, (h, w) in c.blocked.missing.items()}},
            "unended": list(c.unended),
        }


def decide_cut(settings: Settings, store, meta, staged: Mapping[TopicPartition, StagedRange],
               partitions: Sequence[PlannedPartition], run_id: int,
               capped: bool, prefetch: TransactionPrefetch | None = None) -> RunCut:
    """The run's cut: the staged summaries of the chosen attempts (``staged``,
    Publisher.segments), the END events, the published transactions. ``partitions``:
    every planned partition (empty ranges too); ``capped``: the plan capped a range;
    ``prefetch``: the END events read during the data's read, kept where they still hold.
    Raises NeedsUncapped when nothing would be published while ``capped``."""
    planned = [p.range for p in partitions]
    topics = sorted({r.topic for r in planned})
    topic = settings.sink.transactions
    earlier = prefetch.result() if prefetch is not None else None
    stored = store.offsets.load([topic])
    metadata = read_transaction_ends(settings, meta, stored, topics, earlier)
    read = read_partitions(staged, planned)
    keys = {e.tx for e in metadata.ends} | {
        tx for p in read for tx in p.events}
    published = store.source_transactions.published(keys)
    cut = cut_at_transactions(metadata.ends, read, collection_topics(topic, topics),
                              published, first_run=metadata.first_run,
                              resumed=_resumed(settings, partitions))
    run_cut = RunCut(cut, metadata, staged, [r for r in planned if r.count > 0])
    progress = any(cut.until.get(r.tp, r.until_offset) > r.from_offset
                   for r in run_cut.ranges)
    if capped and not progress:
        raise NeedsUncapped(str(cut.blocked or "no complete source transaction"))
    _log(run_id, run_cut, staged)
    return run_cut


def _resumed(settings: Settings, partitions: Sequence[PlannedPartition]
             ) -> set[TopicPartition]:
    """The partitions whose range starts after records this pipeline did not read with
    the cut: at an offset a run stored, or a new pipeline's ``starting_offsets = "latest"``
    (a new pipeline's partition read from ``earliest`` has nothing behind it)."""
    latest = settings.kafka.starting_offsets == "latest"
    return {p.range.tp for p in partitions if p.stored is not None or latest}


def _log(run_id: int, run_cut: RunCut, staged: Mapping[TopicPartition, StagedRange]) -> None:
    c, m = run_cut.cut, run_cut.metadata
    short = run_cut.cut_short()
    if c.unended:
        now = time.time() * 1000
        first = [s.started[tx] for s in staged.values() for tx in c.unended if tx in s.started]
        age = (now - min(first)) / 1000 if first else 0.0
        log.info("run %s: source transactions %s have events read but no END in %s[%d] "
                 "(read up to offset %d) yet; they wait for the next run (the oldest for "
                 "%.1f s)", run_id, ", ".join(c.unended[:5]) +
                 (f" and {len(c.unended) - 5} more" if len(c.unended) > 5 else ""),
                 m.topic, PARTITION, m.latest, age,
                 extra={"event": "transactions.unended", "transactions": list(c.unended),
                        "age_seconds": round(age, 3)})
    if short:
        why = (f"at {c.blocked}" if c.blocked is not None else
               "at a source transaction whose END is not read yet")
        log.info("run %s: cut %s: %s; the rest is read again by the next run", run_id, why,
                 ", ".join(f"{r.topic}[{r.partition}] publishes [{r.from_offset}, "
                           f"{r.until_offset}) of [{r.from_offset}, {full.until_offset})"
                           for r, full in ((short[x.tp], x) for x in run_cut.ranges
                                           if x.tp in short)),
                 extra={"event": "transactions.cut", "cut": [r.as_dict() for r in
                                                               short.values()],
                        "blocked": c.blocked.tx if c.blocked else None})
    if c.replays:
        log.info("run %s: changes Kafka Connect wrote again (their originals already read) "
                 "left out: %s", run_id, ", ".join(
                     f"{t}[{p}] " + " ".join(f"{a}-{b}" if a < b else f"{a}" for a, b in runs)
                     for (t, p), runs in sorted(c.replays.items())),
                 extra={"event": "transactions.replayed", "replayed": {
                     f"{t}[{p}]": [list(r) for r in runs]
                     for (t, p), runs in sorted(c.replays.items())}})
    log.info("run %s: %d source transactions whole (%d passed), transaction topic %s[%d] -> "
             "%s", run_id, len(c.included), len(c.passed), m.topic, PARTITION,
             c.metadata_next if c.metadata_next is not None else m.start,
             extra={"event": "transactions.included", "included": len(c.included),
                    "passed": len(c.passed)})
