"""``pipeline offsets show|set|reset``: read or move the stored next offsets, the source of
truth for where runs resume. What a move changes is planned purely (``parse_target``,
``plan_offset_changes``); it is written under both run locks, recorded as a run of kind
``offsets``."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from pipeline.commands.args import PARTITION, add_command, parse_time_ms
from pipeline.commands.output import print_json, render_table
from pipeline.commands.partitions import require_topic, select_partitions
from pipeline.config import Settings
from pipeline.errors import EXIT_OK, ConfigError, DataError, TransientError
from pipeline.plan.offsets import PartitionOffsets, TopicPartition

# ---- planning a change (pure) ------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where ``offsets set`` moves a partition: earliest, latest, an offset, or a time."""

    kind: str  # earliest | latest | offset | time
    value: int | None = None  # the offset, or epoch milliseconds
    text: str = ""

    def __str__(self) -> str:
        return self.text or self.kind


def parse_target(text: str) -> Target:
    t = text.strip()
    if t in ("earliest", "latest"):
        return Target(t, None, t)
    if re.fullmatch(r"\d+", t):
        return Target("offset", int(t), t)
    if re.fullmatch(r"-\d+", t):
        raise ConfigError(f"--to {t}: offsets are >= 0; use earliest, latest, an offset or "
                          "an ISO 8601 time")
    try:
        return Target("time", parse_time_ms(t, "--to"), t)
    except ConfigError:
        raise ConfigError(f"--to {text!r}: use earliest, latest, an offset (e.g. 1200) or an "
                          "ISO 8601 time (e.g. 2026-01-31T12:00:00Z)") from None


@dataclass(frozen=True)
class OffsetChange:
    topic: str
    partition: int
    old: int | None  # None: no stored row yet
    new: int | None  # None: forget the row (the partition is gone from Kafka)
    earliest: int | None = None
    latest: int | None = None

    @property
    def changes(self) -> bool:
        return self.old != self.new


def resolve_target(target: Target, k: PartitionOffsets,
                   for_time: Mapping[TopicPartition, int] | None = None) -> int:
    """The next offset to read for one partition, validated against what Kafka holds."""
    if target.kind == "earliest":
        return k.earliest
    if target.kind == "latest":
        return k.latest
    if target.kind == "time":
        return (for_time or {})[(k.topic, k.partition)]
    n = target.value
    if not k.earliest <= n <= k.latest:
        raise DataError(
            f"{k.topic}[{k.partition}]: --to {n} is outside what Kafka holds "
            f"[{k.earliest}, {k.latest}]; choose an offset in that range ({k.earliest} = "
            f"earliest, {k.latest} = latest: nothing left to read)")
    return n


def plan_offset_changes(stored: Mapping[TopicPartition, int], kafka: Iterable[PartitionOffsets],
                        target: Target, for_time: Mapping[TopicPartition, int] | None = None,
                        forget: Iterable[TopicPartition] = ()) -> list[OffsetChange]:
    changes = [OffsetChange(k.topic, k.partition, stored.get((k.topic, k.partition)),
                            resolve_target(target, k, for_time), k.earliest, k.latest)
               for k in kafka]
    changes += [OffsetChange(t, p, stored[(t, p)], None) for t, p in forget]
    return sorted(changes, key=lambda c: (c.topic, c.partition))


def recounted(c: OffsetChange) -> tuple[int, int] | None:
    """The offsets ``[from, until)`` an aggregate would count a second time after this
    move, or None. Counted are the offsets below the stored one; read again are those at
    or after the new one that Kafka still holds. So moving forward re-reads nothing, and
    neither does moving to the new end of a log truncated below the stored offset
    (``--to latest``: the records counted past it are gone, later ones are new)."""
    if c.old is None or c.new is None:
        return None
    start = max(c.new, c.earliest if c.earliest is not None else c.new)
    until = min(c.old, c.latest if c.latest is not None else c.old)
    return (start, until) if start < until else None


def change_table(changes: Sequence[OffsetChange]) -> str:
    def delta(c: OffsetChange) -> str:
        if c.new is None:
            return "forget (gone from Kafka)"
        if c.old is None:
            return "new row"
        d = c.new - c.old
        return "unchanged" if d == 0 else (f"rewind {-d}" if d < 0 else f"skip {d}")

    return render_table(["topic", "partition", "stored", "new", "earliest", "latest", "change"],
                        [[c.topic, c.partition, c.old, c.new, c.earliest, c.latest, delta(c)]
                         for c in changes])


def confirm(question: str, yes: bool, stdin=None, out=None,
            refusing: str = "change offsets") -> bool:
    """True to go ahead. --yes skips the question; without a terminal there is nobody to
    ask, so refuse rather than guess."""
    if yes:
        return True
    stdin = stdin or sys.stdin
    out = out or sys.stderr
    if not (hasattr(stdin, "isatty") and stdin.isatty()):
        raise ConfigError(f"refusing to {refusing} without confirmation: stdin is not a "
                          "terminal; review the table above and rerun with --yes")
    print(f"{question} [y/N] ", end="", file=out, flush=True)
    answer = stdin.readline().strip().lower()
    return answer in ("y", "yes")


