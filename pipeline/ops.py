"""Operator commands: backfill, lag, offsets show/set/reset, runs.

Thin wiring: each ``cmd_*`` parses nothing itself; it resolves what Kafka and Postgres
hold, hands the pure parts to small functions (``resolve_target``, ``compute_lag``,
``plan_offset_changes``...), and prints a table or JSON. Postgres stays the source of
truth for offsets; these commands read it, and ``offsets set|reset`` changes it only
under the pipeline's run lock, recorded as a run of kind ``offsets``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import sql

from pipeline.config import Settings
from pipeline.errors import EXIT_CODES, EXIT_OK, ConfigError, DataError
from pipeline.offsets import OffsetRange, PartitionOffsets, TopicPartition, plan_backfill

log = logging.getLogger("pipeline")

RUN_KINDS = ("ingest", "backfill", "reprocess", "offsets")
RUN_STATUSES = ("running", "succeeded", "noop", "failed", "abandoned")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

EXIT_TABLE = "exit codes:\n" + "\n".join(
    f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


# ---- argument values ---------------------------------------------------------------------

def parse_time_ms(text: str, flag: str) -> int:
    """ISO 8601 -> epoch milliseconds. A time without a zone is UTC."""
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not an ISO 8601 time; write e.g. "
                          "2026-01-31T12:00:00Z or 2026-01-31T13:00:00+01:00") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - EPOCH) // timedelta(milliseconds=1)


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


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1")
    return n


def offset_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset (a whole number)") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: offsets are >= 0")
    return n


def partition_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a partition number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: partitions are >= 0")
    return n


def require_topic(settings: Settings, topic: str) -> None:
    if topic not in settings.kafka.topics:
        raise ConfigError(
            f"topic '{topic}' is not one of pipeline '{settings.name}' kafka.topics "
            f"({', '.join(settings.kafka.topics)}); add it to {settings.source} first or fix "
            "--topic")


def select_partitions(topic: str, in_kafka: Iterable[tuple[str, int]],
                      requested: Sequence[int] | None,
                      stored: Iterable[TopicPartition] = ()) -> tuple[list[int], list[int]]:
    """(partitions Kafka has, stored partitions Kafka no longer has) that the command acts on.

    No --partition: every partition of the topic. A requested partition that Kafka does not
    have is an error unless it is stored (then it is one to forget).
    """
    have = sorted(p for t, p in in_kafka if t == topic)
    gone_stored = sorted({p for t, p in stored if t == topic} - set(have))
    if not requested:
        return have, gone_stored
    chosen, gone = [], []
    for p in sorted(set(requested)):
        if p in have:
            chosen.append(p)
        elif p in gone_stored:
            gone.append(p)
        else:
            raise DataError(
                f"{topic}[{p}]: no such partition in Kafka (the topic has partitions "
                f"{describe_partitions(have)}); fix --partition")
    return chosen, gone


def describe_partitions(partitions: Sequence[int]) -> str:
    if not partitions:
        return "none"
    if list(partitions) == list(range(partitions[0], partitions[-1] + 1)):
        return f"{partitions[0]}-{partitions[-1]}" if len(partitions) > 1 else str(partitions[0])
    return ", ".join(map(str, partitions))


# ---- backfill ----------------------------------------------------------------------------

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
    from pipeline.cli import print_summary
    from pipeline.job import StopSignals, describe, run_backfill
    from pipeline.kafka_meta import KafkaMeta

    bounds = backfill_bounds(args)
    ranges = resolve_backfill(settings, KafkaMeta(settings.kafka), args.topic, args.partition,
                              bounds)
    kind = "reprocess" if args.reprocess else "backfill"
    log.info("%s of %s (stored offsets will not move)", kind, describe(ranges))
    with StopSignals() as signals:
        result = run_backfill(settings, ranges, reprocess=args.reprocess, signals=signals,
                              requested=bounds.as_dict())
    if args.json:
        print(json.dumps(result.as_dict(), default=str))
    else:
        print_summary(result, out=sys.stdout)  # the stdout of now, not of import time
        if not ranges:
            print("the requested range holds no offsets: nothing read")
        print("stored offsets unchanged")
    return EXIT_OK


# ---- lag ---------------------------------------------------------------------------------

@dataclass
class PartitionLag:
    topic: str
    partition: int
    stored: int | None  # the next offset to read, as stored in Postgres; None = never read
    earliest: int | None  # None: the partition is stored but Kafka no longer has it
    latest: int | None  # high watermark, or the last stable offset under read_committed
    lag: int | None  # latest - stored, or latest - the starting default if never read
    last_run_id: int | None = None  # the run that last moved this partition's offset
    last_run_finished_at: datetime | None = None
    note: str = ""


def compute_lag(stored: Mapping[TopicPartition, int], kafka: Iterable[PartitionOffsets],
                topics: Sequence[str], starting_offsets: str = "earliest") -> list[PartitionLag]:
    """Per partition of the topics: stored next offset vs what Kafka holds. Pure."""
    out = []
    held = {(k.topic, k.partition): k for k in kafka}
    known_topics = {topic for topic, _ in stored}
    for tp in sorted(set(held) | {tp for tp in stored if tp[0] in topics}):
        k, s = held.get(tp), stored.get(tp)
        # As plan_ranges: "latest" applies to a topic's first run only.
        starts_at = ("latest" if starting_offsets == "latest" and tp[0] not in known_topics
                     else "earliest")
        if k is None:
            out.append(PartitionLag(*tp, s, None, None, None,
                                    note="partition gone from Kafka: run 'pipeline offsets "
                                         f"reset --topic {tp[0]}'"))
            continue
        start = s if s is not None else (k.earliest if starts_at == "earliest" else k.latest)
        note = ""
        if s is None:
            note = f"never read: starts at {starts_at}"
        elif s > k.latest:
            note = "stored offset beyond latest: reset it"
        elif s < k.earliest:
            note = f"data loss: [{s}, {k.earliest}) deleted before it was read"
        out.append(PartitionLag(*tp, s, k.earliest, k.latest, k.latest - start, note=note))
    return out


def lag_totals(rows: Sequence[PartitionLag]) -> dict[str, dict[str, int]]:
    totals: dict[str, dict[str, int]] = {}
    for r in rows:
        t = totals.setdefault(r.topic, {"partitions": 0, "lag": 0, "max_lag": 0})
        t["partitions"] += 1
        t["lag"] += r.lag or 0
        t["max_lag"] = max(t["max_lag"], r.lag or 0)
    return totals


def stored_offset_rows(store) -> list[dict[str, Any]]:
    """pipeline_offsets of this pipeline, with the run that last moved each offset."""
    cur = store.execute(sql.SQL(
        'SELECT o.topic, o."partition", o.next_offset, o.topic_id, o.updated_at, o.run_id, '
        "r.kind, r.finished_at FROM {offsets} o LEFT JOIN {runs} r ON r.run_id = o.run_id "
        'WHERE o.pipeline = %s ORDER BY o.topic, o."partition"').format(
        offsets=store.t("pipeline_offsets"), runs=store.t("pipeline_runs")), (store.pipeline,))
    names = ["topic", "partition", "next_offset", "topic_id", "updated_at", "run_id",
             "run_kind", "run_finished_at"]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def last_success(store, kind: str = "ingest") -> dict[str, Any] | None:
    row = store.execute(sql.SQL(
        "SELECT run_id, status, finished_at FROM {} WHERE pipeline = %s AND kind = %s "
        "AND status IN ('succeeded', 'noop') ORDER BY run_id DESC LIMIT 1").format(
        store.t("pipeline_runs")), (store.pipeline, kind)).fetchone()
    return None if row is None else {"run_id": row[0], "status": row[1], "finished_at": row[2]}


def cmd_lag(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kafka_meta import KafkaMeta
    from pipeline.store import Store

    store = Store(settings)
    try:
        store.check_schema()
        rows_db = stored_offset_rows(store)
        success = last_success(store)
    finally:
        store.close()
    topics = settings.kafka.topics
    kafka = KafkaMeta(settings.kafka).topic_offsets(topics)
    stored = {(r["topic"], r["partition"]): r["next_offset"] for r in rows_db}
    rows = compute_lag(stored, kafka, topics, settings.kafka.starting_offsets)
    by_tp = {(r["topic"], r["partition"]): r for r in rows_db}
    ids = {k.topic: k.topic_id for k in kafka}
    for r in rows:
        db = by_tp.get((r.topic, r.partition))
        if db:
            r.last_run_id, r.last_run_finished_at = db["run_id"], db["run_finished_at"]
            if db["topic_id"] and ids.get(r.topic) and db["topic_id"] != ids[r.topic]:
                r.lag, r.note = None, (f"topic recreated (ID {db['topic_id']} -> "
                                       f"{ids[r.topic]}): run 'pipeline offsets reset "
                                       f"--topic {r.topic} --to earliest'")
    totals = lag_totals(rows)
    if args.json:
        print(json.dumps({
            "pipeline": settings.name, "isolation_level": settings.kafka.isolation_level,
            "last_success": success, "partitions": [asdict(r) for r in rows],
            "topics": totals, "total_lag": sum(t["lag"] for t in totals.values()),
        }, default=json_default))
        return EXIT_OK
    print(render_table(
        ["topic", "partition", "stored", "earliest", "latest", "lag", "last_run", "finished_at",
         "note"],
        [[r.topic, r.partition, r.stored, r.earliest, r.latest, r.lag, r.last_run_id,
          r.last_run_finished_at, r.note] for r in rows]))
    for topic, t in totals.items():
        print(f"{topic}: lag {t['lag']} over {t['partitions']} partitions (max {t['max_lag']})")
    latest = "latest = last stable offset" if settings.kafka.isolation_level == \
        "read_committed" else "latest = high watermark"
    when = (f"last successful ingest: run {success['run_id']} ({success['status']}) finished "
            f"{fmt(success['finished_at'])}" if success else "no successful ingest yet")
    print(f"{when}; {latest}")
    return EXIT_OK


# ---- offsets show / set / reset ----------------------------------------------------------

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


def confirm(question: str, yes: bool, stdin=None, out=None) -> bool:
    """True to go ahead. --yes skips the question; without a terminal there is nobody to
    ask, so refuse rather than guess."""
    if yes:
        return True
    stdin = stdin or sys.stdin
    out = out or sys.stderr
    if not (hasattr(stdin, "isatty") and stdin.isatty()):
        raise ConfigError("refusing to change offsets without confirmation: stdin is not a "
                          "terminal; review the table above and rerun with --yes")
    print(f"{question} [y/N] ", end="", file=out, flush=True)
    answer = stdin.readline().strip().lower()
    return answer in ("y", "yes")


def apply_offset_changes(store, changes: Sequence[OffsetChange], target: Target,
                         command: str, topic_ids: dict[str, str] | None = None,
                         archive: dict[str, list[str]] | None = None) -> tuple[int, dict]:
    """Record the change as a run of kind 'offsets', then write it (archiving the rows of
    recreated topics in the same transaction). Caller holds the lock."""
    details = {"command": command, "to": str(target), "topic_ids": topic_ids or {},
               "changes": [{"topic": c.topic, "partition": c.partition, "old": c.old,
                            "new": c.new} for c in changes]}
    run_id = store.start_run("offsets", [], details)
    try:
        archived = store.set_offsets({(c.topic, c.partition): c.new for c in changes}, run_id,
                                     topic_ids, archive)
    except BaseException as e:
        store.fail_run(run_id, getattr(e, "message", None) or f"{type(e).__name__}: {e}",
                       getattr(e, "exit_code", 1), {})
        raise
    return run_id, archived


def cmd_offsets_set(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.kafka_meta import KafkaMeta
    from pipeline.store import Store

    command = args.offsets_command
    target = parse_target(args.to if args.to is not None else settings.kafka.starting_offsets)
    require_topic(settings, args.topic)
    meta = KafkaMeta(settings.kafka)
    store = Store(settings)
    try:
        store.check_schema()
        # Held until we exit: no run can start (or be half-way) while offsets change.
        store.lock_or_fail(f"offsets {command}", families=("ingest", "backfill"))
        stored = store.load_offsets([args.topic])
        [(topic_id, parts)] = meta.describe([args.topic]).values()
        old_ids = sorted(store.load_topic_ids([args.topic]).get(args.topic, set()) - {topic_id})
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
        out = sys.stderr if args.json else sys.stdout
        print(change_table(changes), file=out)
        # A recreated topic: every row is rewritten, with the new topic ID.
        effective = [c for c in changes if c.changes or old_ids]
        if old_ids:
            print(f"topic '{args.topic}' was deleted and recreated (ID {', '.join(old_ids)} -> "
                  f"{topic_id}): its result rows and dead letters of pipeline "
                  f"'{settings.name}' will be moved to {store.archive_table()} and "
                  "pipeline_dead_letters_archived, so that the new topic's records are "
                  "written", file=out)
        if not effective:
            print("nothing to change: the stored offsets already are the target", file=out)
            if args.json:
                print(json.dumps({"run_id": None, "changes": []}))
            return EXIT_OK
        if not confirm(f"change {len(effective)} stored offsets of pipeline "
                       f"'{settings.name}'?", args.yes):
            print("cancelled: nothing changed", file=out)
            return EXIT_OK
        run_id, archived = apply_offset_changes(
            store, effective, target, command, {args.topic: topic_id},
            {args.topic: old_ids} if old_ids else None)
        # Still under the lock: a run that starts after us cannot have its newer offsets
        # overwritten in the mirror by ours.
        if settings.kafka.mirror_group:
            meta.mirror_offsets(settings.kafka.mirror_group,
                                {(c.topic, c.partition): c.new for c in effective
                                 if c.new is not None})
    finally:
        store.close()
    if args.json:
        print(json.dumps({"run_id": run_id, "changes": [asdict(c) for c in effective],
                          "archived": archived}))
    else:
        for topic, a in archived.items():
            print(f"archived {a['rows']} result rows and {a['dead_letters']} dead letters of "
                  f"'{topic}' (topic ID {a['topic_id']})")
        print(f"run {run_id}: {len(effective)} offsets changed; the next run reads from the "
              "new offsets")
    return EXIT_OK


def cmd_offsets_show(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.store import Store

    store = Store(settings)
    try:
        store.check_schema()
        rows = stored_offset_rows(store)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"pipeline": settings.name, "offsets": rows}, default=json_default))
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


# ---- runs --------------------------------------------------------------------------------

RUN_COLUMNS = ["run_id", "kind", "status", "started_at", "finished_at", "planned", "lost",
               "records_read", "rows_written", "dead_letters", "per_partition", "timings",
               "error", "exit_code", "host", "pid", "details"]


def list_runs(store, last: int = 20, status: str | None = None,
              kind: str | None = None) -> list[dict[str, Any]]:
    where = [sql.SQL("pipeline = %s")]
    params: list[Any] = [store.pipeline]
    if status:
        where.append(sql.SQL("status = %s"))
        params.append(status)
    if kind:
        where.append(sql.SQL("kind = %s"))
        params.append(kind)
    cur = store.execute(sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY run_id DESC LIMIT %s")
                        .format(sql.SQL(", ").join(map(sql.Identifier, RUN_COLUMNS)),
                                store.t("pipeline_runs"), sql.SQL(" AND ").join(where)),
                        [*params, last])
    return [dict(zip(RUN_COLUMNS, row, strict=True)) for row in cur.fetchall()]


def run_what(run: dict[str, Any]) -> str:
    """One short description of what a run covered."""
    if run["kind"] == "offsets":
        ch = (run.get("details") or {}).get("changes", [])
        parts = [f"{c['topic']}[{c['partition']}] {c['old']}->{c['new']}" for c in ch]
    else:
        parts = [f"{r['topic']}[{r['partition']}] [{r['from']}, {r['until']})"
                 for r in run.get("planned") or [] if r["until"] > r["from"]]
    if not parts:
        return "-"
    return parts[0] + (f" (+{len(parts) - 1} more)" if len(parts) > 1 else "")


def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.store import Store

    store = Store(settings)
    try:
        store.check_schema()
        runs = list_runs(store, args.last, args.status, args.kind)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"pipeline": settings.name, "runs": runs}, default=json_default))
        return EXIT_OK
    if not runs:
        print(f"no runs of pipeline '{settings.name}' match")
        return EXIT_OK
    print(render_table(
        ["run_id", "kind", "status", "started_at", "secs", "read", "written", "dead", "exit",
         "what", "error"],
        [[r["run_id"], r["kind"], r["status"], r["started_at"], duration(r), r["records_read"],
          r["rows_written"], r["dead_letters"], r["exit_code"], run_what(r),
          (r["error"] or "")[:80]] for r in runs]))
    return EXIT_OK


def duration(run: dict[str, Any]) -> str | None:
    if run["finished_at"] is None or run["started_at"] is None:
        return None
    return f"{(run['finished_at'] - run['started_at']).total_seconds():.1f}"


# ---- output ------------------------------------------------------------------------------

def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns; numbers right-aligned, None shown as '-'."""
    cells = [list(headers)] + [[fmt(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], int) or row[i] is None for row in rows)
               for i in range(len(headers))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        line = "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(r, widths, numeric, strict=True))
        lines.append(line.rstrip())
    return "\n".join(lines)


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value)


