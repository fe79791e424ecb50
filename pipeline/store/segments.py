"""The read tasks' summaries by source transaction ([sink] transactions), read back from a
run's staging table on the driver: per partition what plan/transactions.py cuts on (a
ReadPartition), and where the ledger row of a cut range comes from.

Each range read has a SEGMENTS blob beside its HASH (executor/segments.py, staging.py); the
summaries of the attempts the publisher chose (Spark partition -> task attempt id, as
Publisher.parts) are the ones read, as for the ledger (store/ledger.py). Read on a
connection of the caller's: the publisher's second one, as its publishing connection may
be in a COPY.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg import sql

from pipeline.executor.content_hash import ContentHash
from pipeline.executor.segments import summary
from pipeline.executor.staging import HASH, SEGMENTS
from pipeline.plan.offsets import OffsetRange, TopicPartition
from pipeline.plan.transactions import ReadPartition, Segment


@dataclass(frozen=True)
class StagedRange:
    """One range's summary: ``read`` for the cut; ``starts``: each segment's first offset
    -> (the range's records before it, their content hash); ``records``, ``digest``: the
    whole range's (its HASH summary)."""

    read: ReadPartition
    starts: Mapping[int, tuple[int, bytes]]
    records: int
    digest: bytes
    started: Mapping[str, int] = dataclasses.field(default_factory=dict)  # tx -> Kafka ms

    @property
    def range(self) -> OffsetRange:
        return self.read.range

    def ledger_at(self, cut: int) -> tuple[int, bytes]:
        """(records, content hash) of ``[from, cut)``: the ledger row of the range cut at
        ``cut``, which must be its end, its start or a segment's first offset
        (TransactionCut.until is)."""
        r = self.read.range
        if cut == r.until_offset:
            return self.records, self.digest
        if cut == r.from_offset:
            return 0, ContentHash().digest()
        if cut not in self.starts:
            raise ValueError(f"{r}: {cut} is not where a segment starts; a cut is at the start "
                             "of a source transaction's first segment (plan/transactions.py)")
        return self.starts[cut]


def staged_ranges(conn, staging: sql.Composable, parts: Mapping[int, int]
                  ) -> dict[TopicPartition, StagedRange]:
    """The summaries of the chosen attempts (``parts``: Spark partition -> task attempt id)
    of ``staging`` (Run.staging), on the psycopg connection ``conn``; per partition. A
    partition read by more than one range is refused: its distinct counts would not be
    exact (plan/split.py's ``whole`` keeps a range in one task)."""
    rows = conn.execute(sql.SQL(
        'SELECT topic, "partition", kind, n, min_offset, max_offset, blob FROM {} '
        "WHERE kind = ANY(%s) AND (part, task) IN (SELECT * FROM unnest(%s::int[], "
        "%s::bigint[])) ORDER BY topic, \"partition\", min_offset").format(staging),
        ([HASH, SEGMENTS], list(parts), list(parts.values())), binary=True).fetchall()
    hashes = {(t, p, lo, hi): (int(n), bytes(blob))
              for t, p, kind, n, lo, hi, blob in rows if kind == HASH}
    out: dict[TopicPartition, StagedRange] = {}
    for t, p, kind, _, lo, hi, blob in rows:
        if kind != SEGMENTS:
            continue
        r = OffsetRange(t, p, lo, hi)
        if r.tp in out:
            raise ValueError(f"{r.topic}[{r.partition}] was read in more than one range "
                             f"({out[r.tp].range}, {r}): a pipeline that keeps source "
                             "transactions whole reads each partition in one task "
                             "(split_ranges(..., whole=True))")
        segments, events, first_ms, replays = summary(bytes(blob))
        records, digest = hashes[(t, p, lo, hi)]
        out[r.tp] = StagedRange(
            ReadPartition(r, tuple(Segment(tx, first, last) for tx, first, last, _, _
                                   in segments), events, replays),
            {first: (before, d) for _, first, _, before, d in segments}, records, digest,
            first_ms)
    return out


def read_partitions(staged: Mapping[TopicPartition, StagedRange],
                    planned: Sequence[OffsetRange]) -> list[ReadPartition]:
    """What cut_at_transactions takes as ``read``: every planned partition's (``planned``:
    the plan's ranges, empty ones too: a partition with nothing new still tells where its
    topic is), its staged summary where it was read."""
    out = []
    for r in planned:
        if r.tp in staged:
            out.append(staged[r.tp].read)
        elif r.count == 0:
            out.append(ReadPartition(r))
        else:
            raise ValueError(f"{r} was planned but no summary of it was staged: every read "
                             "range stages one (executor/stage.range_stager with "
                             "transactions)")
    return out
