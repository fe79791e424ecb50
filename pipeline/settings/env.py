"""PIPELINE__<TABLE>__<KEY> environment variables, overlaid on a pipeline's TOML document
before it is validated, so that a value from the environment meets the same checks (and
the same one-line errors) as one written in the file:

    PIPELINE__KAFKA__BOOTSTRAP_SERVERS=broker:9092  ->  [kafka] bootstrap_servers = "broker:9092"
    PIPELINE__KAFKA__TIMEOUT_SECONDS=30             ->  [kafka] timeout_seconds = 30
    PIPELINE__DATABASE__URL=postgresql://...        ->  [database] url = "postgresql://..."

Names are case-insensitive per segment; more ``__`` reach nested tables. A key that holds a
number, boolean, list or table is read as a TOML value (``30``, ``true``, ``["a", "b"]``);
every other value is the text as given, never reinterpreted (a numeric password stays text).

The generic names older releases read (``KAFKA_BOOTSTRAP_SERVERS``, ``PIPELINE_DATABASE_URL``)
are handled by legacy(): see docs/operations.md "Environment overrides".
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from pipeline.errors import ConfigError
from pipeline.settings.document import TABLES, keys

PREFIX = "PIPELINE__"


def _text(annotation: Any) -> bool:
    """Whether a key's values are text: a string, a secret, a choice of words."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _text(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return all(_text(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin is typing.Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    return annotation in (str, SecretStr)


# The keys whose values are not text (numbers, lists, tables: as the table models say), read
# as TOML values.
TYPED = frozenset(f"{table}.{key}" for table, model in TABLES.items()
                  for key, info in keys(model).items() if not _text(info.annotation))


@dataclass(frozen=True)
class Override:
    variable: str  # PIPELINE__KAFKA__TIMEOUT_SECONDS
    path: tuple[str, ...]  # ("kafka", "timeout_seconds")
    value: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)


def overrides(env: dict[str, str]) -> list[Override]:
    """The PIPELINE__ variables in ``env``, in name order (deterministic overlay)."""
    found = []
    for variable in sorted(env):
        if not variable.upper().startswith(PREFIX):
            continue
        segments = variable[len(PREFIX):].split("__")
        if len(segments) < 2 or not all(segments):
            raise ConfigError(f"environment variable {variable}: write "
                              "PIPELINE__<TABLE>__<KEY> (e.g. PIPELINE__KAFKA__BOOTSTRAP_SERVERS)"
                              ", or unset it")
        path = tuple(s.lower() for s in segments)
        found.append(Override(variable, path, _value(".".join(path), env[variable])))
    return found


def _value(key: str, text: str) -> Any:
    if key not in TYPED or "\n" in text or "\r" in text:
        return text  # one line only: a newline could smuggle in other TOML keys
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # then "must be a number, got str ..."


def apply(doc: dict[str, Any], found: list[Override]) -> dict[str, Any]:
    """``doc`` with each override set (a new document; ``doc`` is not changed)."""
    out = dict(doc)
    for o in found:
        table = out
        for depth, segment in enumerate(o.path[:-1], start=1):
            child = table.get(segment, {})
            if not isinstance(child, dict):
                where = ".".join(o.path[:depth])
                raise ConfigError(f"environment variable {o.variable}: '{where}' is not a "
                                  f"table, so it has no key '{o.path[depth]}'; unset it")
            table[segment] = child = dict(child)  # copy on the way down
            table = child
        table[o.path[-1]] = o.value
    return out


def replaced(doc: dict[str, Any], found: list[Override]) -> list[Override]:
    """The overrides that replace a value the file holds (another one): worth a log line,
    since a variable exported for one pipeline silently redirects every other."""
    out = []
    for o in found:
        table: Any = doc
        for segment in o.path:
            table = table.get(segment) if isinstance(table, dict) else None
        if table is not None and table != o.value:
            out.append(o)
    return out


def blame(error: ConfigError, found: list[Override]) -> ConfigError:
    """``error`` naming the variable its key came from, if an override set that key."""
    text = str(error)
    for o in found:
        keys = (o.key, f"config.{o.path[0]}")  # an unknown table: "unknown key 'config.x'"
        if any(re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", text) for k in keys):
            return ConfigError(f"{text} (set by environment variable {o.variable})")
    return error


# ---- the generic names of older releases -----------------------------------------------------

OLD_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS"
OLD_DATABASE_URL = "PIPELINE_DATABASE_URL"


def legacy(doc: dict[str, Any], env: dict[str, str], found: list[Override],
           source: str) -> tuple[list[Override], list[str]]:
    """What the old names still do, and the one-line warnings to print.

    PIPELINE_DATABASE_URL is ours (nobody else sets it) and deployments pass credentials in
    it: still read for the 0.1 line, with a warning naming PIPELINE__DATABASE__URL.
    KAFKA_BOOTSTRAP_SERVERS is a name Kafka images and tools set for themselves: reading it
    sent every pipeline to whatever broker that was, so it is not read at all; where it
    would have changed the broker, a warning says so and names the new variable.
    """
    set_keys = {o.key for o in found}
    kafka, database = (t if isinstance(t, dict) else {}
                       for t in (doc.get("kafka", {}), doc.get("database", {})))
    extra, warnings = [], []

    old_url = env.get(OLD_DATABASE_URL)
    if old_url:
        if "database.url" in set_keys:
            if old_url != database.get("url"):
                warnings.append(f"warning: {OLD_DATABASE_URL} is ignored: "
                                "PIPELINE__DATABASE__URL is set; unset the old name")
        else:
            extra.append(Override(OLD_DATABASE_URL, ("database", "url"), old_url))
            if old_url != database.get("url"):  # never print it: it may hold a password
                warnings.append(f"warning: {OLD_DATABASE_URL} is deprecated (read until "
                                "0.2, which ignores it): rename it to PIPELINE__DATABASE__URL")

    old_servers = env.get(OLD_BOOTSTRAP)
    servers = kafka.get("bootstrap_servers")
    if old_servers and "kafka.bootstrap_servers" not in set_keys and old_servers != servers:
        warnings.append(f"warning: {OLD_BOOTSTRAP}={old_servers} is not read (it overrode "
                        f"every pipeline); using kafka.bootstrap_servers = {servers!r} from "
                        f"{source}; to override it, set PIPELINE__KAFKA__BOOTSTRAP_SERVERS")
    return extra, warnings
