"""``pipeline dead-letters list|replay``: what the dead-letter table holds, and re-decoding
chosen dead letters with the current ``[sink]`` in one transaction (driver/replay.py)."""

from __future__ import annotations

import argparse
import sys

from pipeline.commands.args import POSITIVE, add_command, add_range_filters
from pipeline.commands.output import print_json, render_table
from pipeline.config import Settings
from pipeline.errors import EXIT_OK, ConfigError

NEWEST = 20  # rows `list` shows without --last


def selection(args: argparse.Namespace, last: bool = True):
    from pipeline.store.dead_letters import DeadLetterFilter

    if args.from_offset is not None and args.to_offset is not None \
            and args.to_offset <= args.from_offset:
        raise ConfigError(f"--to ({args.to_offset}) must be greater than --from "
                          f"({args.from_offset}): the range is [from, to)")
    return DeadLetterFilter(args.error_type, args.topic, args.partition, args.from_offset,
                            args.to_offset, args.last if last else None)


def counts_table(counts: list[dict]) -> str:
    return render_table(["error_type", "count", "partitions", "first_failed_at",
                         "last_failed_at"],
                        [[c["error_type"], c["count"], c["partitions"], c["first_failed_at"],
                          c["last_failed_at"]] for c in counts])


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks import for_tables
    from pipeline.store import Store

    f = selection(args, last=False)
    with Store(settings) as store:
        store.schema.check(for_tables(settings, settings.kafka.topics))
        counts = store.dead_letters.counts(f)
        newest = store.dead_letters.newest(f, args.last or NEWEST)
    if args.json:
        print_json({"pipeline": settings.name, "filters": f.as_dict(), "by_type": counts,
                    "total": sum(c["count"] for c in counts), "newest": newest})
        return EXIT_OK
    if not counts:
        print(f"no dead letters of pipeline '{settings.name}' match")
        return EXIT_OK
    print(counts_table(counts))
    print(f"\ntotal: {sum(c['count'] for c in counts)}; the newest {len(newest)}:")
    print(render_table(
        ["topic", "partition", "offset", "error_type", "failed_at", "run_id", "bytes",
         "error_message"],
        [[d["topic"], d["partition"], d["offset"], d["error_type"], d["failed_at"],
          d["run_id"], d["value_bytes"], d["error_message"][:100]] for d in newest]))
    return EXIT_OK


def replay_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    """A pipeline of several tables replays one topic's dead letters at a time: re-decoded
    with its route, written to its table (--topic); a pipeline of one table, any."""
    from pipeline.commands.partitions import require_topic
    from pipeline.driver.routing import table_scopes

    if settings.routes.one_table is not None:
        return settings
    if args.topic is None:
        raise ConfigError(
            f"dead-letters replay: pipeline '{settings.name}' writes a table per topic; give "
            "--topic: that topic's dead letters are re-decoded with its route and written to "
            "its table ('pipeline dead-letters list' counts them per topic)")
    require_topic(settings, args.topic)
    (scope,) = table_scopes(settings, [args.topic], topic=args.topic)
    return scope.settings


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.commands.offsets import confirm
    from pipeline.driver.replay import run_replay
    from pipeline.driver.replay_records import refusal
    from pipeline.sinks import for_settings
    from pipeline.store import Store

    settings = replay_settings(args, settings)
    if why := refusal(settings):
        raise ConfigError(why)
    f = selection(args)
    out = sys.stderr if args.json else sys.stdout
    if not (args.dry_run or args.yes):
        with Store(settings) as store:
            store.schema.check([for_settings(settings)])
            counts = store.dead_letters.counts(f)
        if not counts:
            print(f"no dead letters of pipeline '{settings.name}' match: nothing to replay",
                  file=out)
            return EXIT_OK
        print(counts_table(counts), file=out)
        if not confirm(f"replay {sum(c['count'] for c in counts)} dead letters of pipeline "
                       f"'{settings.name}' into {settings.sink.table}?", args.yes,
                       refusing="replay dead letters"):
            print("cancelled: nothing changed", file=out)
            return EXIT_OK
    report = run_replay(settings, f, dry_run=args.dry_run)
    if args.json:
        print_json(report.as_dict())
        return EXIT_OK
    if report.per_partition:
        print(render_table(["partition", "replayed", "still_failing"],
                           [[p, v["replayed"], v["still_failing"]]
                            for p, v in sorted(report.per_partition.items())]))
    prefix = "dry run (nothing changed, nothing locked): would have " if report.dry_run else ""
    if report.columns_added:
        print(f"{'dry run: would add' if report.dry_run else 'added'} column(s) "
              f"{', '.join(report.columns_added)} to {settings.sink.table} (sink.evolve)")
    print(f"{prefix}replayed {report.replayed} of {report.chosen} dead letters into "
          f"{report.rows_written} rows of {settings.sink.table}"
          + (f" ({report.rows_deleted} deleted)" if report.rows_deleted else "")
          + f"; {report.still_failing} still failing"
          + (f" ({', '.join(f'{t}: {n}' for t, n in report.still_failing_by_type.items())};"
             f" {report.reasons_changed} with a new reason)" if report.still_failing else "")
          + ("" if report.run_id is None else f"; run {report.run_id}"))
    return EXIT_OK


