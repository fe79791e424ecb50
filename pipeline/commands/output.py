"""What the commands print: aligned tables for people, JSON for machines (on stdout, or in
a summary file a scheduler names). Times are UTC."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("pipeline")


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
    """For json.dumps: datetimes as ISO 8601 UTC, anything else unknown as its text."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value)


def print_json(doc: Any, out=None) -> None:
    """One JSON document on one line (stdout unless ``out``)."""
    print(json.dumps(doc, default=json_default), file=out or sys.stdout)


def summary_file(text: str) -> str:
    """An argparse type: a file to write, in a folder that exists (checked before the run, so
    that a run is never done and then found to have nowhere to report)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not text or not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"must be a file in an existing folder (got {text!r})")
    return text


def add_summary_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--summary-file", type=summary_file, metavar="PATH",
        help="write the JSON summary (the document --json prints) to PATH once the run has "
             "ended, whatever stdout shows: for a scheduler, since under spark-submit stdout "
             "carries Spark's output too (Airflow's operator reads it there)")


def write_summary(doc: Any, path: str) -> None:
    """The summary to its file, whole or not at all (written beside it, then renamed): the
    reader never sees half a document. The run is over when this is called: a file that
    cannot be written is logged, not a failure of the run (its results are committed)."""
    partial = f"{path}.partial"
    try:
        with open(partial, "w") as f:
            json.dump(doc, f, default=json_default)
        os.replace(partial, path)
    except OSError as e:
        log.warning("the run's summary could not be written to %s: %s", path, e.strerror or e)
