"""``pipeline backfill``: re-read an explicit offset or time range of one topic. The bounds
asked for are checked (pure: ``backfill_bounds``), then turned into ranges against what
Kafka holds (``resolve_backfill``), all before any work; the stored offsets never move."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.commands.args import OFFSET, PARTITION, add_command, parse_time_ms
from pipeline.commands.output import (
    add_summary_file,
    print_json,
    render_table,
    write_summary,
)
from pipeline.commands.partitions import require_topic, select_partitions
from pipeline.commands.run import print_summary
from pipeline.config import Settings
from pipeline.errors import EXIT_OK, ConfigError
from pipeline.plan.offsets import OffsetRange, plan_backfill

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class BackfillBounds:
    """What was asked: either an offset range or a time range (ms), end exclusive."""

    from_offset: int | None = None
    to_offset: int | None = None
    from_ms: int | None = None
    to_ms: int | None = None

    @property
    def by_time(self) -> bool:
        return self.from_ms is not None

    def as_dict(self) -> dict[str, Any]:
        """What was asked, for the run row (times as ISO 8601 UTC)."""
        if self.by_time:
            return {"from_time": _iso(self.from_ms), "to_time": _iso(self.to_ms)}
        return {"from_offset": self.from_offset, "to_offset": self.to_offset}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def backfill_bounds(args: argparse.Namespace) -> BackfillBounds:
    offsets = (args.from_offset, args.to_offset)
    times = (args.from_time, args.to_time)
    if any(v is not None for v in offsets) and any(v is not None for v in times):
        raise ConfigError("give either --from-offset/--to-offset or --from-time/--to-time, "
                          "not both")
    if all(v is not None for v in offsets):
        if args.to_offset < args.from_offset:
            raise ConfigError(f"--to-offset {args.to_offset} is before --from-offset "
                              f"{args.from_offset}; the range is [from, to), to exclusive")
        return BackfillBounds(from_offset=args.from_offset, to_offset=args.to_offset)
    if all(v is not None for v in times):
        start = parse_time_ms(args.from_time, "--from-time")
        end = parse_time_ms(args.to_time, "--to-time")
        if end < start:
            raise ConfigError(f"--to-time {args.to_time} is before --from-time "
                              f"{args.from_time}; the range is [from, to), to exclusive")
        return BackfillBounds(from_ms=start, to_ms=end)
    raise ConfigError("a backfill needs a range: --from-offset A --to-offset B, or "
                      "--from-time ISO --to-time ISO (both ends; the end is exclusive)")


def resolve_backfill(settings: Settings, meta, topic: str, partitions: Sequence[int] | None,
                     bounds: BackfillBounds) -> list[OffsetRange]:
    """The explicit ranges to re-read, checked against what Kafka holds - before any work."""
    require_topic(settings, topic)
    chosen, _ = select_partitions(topic, meta.partitions([topic]), partitions)
    tps = [(topic, p) for p in chosen]
    kafka = meta.offsets(tps)
    if bounds.by_time:
        # Both ends against this one snapshot: a time past the newest record resolves to
        # the snapshot's latest offset, never to one written after it (refused as outside).
        latest = {(k.topic, k.partition): k.latest for k in kafka}
        from_offsets = meta.offsets_for_time(tps, bounds.from_ms, latest)
        until_offsets = meta.offsets_for_time(tps, bounds.to_ms, latest)
    else:
        from_offsets = dict.fromkeys(tps, bounds.from_offset)
        until_offsets = dict.fromkeys(tps, bounds.to_offset)
    return plan_backfill(kafka, from_offsets=from_offsets, until_offsets=until_offsets)


def cmd_backfill(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.driver.backfill import run_backfill
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.driver.report import describe
    from pipeline.driver.signals import StopSignals

    bounds = backfill_bounds(args)
    ranges = resolve_backfill(settings, KafkaMeta(settings.kafka), args.topic, args.partition,
                              bounds)
    kind = "reprocess" if args.reprocess else "backfill"
    log.info("%s of %s (stored offsets will not move)", kind, describe(ranges))
    with StopSignals() as signals:
        result = run_backfill(settings, ranges, reprocess=args.reprocess, signals=signals,
                              requested=bounds.as_dict(),
                              resume_key=resume_key(args.topic, args.partition, bounds),
                              restart=args.restart, dry_run=args.dry_run)
    if args.json:
        print_json(result.as_dict())
    elif args.dry_run:
        print_backfill_plan(result, settings)
    else:
        print_summary(result)
        for c in result.chunks:
            print(f"  chunk {c['chunk']}/{c['of']}: run {c['run_id']}, {c['records_read']} "
                  f"records, {c['rows_written']} rows written, {c['dead_letters']} dead "
                  f"letters ({_ranges_text(c['ranges'])})")
        if result.resumed:
            print(f"resumed: chunks 1-{result.resumed} were committed by an earlier, "
                  "interrupted invocation of this backfill")
        if not ranges:
            print("the requested range holds no offsets: nothing read")
        print("stored offsets unchanged")
    if args.summary_file:
        write_summary(result.as_dict(), args.summary_file)
    return EXIT_OK


def resume_key(topic: str, partitions: Sequence[int] | None, bounds: BackfillBounds) -> dict:
    """What makes a rerun "the same backfill" (it resumes an interrupted one): the topic,
    the partitions chosen and the bounds as asked (a time range is not re-resolved: the
    rerun finishes the ranges the first invocation resolved)."""
    return {"topic": topic, "partitions": sorted(set(partitions)) if partitions else "all",
            **bounds.as_dict()}


def _ranges_text(ranges: Sequence[dict]) -> str:
    return ", ".join(f"{r['topic']}[{r['partition']}] [{r['from']}, {r['until']})"
                     for r in ranges) or "nothing"


def print_backfill_plan(result, settings: Settings, out=None) -> None:
    """A dry run: the chunks (one transaction each) with their ranges and offsets."""
    out = out or sys.stdout
    rows = [[c["chunk"], r["topic"], r["partition"], r["from"], r["until"], r["offsets"]]
            for c in result.chunks for r in c["ranges"]]
    print(render_table(["chunk", "topic", "partition", "from", "until", "offsets"], rows),
          file=out)
    total = sum(c["offsets"] for c in result.chunks)
    k = settings.kafka
    caps = (f"kafka.max_records_per_partition = {k.max_records_per_partition or 'no cap'}, "
            f"kafka.max_records_per_run = {k.max_records_per_run or 'no cap'}")
    print(f"{result.kind}: {total} offsets in {len(result.chunks)} transactions ({caps}); "
          "records may be fewer than offsets (transaction markers, compaction)", file=out)
    if result.resumed:
        print(f"resuming: chunks 1-{result.resumed} of {result.resumed + len(result.chunks)} "
              "were committed by an earlier, interrupted invocation (--restart starts over)",
              file=out)
    print("dry run: nothing read, nothing written", file=out)


BACKFILL_HELP = """\
Re-read an explicit range of one topic and write its results idempotently. Rows already
in the results table stay as they are (a re-read adds 0 rows) unless --reprocess, which
replaces what the range held: its rows and dead letters are rewritten (new run_id and
ingested_at), and those this run no longer produces (a record now a dead letter, or
filtered out by a changed transform) are removed, all in one transaction. The stored
offsets do NOT move: the next scheduled run continues where it would have. The run is
recorded in pipeline_runs as kind 'backfill' (or 'reprocess') with its ranges.