HELP = """\
The dead-letter table (pipeline_dead_letters) holds every record that could not become a
result row, with its bytes, headers, timestamp and the reason. 'list' counts them by
error type and shows the newest; 'replay' re-decodes chosen ones with the current [sink]
(after a column type was fixed, say) and, in one transaction, writes the rows that now
succeed through the sink (append, upsert, aggregate), moves their dead letters to
pipeline_dead_letters_replayed, keeps the ones that still fail with their new reason, and
records a run of kind 'replay'. Exactly once: a second replay changes nothing; a crash
leaves all or nothing. Refused (exit 2) for a [sink] transform."""

LIST_HELP = ("Count the dead letters by error type and show the newest (--last N, default "
             f"{NEWEST}). Read-only.")

REPLAY_HELP = """\
Re-decode the chosen dead letters with the current [sink] and write what now succeeds, in
one transaction under the pipeline's ingest and backfill locks (a running ingest or
backfill makes it exit 75, and the other way round). The counts are shown and must be
confirmed on a terminal (--yes skips the question; without a terminal --yes is required).
--dry-run reports exactly what would happen and changes nothing: it takes no lock, adds no
column, and merges into private copies of the rows it would meet. Refused for a [sink]
transform: its rows come from Spark SQL and the user's function, not the record format's
encoder."""

EXAMPLES = """\
examples:
  pipeline dead-letters list --config conf/local.toml
  pipeline dead-letters list --config conf/local.toml --type wrong_type --last 5 --json
  pipeline dead-letters replay --config conf/local.toml --type wrong_type --dry-run
  pipeline dead-letters replay --config conf/local.toml --topic orders --partition 2 \\
      --from 1000 --to 2000 --yes
"""


def register(sub) -> None:
    dl = add_command(sub, "dead-letters", "List dead letters, or replay them with the "
                     "current config (one transaction, exactly once).", HELP, EXAMPLES)
    actions = dl.add_subparsers(dest="dead_letters_command", required=True, metavar="ACTION")

    def add_action(name: str, summary: str, description: str):
        p = add_command(actions, name, summary, description, EXAMPLES,
                        config_default=argparse.SUPPRESS)
        p.add_argument("--type", dest="error_type", metavar="ERROR_TYPE",
                       help="only dead letters of this error_type (e.g. wrong_type)")
        add_range_filters(p, "result")
        return p

    lst = add_action("list", "count dead letters by type, show the newest", LIST_HELP)
    lst.add_argument("--last", type=POSITIVE, metavar="N",
                     help=f"show the N newest (default {NEWEST})")
    lst.set_defaults(handler=cmd_list)
    rp = add_action("replay", "re-decode dead letters with the current config, in one "
                    "transaction", REPLAY_HELP)
    rp.add_argument("--last", type=POSITIVE, metavar="N",
                    help="only the N newest of the chosen dead letters")
    rp.add_argument("--dry-run", action="store_true",
                    help="report what would happen; change nothing, lock nothing")
    rp.add_argument("--yes", action="store_true",
                    help="do not ask for confirmation (needed without a terminal)")
    rp.set_defaults(handler=cmd_replay)
