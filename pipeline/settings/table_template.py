"""[sink] table as a template of a topic's name: ``{topic}``, and for Debezium's
``<prefix>.<schema>.<table>`` topics ``{prefix}``, ``{schema}``, ``{table}``; checked when
the config is read, resolved per topic by its route (settings/routes.py). Pure."""

from __future__ import annotations

import re

from pipeline.errors import ConfigError
from pipeline.settings.base import IDENTIFIER, about_key

PLACEHOLDERS = ("topic", "prefix", "schema", "table")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_LITERAL = re.compile(r"^[a-z0-9_]*$")
_SAFE = ("a safe SQL identifier: lowercase letters, digits and _ (at most 48 characters, "
         "not starting with a digit)")


def placeholders(template: str) -> list[str]:
    return _PLACEHOLDER.findall(template)


def check_template(value: str) -> str:
    """[sink] table: a safe identifier, or a template of one (its literal parts safe, its
    placeholders known)."""
    names = placeholders(value)
    if not names:
        if not IDENTIFIER.match(value):
            raise about_key(f"= {value!r} is not {_SAFE}, nor a template of one ({{topic}}, "
                            "{prefix}, {schema}, {table})")
        return value
    unknown = [n for n in names if n not in PLACEHOLDERS]
    if unknown:
        raise about_key(f"= {value!r}: {{{unknown[0]}}} is no placeholder of a table "
                        "template; use {topic}, or for topics named <prefix>.<schema>.<table> "
                        "{prefix}, {schema}, {table}")
    if not all(_LITERAL.match(part) for part in _PLACEHOLDER.split(value)[::2]):
        raise about_key(f"= {value!r}: the text around a template's placeholders must be "
                        "lowercase letters, digits and _")
    return value


def name_parts(topic: str) -> dict[str, str]:
    """{prefix}, {schema}, {table} of a Debezium topic name ``<prefix>.<schema>.<table>``
    (a prefix may hold dots itself); none for a topic of fewer than three parts."""
    parts = topic.split(".")
    if len(parts) < 3:
        return {}
    return {"prefix": ".".join(parts[:-2]), "schema": parts[-2], "table": parts[-1]}


def resolve_table(template: str, topic: str) -> str:
    """The table ``template`` names for ``topic``; a ConfigError (exit 2) naming both when
    it names none, or no safe identifier."""
    names = placeholders(template)
    if not names:
        return template
    values = {"topic": topic, **name_parts(topic)}
    fix = (f"give the topic a table of its own ([sink.topics.\"{topic}\"] table = \"...\") "
           "or change [sink] table")
    if missing := [n for n in names if n not in values]:
        raise ConfigError(
            f"topic '{topic}' is not named <prefix>.<schema>.<table>: the table template "
            f"[sink] table = {template!r} has no {{{missing[0]}}} for it; {fix}")
    name = _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
    if not IDENTIFIER.match(name):
        raise ConfigError(
            f"topic '{topic}': the table template [sink] table = {template!r} makes "
            f"{name!r}, which is not {_SAFE}; {fix}")
    return name
