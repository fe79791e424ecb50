"""``pipeline lag``: how far the stored offsets are behind what Kafka holds, per partition
and per topic. The arithmetic is pure (``compute_lag``, ``lag_totals``); read-only."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime

from pipeline.commands.args import add_command
from pipeline.commands.output import fmt, print_json, render_table
from pipeline.config import Settings
from pipeline.errors import EXIT_OK
from pipeline.plan.offsets import PartitionOffsets, TopicPartition


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


def cmd_lag(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.sinks import for_settings
    from pipeline.store import Store

    with Store(settings) as store:
        store.schema.check([for_settings(settings)])
        rows_db = store.offsets.rows()
        success = store.runs.last_success()
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
        print_json({
            "pipeline": settings.name, "isolation_level": settings.kafka.isolation_level,
            "last_success": success, "partitions": [asdict(r) for r in rows],
            "topics": totals, "total_lag": sum(t["lag"] for t in totals.values()),
        })
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


def register(sub) -> None:
    lag = add_command(sub, "lag", "Show how far the stored offsets are behind what Kafka "
                      "holds, per partition and per topic.", LAG_HELP, LAG_EXAMPLES)
    lag.add_argument("--json", action="store_true", help="print the lag as JSON on stdout")
    lag.set_defaults(handler=cmd_lag)
