"""What every command's arguments share: the parser that reports a bad argument in one line,
the one integer type, ISO 8601 times, and the one way a command's parser is added."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import NoReturn

from pipeline.errors import EXIT_CODES, EXIT_CONFIG, ConfigError

DEFAULT_CONFIG = os.environ.get("PIPELINE_CONFIG", "conf/local.toml")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EXIT_TABLE = "exit codes:\n" + "\n".join(
    f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())


class CommandParser(argparse.ArgumentParser):
    """argparse, except that a bad argument is one line naming the command and the fix:
    ``error: pipeline runs: --last must be a positive integer (got 0)``, exit 2, as every
    other failure of the CLI is one ``error:`` line. Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {explain(message, self)}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # argparse reports unknown arguments from the top parser, as "pipeline"; name the
        # command they were given to instead (each command's parser sets its own prog).
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = getattr(parsed, "parser", self)
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def explain(message: str, parser: argparse.ArgumentParser) -> str:
    """argparse's message, reworded to say what to write instead."""
    see = f"see '{parser.prog} --help'"
    if m := re.fullmatch(r"argument (\S+): (.*)", message, re.S):
        name, what = m.groups()
        if choice := re.fullmatch(r"invalid choice: (.*?) \(choose from (.*)\)", what, re.S):
            got, choices = choice[1], choice[2].replace("'", "")
            if name.isupper():  # COMMAND or ACTION: the subcommand itself
                return f"unknown {name.lower()} {got}; choose one of {choices} ({see})"
            return f"{name} must be one of {choices} (got {got})"
        if what == "expected one argument":
            return f"{name} needs a value ({see})"
        if m := re.fullmatch(r"ignored explicit argument (.*)", what):
            return f"{name} takes no value (got {m[1]})"
        return f"{name} {what}"  # our types say "must be ... (got ...)"
    if m := re.fullmatch(r"the following arguments are required: (.*)", message, re.S):
        missing = m[1]
        if missing.isupper():
            return (f"no {missing.lower()} given; choose one of "
                    f"{', '.join(subcommands(parser))} ({see})")
        verb = "are" if ", " in missing else "is"
        return f"{' and '.join(missing.rsplit(', ', 1))} {verb} required ({see})"
    if m := re.fullmatch(r"unrecognized arguments: (.*)", message, re.S):
        return f"unknown argument{'s' if ' ' in m[1] else ''} {m[1]} ({see})"
    return f"{message} ({see})"


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions  # argparse keeps them nowhere public
            if isinstance(action, argparse._SubParsersAction) for name in action.choices]


def integer(what: str, minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``; otherwise argparse reports
    '<flag> must be <what> (got <text>)'."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} (got {text!r})") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be {what} (got {n})")
        return n

    return parse


POSITIVE = integer("a positive integer", 1)
OFFSET = integer("an offset, a whole number >= 0", 0)
PARTITION = integer("a partition number, a whole number >= 0", 0)


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


def epilog(examples: str) -> str:
    """--help ends with examples, then what each exit code means."""
    return f"{examples}\n{EXIT_TABLE}" if examples else EXIT_TABLE


def add_command(sub, name: str, summary: str, description: str | None = None,
                examples: str = "", *, config_default: str = DEFAULT_CONFIG) -> CommandParser:
    """A command's parser, with --config and its --help text. ``config_default``
    SUPPRESS: a nested action accepts --config too, without hiding one given before it."""
    parser = sub.add_parser(name, help=summary, description=description or summary,
                            epilog=epilog(examples),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config", default=config_default,
        help=f"TOML config (default {DEFAULT_CONFIG}; env PIPELINE_CONFIG)"
        if config_default == DEFAULT_CONFIG else "TOML config (as for every command)")
    parser.set_defaults(parser=parser)  # the innermost command's parser names the errors
    return parser


def add_range_filters(parser: argparse.ArgumentParser, what: str) -> None:
    """--topic, --partition, --from, --to (a window of offsets) and --json: the same
    filters wherever a command looks at published records (verify, dead-letters).
    ``what``: what --json prints ("report", "result")."""
    parser.add_argument("--topic", help="only this topic")
    parser.add_argument("--partition", type=PARTITION, help="only this partition")
    parser.add_argument("--from", dest="from_offset", type=OFFSET, metavar="OFFSET",
                        help="only offsets >= OFFSET")
    parser.add_argument("--to", dest="to_offset", type=OFFSET, metavar="OFFSET",
                        help="only offsets < OFFSET (exclusive)")
    parser.add_argument("--json", action="store_true",
                        help=f"print the {what} as JSON on stdout")