# ---- wiring ------------------------------------------------------------------------------

BACKFILL_HELP = """\
Re-read an explicit range of one topic and write its results idempotently. Rows already
in the results table stay as they are (a re-read adds 0 rows) unless --reprocess, which
replaces what the range held: its rows and dead letters are rewritten (new run_id and
ingested_at), and those this run no longer produces (a record now a dead letter, or
filtered out by a changed transform) are removed, all in one transaction. The stored
offsets do NOT move: the next scheduled run continues where it would have. The run is
recorded in pipeline_runs as kind 'backfill' (or 'reprocess') with its ranges.

The range is [from, to): --to-offset is exclusive, like the stored offsets. Times are
resolved per partition with Kafka's offsets-for-times (the first offset whose timestamp
is >= the time); a time without a zone is UTC. A range outside what Kafka holds is refused
before anything runs (exit 3)."""

BACKFILL_EXAMPLES = """\
examples:
  # re-read offsets 1000..1999 of partition 0 (rows already present are kept)
  pipeline backfill --config conf/local.toml --topic demo_orders --partition 0 \\
      --from-offset 1000 --to-offset 2000
  # rewrite one hour of every partition after fixing a transform
  pipeline backfill --config conf/local.toml --topic demo_orders --reprocess \\
      --from-time 2026-01-31T12:00:00Z --to-time 2026-01-31T13:00:00Z
"""

