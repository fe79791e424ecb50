"""Where each topic's records go: a route per topic, a SinkSettings with its table resolved.

[sink] holds every route's defaults; its ``table`` may be a template of the topic's name
(``{topic}``, and for Debezium's ``<prefix>.<schema>.<table>`` names ``{prefix}``,
``{schema}``, ``{table}``), and [sink.topics."<topic>"] sets a topic's own route keys
(sink.ROUTE_KEYS), checked by the same model and rules as [sink]. A table without a
placeholder takes every topic (one table, as a pipeline always had). Topics whose routes
resolve to one table must agree on every key: a table has one set of columns, one key and
one mode. Pure: no I/O; the topics of a pattern are the driver's to find (driver/routing.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from pipeline.errors import ConfigError
from pipeline.settings.sink import SinkSettings, SinkTable
from pipeline.settings.sink_modes import MODE_KEYS
from pipeline.settings.table_template import placeholders, resolve_table


@dataclass(frozen=True)
class TableRoute:
    """One table of a pipeline: the route every one of its ``topics`` takes."""

    table: str
    sink: SinkSettings
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Routes:
    """Each topic's route: [sink] (``default``, its table a template) and the topics' own
    ([sink.topics."<topic>"], ``overrides``, their tables resolved)."""

    default: SinkSettings
    overrides: tuple[tuple[str, SinkSettings], ...] = ()

    @cached_property
    def _own(self) -> dict[str, SinkSettings]:
        return dict(self.overrides)

    @property
    def templated(self) -> bool:
        return bool(placeholders(self.default.table))

    @property
    def one_table(self) -> str | None:
        """The table every topic goes to, when the config alone says so (no placeholder,
        no topic with a table of its own); else None."""
        if self.templated or any(s.table != self.default.table for _, s in self.overrides):
            return None
        return self.default.table

    def for_topic(self, topic: str) -> SinkSettings:
        """``topic``'s route: its own keys over [sink]'s, its table resolved."""
        if topic in self._own:
            return self._own[topic]
        if not self.templated:
            return self.default
        return _with_table(self.default, resolve_table(self.default.table, topic))

    def tables(self, topics: Iterable[str]) -> tuple[TableRoute, ...]:
        """The tables ``topics`` go to (``group``)."""
        return group({t: self.for_topic(t) for t in topics})

    def check_topics(self, matches, described: str) -> None:
        """Every [sink.topics."<topic>"] names a topic the pipeline reads (``matches``: the
        kafka settings' test; ``described``: the topics as the config names them)."""
        for topic, _ in self.overrides:
            if not matches(topic):
                raise ConfigError(
                    f"[sink.topics.\"{topic}\"]: '{topic}' is not a topic of this pipeline "
                    f"({described}); fix the topic's name or remove the table")


def group(routes: Mapping[str, SinkSettings]) -> tuple[TableRoute, ...]:
    """Topics' ``routes`` by the table they go to, by table name; exit 2 when two topics of
    one table disagree on a key, or a transform would write more than one table."""
    by_table: dict[str, list[tuple[str, SinkSettings]]] = {}
    for topic, route in sorted(routes.items()):
        by_table.setdefault(route.table, []).append((topic, route))
    out = []
    for table, pairs in sorted(by_table.items()):
        (first, sink), *others = pairs
        for topic, other in others:
            _agree(table, first, sink, topic, other)
        out.append(TableRoute(table, sink, tuple(t for t, _ in pairs)))
    transform = next((t.sink.transform for t in out if t.sink.transform), None)
    if transform and len(out) > 1:
        raise ConfigError(
            f"[sink] transform {transform!r} with more than one table ("
            + "; ".join(f"{', '.join(t.topics)} -> {t.table}" for t in out)
            + "): not yet; a transform writes one table - give every topic the same "
            "table, or split the pipeline")
    return tuple(out)


def _with_table(sink: SinkSettings, table: str) -> SinkSettings:
    return replace(sink, table=table)


# What two routes of one table are compared by, the table's shape first.
_COMPARED = ("columns", "mode", "key", "aggregates")


def _agree(table: str, first: str, a: SinkSettings, topic: str, b: SinkSettings) -> None:
    names = [*_COMPARED, *(f.name for f in fields(SinkSettings) if f.name not in _COMPARED)]
    for name in names:
        if getattr(a, name) != getattr(b, name):
            key = "key (or group_by)" if name == "key" else name
            raise ConfigError(
                f"topics '{first}' and '{topic}' both go to table {table}, but their routes "
                f"differ in {key} ({_shown(getattr(a, name))} / {_shown(getattr(b, name))}): "
                "a table has one set of columns, one key and one mode; give one of them a "
                f"table of its own ([sink.topics.\"{topic}\"] table = \"...\") or the same "
                "settings")


def _shown(value: Any) -> str:
    if isinstance(value, tuple) and value and hasattr(value[0], "required"):  # columns
        return "[" + ", ".join(f"{c.name} {c.type}{' not null' if c.required else ''}"
                               for c in value) + "]"
    return repr(value)


def routes_of(sink: SinkTable) -> Routes:
    """The pipeline's routes: [sink]'s value, and each [sink.topics."<topic>"] laid over
    [sink]'s keys as written and checked by the same model (a route that sets another mode
    takes none of [sink]'s keys of the old one: key, tombstones, group_by, aggregates)."""
    default = sink.value()
    base = sink.model_dump(exclude_unset=True, exclude={"topics"})
    overrides = []
    for topic, own in sorted(sink.topics.items()):
        keys = own.model_dump(exclude_unset=True)
        inherited = dict(base)
        if "mode" in keys and keys["mode"] != default.mode:
            for name in MODE_KEYS:
                inherited.pop(name, None)
        route = _route_value(topic, {**inherited, **keys})
        overrides.append((topic, _with_table(route, resolve_table(route.table, topic))))
    return Routes(default, tuple(overrides))


def _route_value(topic: str, keys: Mapping[str, Any]) -> SinkSettings:
    where = f"[sink.topics.\"{topic}\"]"
    try:
        return SinkTable.model_validate(dict(keys)).value()
    except ValidationError as e:
        from pipeline.settings.messages import config_error

        raise ConfigError(f"{where}: {config_error(e, SinkTable).message}") from None
    except ConfigError as e:
        raise ConfigError(f"{where} (the route of topic '{topic}', over [sink]): "
                          f"{e.message}") from None
