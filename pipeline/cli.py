"""Command line: thin wiring of arguments to pipeline.job and pipeline.ops."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from pipeline.config import MASK_LOGS, load_settings, mask
from pipeline.errors import EXIT_CODES, EXIT_INTERNAL, EXIT_OK, PipelineError

log = logging.getLogger("pipeline")

DEFAULT_CONFIG = os.environ.get("PIPELINE_CONFIG", "conf/local.toml")

EPILOG = "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())
EPILOG += """

examples:
  pipeline init-db --config conf/local.toml
  pipeline run --config conf/local.toml --dry-run     # print the plan, change nothing
  pipeline run --config conf/local.toml --json        # one JSON summary on stdout
  spark-submit --jars "$(ls .jars/spark/*.jar | paste -sd,)" \\
      pipeline/submit.py run --config conf/local.toml
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipeline",
        description="Ingest explicit Kafka offset ranges with Spark into Postgres; results "
        "and offsets commit in one transaction, so reruns never lose or duplicate a record.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--config", default=DEFAULT_CONFIG,
                       help=f"TOML config (default {DEFAULT_CONFIG}; env PIPELINE_CONFIG)")
        return p

    run = add("run", "Read every partition from its stored next offset up to the latest "
              "(or last stable) offset and publish results + offsets in one transaction.")
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan (partition, stored, from, until) and change nothing")
    run.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    init = add("init-db", "Create the pipeline's tables (idempotent: applies sql/*.sql in "
               "order, then the results table).")
    init.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    from pipeline import ops, unlock

    ops.add_commands(sub, add)
    unlock.add_command(add)
    return parser


def print_plan(result, out=None) -> None:
    out = out or sys.stdout
    rows = [("topic", "partition", "stored", "from", "until", "offsets")]
    for p in result.plan:
        rows.append((p["topic"], str(p["partition"]),
                     "-" if p.get("stored") is None else str(p["stored"]),
                     str(p["from"]), str(p["until"]), str(p["offsets"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths, strict=True))), file=out)
    total = sum(p["offsets"] for p in result.plan)
    print(f"{len(result.plan)} partitions, {total} offsets to read", file=out)
    for lost in result.lost:
        print(f"LOST (skipped): {lost['topic']}[{lost['partition']}] "
              f"[{lost['from']}, {lost['until']})", file=out)


def print_summary(result, out=None) -> None:
    out = out or sys.stdout
    if result.status == "noop":
        print(f"run {result.run_id}: nothing new to read", file=out)
        return
    print(f"run {result.run_id} ({result.kind}) {result.status}: {result.records_read} records, "
          f"{result.rows_written} rows written, {result.dead_letters} dead letters, "
          f"{result.timings.get('total', 0):.1f} s", file=out)
    for tp, counts in result.per_partition.items():
        print(f"  {tp}: {counts['rows']} rows, {counts['dead']} dead letters", file=out)


def cmd_run(args, settings) -> int:
    from pipeline.job import StopSignals, run_ingest

    with StopSignals() as signals:
        result = run_ingest(settings, dry_run=args.dry_run, signals=signals)
    if args.json:
        print(json.dumps(result.as_dict(), default=str))
    elif args.dry_run:
        print_plan(result)
    else:
        print_summary(result)
    return EXIT_OK


def cmd_init_db(args, settings) -> int:
    from pipeline.store import Store

    store = Store(settings)
    try:
        for name in store.init_db():
            print(f"applied {name}")
    finally:
        store.close()
    return EXIT_OK


COMMANDS = {"run": cmd_run, "init-db": cmd_init_db}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger().handlers[0].addFilter(MASK_LOGS)
    try:
        settings = load_settings(args.config)
        handler = COMMANDS.get(args.command) or args.handler
        return handler(args, settings)
    except PipelineError as e:
        print(f"error: {mask(e.message)}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - the last line of defence prints one line
        log.debug("internal error", exc_info=True)
        first = mask(str(e).strip().splitlines()[0] if str(e).strip() else "")
        print(f"error: internal error ({type(e).__name__}: {first[:500]}); nothing committed; "
              "rerun with -v for the traceback and report it", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