LAG_HELP = """\
Per partition: the stored next offset (Postgres), the earliest and latest offsets Kafka
holds (latest = last stable offset under read_committed), the lag (latest - stored; for a
partition never read, counted from kafka.starting_offsets), and the run that last moved
the offset; then totals per topic and when the last ingest succeeded. Read-only."""

LAG_EXAMPLES = """\
examples:
  pipeline lag --config conf/local.toml
  pipeline lag --config conf/local.toml --json | jq '.total_lag'
"""

OFFSETS_HELP = """\
Inspect or move the stored next offsets (Postgres is the source of truth; consumer-group
offsets are only a mirror). 'show' reads them; 'set' and 'reset' move them under the
pipeline's run lock, so they refuse while a run is in progress (exit 75)."""

SET_HELP = """\
Move the stored next offset of a topic's partitions (all of them unless --partition) to
earliest, latest, an offset, or the first offset at/after an ISO 8601 time. The target is
checked against what Kafka holds (exit 3 if outside). The change is shown and must be
confirmed on a terminal (--yes skips the question; without a terminal --yes is required).
Recorded in pipeline_runs as kind 'offsets' with the old and new offsets. Stored partitions
that Kafka no longer has (topic recreated with fewer partitions) are forgotten.
'reset' is the same command with --to defaulting to kafka.starting_offsets."""

