"""The ``pipeline`` command: build the parser from the command modules, configure logging,
load the settings, dispatch, and turn any failure into one ``error:`` line and an exit code."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pipeline import logs
from pipeline.commands import backfill, dead_letters, lag, offsets, run, runs, unlock, verify
from pipeline.commands.args import CommandParser, epilog
from pipeline.config import MASK_LOGS, load_settings, mask
from pipeline.errors import EXIT_INTERNAL, PipelineError
from pipeline.process_exit import end_hard_at_exit, exit_process, skip_final_collection

log = logging.getLogger("pipeline")

COMMANDS = (run, backfill, lag, offsets, runs, unlock, verify, dead_letters)  # in --help's order

EXAMPLES = """\
examples:
  pipeline init-db --config conf/local.toml
  pipeline run --config conf/local.toml --dry-run     # print the plan, change nothing
  pipeline run --config conf/local.toml --json        # one JSON summary on stdout
  pipeline lag --config conf/local.toml
  pipeline runs --config conf/local.toml --status failed
  spark-submit --jars "$(ls .jars/spark/*.jar | paste -sd,)" \\
      pipeline/submit.py run --config conf/local.toml
  pipeline COMMAND --help                             # each command, with examples
"""


def version() -> str:
    """The installed package's version, and pyspark's (read from package metadata: no
    pyspark import, so --version stays instant)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def of(name: str) -> str:
        try:
            return installed(name)
        except PackageNotFoundError:
            return "not installed"

    return f"pipeline {of('kafka-offset-pipeline')} (pyspark {of('pyspark')})"


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="pipeline",
        description="Ingest explicit Kafka offset ranges with Spark into Postgres; results "
        "and offsets commit in one transaction, so reruns never lose or duplicate a record.",
        epilog=epilog(EXAMPLES), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=version(),
                        help="print the pipeline's version and the pyspark it runs on")
    parser.add_argument("--log-format", choices=logs.FORMATS, default=None,
                        help="logs on stderr as text (default) or one JSON object per line "
                        f"(env {logs.ENV_LOG_FORMAT})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser




def main(argv: Sequence[str] | None = None) -> int:
    skip_final_collection()  # the process's last garbage collection: not worth its wait
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        logs.setup(logs.resolve_format(args.log_format), verbose=args.verbose)
    except PipelineError as e:
        parser.error(e.message)
    for handler in logging.getLogger().handlers:
        handler.addFilter(MASK_LOGS)  # secrets never reach a log line, whatever the format
    try:
        settings = load_settings(args.config)
        return args.handler(args, settings)
    except PipelineError as e:
        print(f"error: {mask(e.message)}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # noqa: BLE001 - the last line of defence prints one line
        log.debug("internal error", exc_info=True)
        first = mask(str(e).strip().splitlines()[0] if str(e).strip() else "")
        print(f"error: internal error ({type(e).__name__}: {first[:500]}); nothing committed; "
              "rerun with -v for the traceback and report it", file=sys.stderr)
        return EXIT_INTERNAL


def run() -> None:
    """The ``pipeline`` command's process: main's exit code, whatever the C libraries do at
    exit (process_exit.end_hard_at_exit)."""
    end_hard_at_exit()
    exit_process(main())


if __name__ == "__main__":
    run()
