"""What ``pipeline verify`` proves, as pure functions: which offsets the pipeline published
(the union of its succeeded runs' planned ranges), and, for one range, how the offsets
Kafka returns compare with the offsets in the results and dead-letter tables.

No I/O: the three offset streams come in sorted and are merged in one pass, so a range of
any size is reconciled in constant memory (only the first few mismatches are kept by
offset; all of them are counted)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

from pipeline.plan.offsets import OffsetRange, TopicPartition

KEEP = 20  # mismatching offsets named per kind and range; the rest are counted


@dataclass
class Findings:
    """One range reconciled. ``expected``: records Kafka returned; ``rows`` and
    ``dead_letters``: offsets of the range in each table. A record in exactly one table is
    a match; ``missing`` is a record in neither, ``unexpected`` an offset a table claims
    that is no record in Kafka (a forged row, or an aborted, compacted or transaction-marker
    offset), ``duplicates`` a record in both tables. ``gone``: offsets a table claims where a
    compacted topic holds no record now (compacted away after it was published, which no
    read tells from a row that never had a record): not compared."""

    range: OffsetRange
    expected: int = 0
    rows: int = 0
    dead_letters: int = 0
    missing: int = 0
    unexpected: int = 0
    duplicates: int = 0
    gone: int = 0
    missing_offsets: list[int] = field(default_factory=list)
    unexpected_offsets: list[int] = field(default_factory=list)
    duplicate_offsets: list[int] = field(default_factory=list)
    gone_offsets: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicates)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["range"] = self.range.as_dict(count=False)
        return d


def _note(kept: list[int], offset: int, keep: int) -> None:
    if len(kept) < keep:
        kept.append(offset)


def reconcile(r: OffsetRange, kafka: Iterable[int], rows: Iterable[int],
              dead: Iterable[int], keep: int = KEEP, compacted: bool = False) -> Findings:
    """Kafka's record offsets of ``r`` vs the offsets the results table (``rows``) and
    the dead-letter table (``dead``) hold inside ``r``. Each input ascending; an offset
    repeated inside one table counts as a duplicate. ``compacted``: the topic compacts, so
    an offset claimed with no record may be one compacted away since (``gone``)."""
    f = Findings(r)
    streams = [iter(kafka), iter(rows), iter(dead)]
    heads = [next(s, None) for s in streams]
    while any(h is not None for h in heads):
        offset = min(h for h in heads if h is not None)
        counts = [0, 0, 0]
        for i, s in enumerate(streams):
            while heads[i] == offset:
                counts[i] += 1
                heads[i] = next(s, None)
        in_kafka, in_rows, in_dead = counts
        f.rows += in_rows
        f.dead_letters += in_dead
        if in_kafka:
            f.expected += 1
            if in_rows + in_dead == 0:
                f.missing += 1
                _note(f.missing_offsets, offset, keep)
            elif in_rows + in_dead > 1:
                f.duplicates += 1
                _note(f.duplicate_offsets, offset, keep)
        elif compacted:
            f.gone += 1
            _note(f.gone_offsets, offset, keep)
        else:
            f.unexpected += 1
            _note(f.unexpected_offsets, offset, keep)
    return f


def published(plans: Iterable[Iterable[dict]],
              archived: dict[str, int] | None = None,
              runs: Sequence[int] | None = None) -> dict[TopicPartition, list[OffsetRange]]:
    """The union of planned ranges (run rows' ``planned``, oldest run first) per partition,
    overlapping and adjacent ranges merged. ``archived``: topic -> the run that archived
    its rows (a recreated topic); ranges of that topic planned by runs before it are gone
    from the tables, so they are left out (``runs``: each plan's run id)."""
    by_tp: dict[TopicPartition, list[OffsetRange]] = {}
    for i, planned in enumerate(plans):
        run_id = runs[i] if runs is not None else None
        for d in planned:
            r = OffsetRange.from_dict(d)
            if r.until_offset <= r.from_offset:
                continue
            if archived and run_id is not None and run_id < archived.get(r.topic, -1):
                continue
            by_tp.setdefault(r.tp, []).append(r)
    return {tp: merge(rs) for tp, rs in sorted(by_tp.items())}


def merge(ranges: Iterable[OffsetRange]) -> list[OffsetRange]:
    """Ranges of one partition -> disjoint, ascending, none adjacent to the next."""
    out: list[OffsetRange] = []
    for r in sorted(ranges, key=lambda r: r.from_offset):
        if out and r.from_offset <= out[-1].until_offset:
            last = out[-1]
            out[-1] = OffsetRange(last.topic, last.partition, last.from_offset,
                                  max(last.until_offset, r.until_offset))
        else:
            out.append(r)
    return out


def clip(ranges: Iterable[OffsetRange], start: int | None, end: int | None
         ) -> Iterator[OffsetRange]:
    """The parts of ``ranges`` inside ``[start, end)`` (None: unbounded)."""
    for r in ranges:
        lo = r.from_offset if start is None else max(r.from_offset, start)
        hi = r.until_offset if end is None else min(r.until_offset, end)
        if hi > lo:
            yield OffsetRange(r.topic, r.partition, lo, hi)


def chunk_windows(ranges: Sequence[OffsetRange], start: int, end: int, size: int
                  ) -> list[tuple[int, int]]:
    """``[start, end)`` cut into consecutive windows that each hold at most ``size`` offsets
    of ``ranges`` (ascending, disjoint, inside ``[start, end)``): verify checks one window per
    snapshot, so no snapshot lasts longer than re-reading ``size`` offsets. The windows cover
    ``[start, end)`` whole, the last reaching ``end``: a range published after they were cut,
    or a row no run published, falls in one of them."""
    bounds = [start]
    held = 0  # offsets of ``ranges`` since the last bound
    for r in ranges:
        lo = r.from_offset
        while r.until_offset - lo > size - held:
            lo += size - held
            bounds.append(lo)
            held = 0
        held += r.until_offset - lo
    return [(lo, hi) for lo, hi in zip(bounds, [*bounds[1:], end], strict=True) if hi > lo]


def retained(r: OffsetRange, earliest: int) -> tuple[OffsetRange | None, OffsetRange | None]:
    """``r`` split at Kafka's earliest offset: (the part retention deleted, the part Kafka
    still holds); either may be None."""
    if earliest <= r.from_offset:
        return None, r
    if earliest >= r.until_offset:
        return r, None
    return (OffsetRange(r.topic, r.partition, r.from_offset, earliest),
            OffsetRange(r.topic, r.partition, earliest, r.until_offset))


def offset_unexplained(tp: TopicPartition, next_offset: int, run_id: int | None,
                       writer: dict | None) -> str | None:
    """Why a stored offset is not what the run recorded as its writer set (None: it is).
    A publishing run sets a partition's offset to the end of its planned range, an
    'offsets' run to the change its details record; anything else (a row edited by hand, or
    forged) moved the offset past records no run published, or back over them."""
    if run_id is None:  # a row from before the offsets table named its writer
        return None
    if writer is None:
        return f"stored offset {next_offset} names run {run_id}, which is not in pipeline_runs"
    if writer["status"] != "succeeded":
        return (f"stored offset {next_offset} was written by run {run_id}, which did not "
                f"succeed ({writer['status']})")
    if writer["kind"] == "offsets":
        set_to = {(c["topic"], c["partition"]): c["new"]
                  for c in writer["details"].get("changes", [])}
        what = "its offsets change"
    else:
        set_to = {r.tp: r.until_offset for r in map(OffsetRange.from_dict, writer["planned"])}
        what = "its planned range's end"
    if tp not in set_to:
        return (f"stored offset {next_offset} names run {run_id} ({writer['kind']}), which "
                "did not set this partition")
    if set_to[tp] != next_offset:
        return (f"stored offset {next_offset}, but run {run_id} ({writer['kind']}) set it to "
                f"{set_to[tp]} ({what})")
    return None