SET_EXAMPLES = """\
examples:
  # re-read everything still in Kafka on the next run (results stay idempotent)
  pipeline offsets reset --config conf/local.toml --topic demo_orders --to earliest --yes
  # skip partition 2 forward past a poison range
  pipeline offsets set --config conf/local.toml --topic demo_orders --partition 2 --to 51234
  # rewind every partition to where it stood at 09:00 UTC
  pipeline offsets set --config conf/local.toml --topic demo_orders --to 2026-01-31T09:00:00Z
"""

RUNS_HELP = """\
Run history, newest first: kind (ingest, backfill, reprocess, offsets), status (running,
succeeded, noop, failed, abandoned), timings, counts, the ranges or offset changes, and the
error of a failed run. --json prints every column, including per-partition counts."""

RUNS_EXAMPLES = """\
examples:
  pipeline runs --config conf/local.toml --last 5
  pipeline runs --config conf/local.toml --status failed --json
  pipeline runs --config conf/local.toml --kind offsets      # who moved the offsets
"""


def _epilog(examples: str) -> str:
    return f"{examples}\n{EXIT_TABLE}"


def add_commands(sub, add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Called by pipeline.cli.build_parser: adds backfill, lag, offsets and runs."""
    bf = add("backfill", "Re-read an explicit offset or time range of one topic; rows are "
             "written idempotently (or overwritten with --reprocess); offsets do not move.")
    bf.description, bf.epilog = BACKFILL_HELP, _epilog(BACKFILL_EXAMPLES)
    bf.add_argument("--topic", required=True, help="a topic of this pipeline's kafka.topics")
    bf.add_argument("--partition", type=partition_int, action="append", metavar="P",
                    help="partition to re-read (repeat for several; default: all partitions)")
    bf.add_argument("--from-offset", type=offset_int, metavar="A",
                    help="first offset to read (inclusive)")
    bf.add_argument("--to-offset", type=offset_int, metavar="B",
                    help="offset to stop at (exclusive)")
    bf.add_argument("--from-time", metavar="ISO8601",
                    help="read from the first record at or after this time")
    bf.add_argument("--to-time", metavar="ISO8601",
                    help="stop before the first record at or after this time (exclusive)")
    bf.add_argument("--reprocess", action="store_true",
                    help="replace what the range held: rewrite its rows and dead letters and "
                         "remove those this run no longer produces (default: keep existing "
                         "rows, add missing)")
    bf.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    bf.set_defaults(handler=cmd_backfill)

    lag = add("lag", "Show how far the stored offsets are behind what Kafka holds, per "
              "partition and per topic.")
    lag.description, lag.epilog = LAG_HELP, _epilog(LAG_EXAMPLES)
    lag.add_argument("--json", action="store_true", help="print the lag as JSON on stdout")
    lag.set_defaults(handler=cmd_lag)

    off = add("offsets", "Show, set or reset the stored next offsets (the source of truth).")
    off.description, off.epilog = OFFSETS_HELP, _epilog(SET_EXAMPLES)
    off_sub = off.add_subparsers(dest="offsets_command", required=True, metavar="ACTION")

    def add_action(name: str, help_text: str, description: str) -> argparse.ArgumentParser:
        p = off_sub.add_parser(name, help=help_text, description=description,
                               epilog=_epilog(SET_EXAMPLES if name != "show" else ""),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        # Accepted after the action too; SUPPRESS keeps a --config given before it.
        p.add_argument("--config", default=argparse.SUPPRESS,
                       help="TOML config (as for every command)")
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        return p

    show = add_action("show", "print the stored next offsets",
                      "Print the stored next offset per partition, when it last moved and "
                      "by which run. Reads Postgres only.")
    show.set_defaults(handler=cmd_offsets_show)
    for name, required in (("set", True), ("reset", False)):
        p = add_action(name, "move stored offsets" if name == "set" else
                       "move stored offsets (--to defaults to kafka.starting_offsets)", SET_HELP)
        p.add_argument("--topic", required=True, help="a topic of this pipeline's kafka.topics")
        p.add_argument("--partition", type=partition_int, action="append", metavar="P",
                       help="partition to move (repeat for several; default: all partitions)")
        p.add_argument("--to", required=required, metavar="TARGET",
                       help="earliest | latest | an offset | an ISO 8601 time (UTC if no zone)"
                       + ("" if required else "; default kafka.starting_offsets"))
        p.add_argument("--yes", action="store_true",
                       help="do not ask for confirmation (needed without a terminal)")
        p.set_defaults(handler=cmd_offsets_set)

    runs = add("runs", "Show the run history (newest first), with filters.")
    runs.description, runs.epilog = RUNS_HELP, _epilog(RUNS_EXAMPLES)
    runs.add_argument("--last", type=positive_int, default=20, metavar="N",
                      help="show at most N runs (default 20)")
    runs.add_argument("--status", choices=RUN_STATUSES, help="only runs with this status")
    runs.add_argument("--kind", choices=RUN_KINDS, help="only runs of this kind")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON on stdout")
    runs.set_defaults(handler=cmd_runs)
