"""``pipeline run`` (the scheduled ingest) and ``pipeline init-db``; the run summary that
``backfill`` prints too."""

from __future__ import annotations

import argparse
import sys

from pipeline.commands.args import add_command
from pipeline.commands.output import (
    add_summary_file,
    print_json,
    render_table,
    write_summary,
)
from pipeline.errors import EXIT_OK

RUN_HELP = ("Read every partition from its stored next offset up to the latest (or last "
            "stable) offset and publish results + offsets in one transaction.")

RUN_EXAMPLES = """\
examples:
  pipeline run --config conf/local.toml --dry-run     # print the plan, change nothing
  pipeline run --config conf/local.toml --json        # one JSON summary on stdout
  spark-submit pipeline/submit.py run --config conf/local.toml --summary-file run.json
"""

INIT_DB_HELP = ("Create the pipeline's tables (idempotent: applies sql/*.sql in order, then "
                "the results table).")

INIT_DB_EXAMPLES = """\
examples:
  pipeline init-db --config conf/local.toml
"""


def cmd_run(args: argparse.Namespace, settings) -> int:
    from pipeline.driver.job import run_ingest
    from pipeline.driver.signals import StopSignals

    with StopSignals() as signals:
        result = run_ingest(settings, dry_run=args.dry_run, signals=signals)
    if args.json:
        print_json(result.as_dict())
    elif args.dry_run:
        print_plan(result)
    else:
        print_summary(result)
    if args.summary_file:
        write_summary(result.as_dict(), args.summary_file)
    return EXIT_OK


def cmd_init_db(args: argparse.Namespace, settings) -> int:
    from pipeline.driver.schema_probe import held_columns
    from pipeline.sinks import for_tables
    from pipeline.store import Store

    with Store(settings) as store:
        # sink.columns = "schema": the table's columns from the topics' writer schema.
        settings = held_columns(settings, store)
        # Every table of kafka.topics; a pattern's topics are found by each run, which
        # makes the table of a topic new to it.
        for name in store.schema.init_db(for_tables(settings, settings.kafka.topics)):
            print(f"applied {name}")
    if settings.kafka.topic_pattern is not None:
        print("the tables of the topics kafka.topic_pattern matches are made by the run that "
              "first reads each topic")
    return EXIT_OK


def print_plan(result, out=None) -> None:
    """A dry run: per partition the stored offset and the range a run would read."""
    out = out or sys.stdout
    print(render_table(["topic", "partition", "stored", "from", "until", "offsets"],
                       [[p["topic"], p["partition"], p["stored"], p["from"], p["until"],
                         p["offsets"]] for p in result.plan]), file=out)
    total = sum(p["offsets"] for p in result.plan)
    print(f"{len(result.plan)} partitions, {total} offsets to read", file=out)
    for lost in result.lost:
        print(f"LOST (skipped): {lost['topic']}[{lost['partition']}] "
              f"[{lost['from']}, {lost['until']})", file=out)


def print_summary(result, out=None) -> None:
    """What a run (an ingest or a backfill) did, in a line and one per partition."""
    out = out or sys.stdout
    if result.status == "noop":
        print(f"run {result.run_id}: nothing new to read", file=out)
        return
    deleted = f"{result.rows_deleted} deleted, " if result.rows_deleted else ""
    print(f"run {result.run_id} ({result.kind}) {result.status}: {result.records_read} records, "
          f"{result.rows_written} rows written, {deleted}{result.dead_letters} dead letters, "
          f"{result.timings.get('total', 0):.1f} s", file=out)
    tables = getattr(result, "tables", {}) or {}
    table_of = {topic: name for name, t in tables.items() for topic in t.get("topics", ())
                if len(tables) > 1}
    for name, t in tables.items() if len(tables) > 1 else ():
        deleted = f", {t['rows_deleted']} deleted" if t.get("rows_deleted") else ""
        print(f"  table {name} ({t['mode']}): {t.get('rows_written', 0)} rows written"
              f"{deleted}, {t.get('dead_letters', 0)} dead letters from "
              f"{', '.join(t['topics'])}", file=out)
    for tp, counts in result.per_partition.items():
        tombstones = f", {counts['deletes']} tombstones" if counts.get("deletes") else ""
        filtered = (f", {counts['filtered']} filtered out by the transform"
                    if counts.get("filtered") else "")
        into = table_of.get(tp.rsplit("[", 1)[0])
        print(f"  {tp}{f' -> {into}' if into else ''}: {counts['rows']} rows{tombstones}, "
              f"{counts['dead']} dead letters{filtered}", file=out)


def register(sub) -> None:
    run = add_command(sub, "run", RUN_HELP, examples=RUN_EXAMPLES)
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan (partition, stored, from, until) and change nothing")
    run.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    add_summary_file(run)
    run.set_defaults(handler=cmd_run)
    init = add_command(sub, "init-db", INIT_DB_HELP, examples=INIT_DB_EXAMPLES)
    init.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    init.set_defaults(handler=cmd_init_db)
