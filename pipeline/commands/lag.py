"""``pipeline lag``: how far the stored offsets are behind what Kafka holds, per partition
(with the table its topic goes to), per topic and per table. The arithmetic is pure
(``compute_lag``, ``lag_totals``); read-only."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime

from pipeline.commands.args import add_command
from pipeline.commands.output import fmt, print_json, render_table
from pipeline.config import Settings
from pipeline.errors import EXIT_OK, ConfigError
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
    table: str | None = None  # where the topic's records go (its route); None: not read now


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


def lag_totals(rows: Sequence[PartitionLag], by: str = "topic") -> dict[str, dict[str, int]]:
    """Per topic (or ``by`` = "table", per table): partitions, lag and the largest lag."""
    totals: dict[str, dict[str, int]] = {}
    for r in rows:
        name = getattr(r, by)
        if name is None:
            continue
        t = totals.setdefault(name, {"partitions": 0, "lag": 0, "max_lag": 0})
        t["partitions"] += 1
        t["lag"] += r.lag or 0
        t["max_lag"] = max(t["max_lag"], r.lag or 0)
    return totals


def tables_of(settings: Settings, topics: Sequence[str]) -> dict[str, str]:
    """The table each topic's records go to (its route; settings/routes.py)."""
    return {t: route.table for route in settings.routes.tables(topics) for t in route.topics}


def cmd_lag(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.driver.routing import run_topics
    from pipeline.sinks import for_tables
    from pipeline.store import Store

    meta = KafkaMeta(settings.kafka)
    topics = run_topics(settings, meta)
    table_of = tables_of(settings, topics)
    if args.table and args.table not in table_of.values():
        raise ConfigError(f"--table {args.table}: no topic of pipeline '{settings.name}' goes "
                          f"to it (its tables: {', '.join(sorted(set(table_of.values())))})")
    with Store(settings) as store:
        store.schema.check(for_tables(settings, settings.kafka.topics))
        rows_db = store.offsets.rows()
        success = store.runs.last_success()
    kafka = meta.topic_offsets(topics)
    stored = {(r["topic"], r["partition"]): r["next_offset"] for r in rows_db}
    rows = compute_lag(stored, kafka, topics, settings.kafka.starting_offsets)
    for r in rows:
        r.table = table_of.get(r.topic)
    if args.table:
        rows = [r for r in rows if r.table == args.table]
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
    totals, by_table = lag_totals(rows), lag_totals(rows, "table")
    if args.json:
        print_json({
            "pipeline": settings.name, "isolation_level": settings.kafka.isolation_level,
            "last_success": success, "partitions": [asdict(r) for r in rows],
            "topics": totals, "tables": by_table,
            "total_lag": sum(t["lag"] for t in totals.values()),
        })
        return EXIT_OK
    # The table column for a pipeline of several tables only (one table: as it always was).
    several = len(set(table_of.values())) > 1
    print(render_table(
        ["table"] * several + ["topic", "partition", "stored", "earliest", "latest", "lag",
                               "last_run", "finished_at", "note"],
        [[r.table or "-"] * several + [
            r.topic, r.partition, r.stored, r.earliest, r.latest, r.lag, r.last_run_id,
            r.last_run_finished_at,
            r.note or ("" if r.table else "not read: no longer one of the pipeline's topics")]
         for r in rows]))
    for topic, t in totals.items():
        print(f"{topic}: lag {t['lag']} over {t['partitions']} partitions (max {t['max_lag']})")
    if len(by_table) > 1 or args.table:
        for table, t in by_table.items():
            print(f"table {table}: lag {t['lag']} over {t['partitions']} partitions (max "
                  f"{t['max_lag']})")
    latest = "latest = last stable offset" if settings.kafka.isolation_level == \
        "read_committed" else "latest = high watermark"
    when = (f"last successful ingest: run {success['run_id']} ({success['status']}) finished "
            f"{fmt(success['finished_at'])}" if success else "no successful ingest yet")
    print(f"{when}; {latest}")
    return EXIT_OK


LAG_HELP = """\
Per partition: the table its topic goes to, the stored next offset (Postgres), the earliest
and latest offsets Kafka holds (latest = last stable offset under read_committed), the lag
(latest - stored; for a partition never read, counted from kafka.starting_offsets), and the
run that last moved the offset; then totals per topic (and per table, for a pipeline of
several) and when the last ingest succeeded. --table shows one table's partitions.
Read-only."""

LAG_EXAMPLES = """\
examples:
  pipeline lag --config conf/local.toml
  pipeline lag --config conf/local.toml --json | jq '.total_lag'
  pipeline lag --config conf/examples/tables.toml --table orders
"""


def register(sub) -> None:
    lag = add_command(sub, "lag", "Show how far the stored offsets are behind what Kafka "
                      "holds, per partition and per topic.", LAG_HELP, LAG_EXAMPLES)
    lag.add_argument("--json", action="store_true", help="print the lag as JSON on stdout")
    lag.add_argument("--table", metavar="TABLE",
                     help="only the partitions of the topics that go to this table")
    lag.set_defaults(handler=cmd_lag)