# ---- the commands ------------------------------------------------------------------------

def apply_offset_changes(store, sink, changes: Sequence[OffsetChange], target: Target,
                         command: str, topic_ids: dict[str, str] | None = None,
                         archive: dict[str, list[str]] | None = None) -> tuple[int, dict]:
    """Record the change as a run of kind 'offsets', then write it (archiving the rows of
    recreated topics, in ``sink``'s table, in the same transaction; None: the topic has no
    table yet). Caller holds the lock."""
    from pipeline.store.run import Kind

    details = {"command": command, "to": str(target), "topic_ids": topic_ids or {},
               "changes": [{"topic": c.topic, "partition": c.partition, "old": c.old,
                            "new": c.new} for c in changes]}
    run = store.runs.start(Kind.OFFSETS, [], details)
    try:
        archived = store.offsets.change({(c.topic, c.partition): c.new for c in changes}, run,
                                        topic_ids, archive, sinks=[sink] if sink else [])
    except BaseException as e:
        store.runs.fail(run, getattr(e, "message", None) or f"{type(e).__name__}: {e}",
                        getattr(e, "exit_code", 1), {})
        raise
    return run.id, archived


def cmd_offsets_set(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.sinks import for_sink
    from pipeline.store import Store
    from pipeline.store.archive import archive_table

    command = args.offsets_command
    target = parse_target(args.to if args.to is not None else settings.kafka.starting_offsets)
    require_topic(settings, args.topic)
    meta = KafkaMeta(settings.kafka)
    # The table the topic's records go to (its route).
    sink = for_sink(settings.routes.for_topic(args.topic), settings.schema, settings.name)
    out = sys.stderr if args.json else sys.stdout

    def plan(store) -> tuple[list[OffsetChange], list[OffsetChange], list[str], str]:
        """The changes, those that change a row, the recreated topic's old IDs, its ID."""
        stored = store.offsets.load([args.topic])
        [(topic_id, parts)] = meta.describe([args.topic]).values()
        old_ids = sorted(store.offsets.topic_ids([args.topic]).get(args.topic, set())
                         - {topic_id})
        chosen, gone = select_partitions(args.topic, [(args.topic, p) for p in parts],
                                         args.partition, stored)
        if old_ids and args.partition is not None:
            raise ConfigError(
                f"topic '{args.topic}' was deleted and recreated (ID {', '.join(old_ids)} -> "
                f"{topic_id}): every stored offset of it belongs to the old topic; change "
                "them all at once: drop --partition")
        tps = [(args.topic, p) for p in chosen]
        kafka = meta.offsets(tps)
        for_time = meta.offsets_for_time(tps, target.value) if target.kind == "time" else None
        changes = plan_offset_changes(stored, kafka, target, for_time,
                                      [(args.topic, p) for p in gone])
        # A recreated topic: every row is rewritten, with the new topic ID.
        return changes, [c for c in changes if c.changes or old_ids], old_ids, topic_id

    with Store(settings) as store:
        if settings.kafka.topic_pattern is not None and store.schema.missing_tables([sink]):
            sink = None  # a pattern's topic no run has read yet: it has no table yet
        store.schema.check([sink] if sink else [])
        # Planned and confirmed without the run locks: an operator thinking at the prompt
        # must not keep the scheduled runs out (they would exit 75 meanwhile).
        changes, effective, old_ids, topic_id = plan(store)
        print(change_table(changes), file=out)
        if old_ids:
            print(f"topic '{args.topic}' was deleted and recreated (ID {', '.join(old_ids)} -> "
                  f"{topic_id}): its result rows and dead letters of pipeline "
                  f"'{settings.name}' will be moved to "
                  f"{archive_table(sink) if sink else 'the archive'} and "
                  "pipeline_dead_letters_archived, so that the new topic's records are "
                  "written", file=out)
        if not effective:
            print("nothing to change: the stored offsets already are the target", file=out)
            if args.json:
                print_json({"run_id": None, "changes": []})
            return EXIT_OK
        rewound = [(c, span) for c in effective if (span := recounted(c))]
        if rewound and not old_ids and sink is not None:
            c, (start, until) = rewound[0]
            refused = sink.refuses_reread(
                f"rewinding {c.topic}[{c.partition}] from {c.old} to {c.new} (re-reads "
                f"offsets [{start}, {until}))")
            if refused and store.results(sink).hold_rows():
                raise ConfigError(refused)
        if not confirm(f"change {len(effective)} stored offsets of pipeline "
                       f"'{settings.name}'?", args.yes):
            print("cancelled: nothing changed", file=out)
            return EXIT_OK
        # Held until we exit: no run can start (or be half-way) while offsets change; what
        # was confirmed is what is written, or nothing.
        store.locks.lock_or_fail(f"offsets {command}", families=("ingest", "backfill"))
        now = store.offsets.load([args.topic])
        if any(now.get((c.topic, c.partition)) != c.old for c in changes):
            raise TransientError(
                f"offsets {command} did nothing: the stored offsets of topic '{args.topic}' "
                f"(pipeline '{settings.name}') changed while the change was being confirmed "
                "(a run published); run the command again to see the new table")
        run_id, archived = apply_offset_changes(
            store, sink, effective, target, command, {args.topic: topic_id},
            {args.topic: old_ids} if old_ids else None)
        # Still under the lock: a run that starts after us cannot have its newer offsets
        # overwritten in the mirror by ours.
        if settings.kafka.mirror_group:
            meta.mirror_offsets(settings.kafka.mirror_group,
                                {(c.topic, c.partition): c.new for c in effective
                                 if c.new is not None})
    if args.json:
        print_json({"run_id": run_id, "changes": [asdict(c) for c in effective],
                    "archived": archived})
    else:
        for topic, a in archived.items():
            print(f"archived {a['rows']} result rows and {a['dead_letters']} dead letters of "
                  f"'{topic}' (topic ID {a['topic_id']})")
        print(f"run {run_id}: {len(effective)} offsets changed; the next run reads from the "
              "new offsets")
    return EXIT_OK


def cmd_offsets_show(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks import for_tables
    from pipeline.store import Store

    with Store(settings) as store:
        store.schema.check(for_tables(settings, settings.kafka.topics))
        rows = store.offsets.rows()
    if args.json:
        print_json({"pipeline": settings.name, "offsets": rows})
        return EXIT_OK
    if not rows:
        print(f"pipeline '{settings.name}' has no stored offsets yet: the first run starts at "
              f"{settings.kafka.starting_offsets}")
        return EXIT_OK
    print(render_table(["topic", "partition", "next_offset", "topic_id", "updated_at", "run_id",
                        "run_kind"],
                       [[r["topic"], r["partition"], r["next_offset"], r["topic_id"],
                         r["updated_at"], r["run_id"], r["run_kind"]] for r in rows]))
    return EXIT_OK


# ---- registration ------------------------------------------------------------------------

OFFSETS_HELP = """\
Inspect or move the stored next offsets (Postgres is the source of truth; consumer-group
offsets are only a mirror). 'show' reads them; 'set' and 'reset' move them under the
pipeline's run lock, so they refuse while a run is in progress (exit 75)."""

SHOW_HELP = ("Print the stored next offset per partition, when it last moved and by which "
             "run. Reads Postgres only.")

SET_HELP = """\
Move the stored next offset of a topic's partitions (all of them unless --partition) to
earliest, latest, an offset, or the first offset at/after an ISO 8601 time. The target is
checked against what Kafka holds (exit 3 if outside). The change is shown and must be
confirmed on a terminal (--yes skips the question; without a terminal --yes is required).
Recorded in pipeline_runs as kind 'offsets' with the old and new offsets. Stored partitions
that Kafka no longer has (topic recreated with fewer partitions) are forgotten.
'reset' is the same command with --to defaulting to kafka.starting_offsets."""

SHOW_EXAMPLES = """\
examples:
  pipeline offsets show --config conf/local.toml
  pipeline offsets show --config conf/local.toml --json
"""

SET_EXAMPLES = """\
examples:
  # re-read everything still in Kafka on the next run (results stay idempotent)
  pipeline offsets reset --config conf/local.toml --topic demo_orders --to earliest --yes
  # skip partition 2 forward past a poison range
  pipeline offsets set --config conf/local.toml --topic demo_orders --partition 2 --to 51234
  # rewind every partition to where it stood at 09:00 UTC
  pipeline offsets set --config conf/local.toml --topic demo_orders --to 2026-01-31T09:00:00Z
"""


def register(sub) -> None:
    off = add_command(sub, "offsets", "Show, set or reset the stored next offsets (the source "
                      "of truth).", OFFSETS_HELP, SET_EXAMPLES)
    actions = off.add_subparsers(dest="offsets_command", required=True, metavar="ACTION")

    def add_action(name: str, summary: str, description: str, examples: str):
        # --config is accepted after the action too; SUPPRESS keeps one given before it.
        p = add_command(actions, name, summary, description, examples,
                        config_default=argparse.SUPPRESS)
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        return p

    show = add_action("show", "print the stored next offsets", SHOW_HELP, SHOW_EXAMPLES)
    show.set_defaults(handler=cmd_offsets_show)
    for name, required in (("set", True), ("reset", False)):
        p = add_action(name, "move stored offsets" if name == "set" else
                       "move stored offsets (--to defaults to kafka.starting_offsets)",
                       SET_HELP, SET_EXAMPLES)
        p.add_argument("--topic", required=True,
                       help="a topic of this pipeline's (kafka.topics, or kafka.topic_pattern's)")
        p.add_argument("--partition", type=PARTITION, action="append", metavar="P",
                       help="partition to move (repeat for several; default: all partitions)")
        p.add_argument("--to", required=required, metavar="TARGET",
                       help="earliest | latest | an offset | an ISO 8601 time (UTC if no zone)"
                       + ("" if required else "; default kafka.starting_offsets"))
        p.add_argument("--yes", action="store_true",
                       help="do not ask for confirmation (needed without a terminal)")
        p.set_defaults(handler=cmd_offsets_set)
