"""``pipeline runs``: the run history, newest first, with filters. Read-only."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.commands.args import POSITIVE, add_command
from pipeline.commands.output import print_json, render_table
from pipeline.config import Settings
from pipeline.errors import EXIT_OK

RUN_KINDS = ("ingest", "backfill", "reprocess", "offsets", "replay")
RUN_STATUSES = ("running", "succeeded", "noop", "failed", "abandoned")


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


def duration(run: dict[str, Any]) -> str | None:
    if run["finished_at"] is None or run["started_at"] is None:
        return None
    return f"{(run['finished_at'] - run['started_at']).total_seconds():.1f}"


def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks import for_tables
    from pipeline.store import Store

    with Store(settings) as store:
        store.schema.check(for_tables(settings, settings.kafka.topics))
        runs = store.runs.newest(args.last, args.status, args.kind)
    if args.json:
        print_json({"pipeline": settings.name, "runs": runs})
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


def register(sub) -> None:
    runs = add_command(sub, "runs", "Show the run history (newest first), with filters.",
                       RUNS_HELP, RUNS_EXAMPLES)
    runs.add_argument("--last", type=POSITIVE, default=20, metavar="N",
                      help="show at most N runs (default 20)")
    runs.add_argument("--status", choices=RUN_STATUSES, help="only runs with this status")
    runs.add_argument("--kind", choices=RUN_KINDS, help="only runs of this kind")
    runs.add_argument("--json", action="store_true", help="print the runs as JSON on stdout")
    runs.set_defaults(handler=cmd_runs)