A long range runs as a sequence of bounded transactions with the caps of a scheduled run
(kafka.max_records_per_partition, kafka.max_records_per_run): one run row per chunk, each
chunk committed on its own, progress logged as 'chunk i/n'. If the command is killed or
stopped, what committed stays; rerunning the same command resumes with the first chunk
that did not commit (--restart starts over). --dry-run prints the chunks and changes
nothing.

The range is [from, to): --to-offset is exclusive, like the stored offsets. Times are
resolved per partition with Kafka's offsets-for-times (the first offset whose timestamp
is >= the time); a time without a zone is UTC. A range outside what Kafka holds is refused
before anything runs (exit 3)."""

BACKFILL_EXAMPLES = """\
examples:
  # re-read offsets 1000..1999 of partition 0 (rows already present are kept)
  pipeline backfill --config conf/local.toml --topic demo_orders --partition 0 \\
      --from-offset 1000 --to-offset 2000
  # what a long backfill will do: its chunks, offsets and transactions
  pipeline backfill --config conf/local.toml --topic demo_orders --dry-run \\
      --from-time 2026-01-01T00:00:00Z --to-time 2026-02-01T00:00:00Z
  # rewrite one hour of every partition after fixing a transform
  pipeline backfill --config conf/local.toml --topic demo_orders --reprocess \\
      --from-time 2026-01-31T12:00:00Z --to-time 2026-01-31T13:00:00Z
"""


def register(sub) -> None:
    bf = add_command(sub, "backfill", "Re-read an explicit offset or time range of one topic; "
                     "rows are written idempotently (or overwritten with --reprocess); offsets "
                     "do not move.", BACKFILL_HELP, BACKFILL_EXAMPLES)
    bf.add_argument("--topic", required=True,
                    help="a topic of this pipeline's (kafka.topics, or kafka.topic_pattern's)")
    bf.add_argument("--partition", type=PARTITION, action="append", metavar="P",
                    help="partition to re-read (repeat for several; default: all partitions)")
    bf.add_argument("--from-offset", type=OFFSET, metavar="A",
                    help="first offset to read (inclusive)")
    bf.add_argument("--to-offset", type=OFFSET, metavar="B",
                    help="offset to stop at (exclusive)")
    bf.add_argument("--from-time", metavar="ISO8601",
                    help="read from the first record at or after this time")
    bf.add_argument("--to-time", metavar="ISO8601",
                    help="stop before the first record at or after this time (exclusive)")
    bf.add_argument("--reprocess", action="store_true",
                    help="replace what the range held: rewrite its rows and dead letters and "
                         "remove those this run no longer produces (default: keep existing "
                         "rows, add missing)")
    bf.add_argument("--dry-run", action="store_true",
                    help="print the plan (chunks, ranges, offsets, transactions) and change "
                         "nothing: no lock, no Spark")
    bf.add_argument("--restart", action="store_true",
                    help="start over even if an earlier invocation of the same backfill was "
                         "interrupted (default: resume with what it did not commit)")
    bf.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    add_summary_file(bf)
    bf.set_defaults(handler=cmd_backfill)
