"""The verdicts of ``pipeline verify``, per partition and overall: a check says "match" only
when it compared everything in its scope (design invariant 9). What it could not compare
(records Kafka no longer holds) is "incomplete", unless the user left it out of the scope
(``--skip-lost``); any difference found is a "mismatch", whatever else could not be
compared. Pure; the command maps them to exit codes 0, 4 and 3."""

from __future__ import annotations

from collections.abc import Iterable

MATCH, INCOMPLETE, MISMATCH = "match", "incomplete", "mismatch"
_RANK = {MATCH: 0, INCOMPLETE: 1, MISMATCH: 2}


def verdict(differs: bool, not_compared: bool, skip_lost: bool = False) -> str:
    """``not_compared``: something in the scope could not be compared; ``skip_lost``: the
    user left what Kafka no longer holds out of the scope."""
    if differs:
        return MISMATCH
    return INCOMPLETE if not_compared and not skip_lost else MATCH


def worst(verdicts: Iterable[str]) -> str:
    """The overall verdict of several (no verdict at all: nothing to compare, a match)."""
    return max(verdicts, key=_RANK.__getitem__, default=MATCH)
