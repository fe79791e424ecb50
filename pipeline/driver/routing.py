"""A run's topics and where their records go: the topics (the config's list, or its pattern
against the broker's topics now), then each topic's route resolved and grouped into the
run's tables, one sink each (settings/routes.py says what a route is).

``resolve_routes`` is the one step of a run that decides routes, before any table is
checked or read (a list's run: before the lock, from the config; a pattern's: once its
topics are known).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pipeline.config import Settings, SinkSettings
from pipeline.errors import ConfigError
from pipeline.plan.offsets import OffsetRange
from pipeline.settings.routes import group
from pipeline.sinks import Sink, for_sink

log = logging.getLogger("pipeline")


@dataclass(frozen=True)
class RunTable:
    """One table a run writes: the route of its topics, its sink, the topics."""

    route: SinkSettings
    sink: Sink
    topics: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.route.table

    @property
    def binary(self) -> bool | None:
        """The staged rows' COPY wire (registry.binary_rows): binary tuples or text lines;
        None for a transform's, which its driver chooses once its output's types are known
        (Publisher.choose_wire)."""
        from pipeline.formats.registry import binary_rows

        if self.route.transform:
            return None
        return binary_rows(self.route.record_format,
                           [(c.name, c.type) for c in self.route.columns])

    def as_dict(self) -> dict:
        return {"mode": self.route.mode, "topics": list(self.topics)}


@dataclass(frozen=True)
class RunRoutes:
    """The run's tables, by name, and which topic goes to which."""

    tables: tuple[RunTable, ...]

    def table_of(self, topic: str) -> RunTable:
        for t in self.tables:
            if topic in t.topics:
                return t
        raise KeyError(f"topic {topic!r} has no table in this run")

    @property
    def sinks(self) -> list[Sink]:
        return [t.sink for t in self.tables]

    def reading(self, ranges: Iterable[OffsetRange]) -> tuple[RunTable, ...]:
        """The tables the ``ranges``' topics go to (a table with nothing to read is left
        alone by the run's transaction)."""
        topics = {r.topic for r in ranges}
        return tuple(t for t in self.tables if topics.intersection(t.topics))

    def encodings(self, settings: Settings, run_id: int) -> tuple[tuple[str, object], ...]:
        """Each topic's encoder settings (executor/task.RangeStageTask.encodings)."""
        from pipeline.executor.task import EncoderSettings

        return tuple((topic, EncoderSettings.for_route(t.route, settings.schema_registry,
                                                       run_id))
                     for t in self.tables for topic in t.topics)

    def describe(self) -> str:
        return "; ".join(f"{', '.join(t.topics)} -> {t.name} ({t.route.mode})"
                         for t in self.tables) or "no table"

    def as_dict(self) -> dict[str, dict]:
        return {t.name: t.as_dict() for t in self.tables}


def run_topics(settings: Settings, meta) -> list[str]:
    """The topics this run reads: kafka.topics, or the broker's topics that
    kafka.topic_pattern matches now (a new one joins from kafka.starting_offsets)."""
    k = settings.kafka
    if k.topic_pattern is None:
        return list(k.topics)
    topics = k.select(meta.topic_names())
    if not topics:
        log.warning("kafka.topic_pattern = %r matches no topic on %s yet: nothing to read",
                    k.topic_pattern, k.bootstrap_servers,
                    extra={"event": "plan.no_topics", "topic_pattern": k.topic_pattern})
    return topics


def stored_elsewhere(stored_topics: Iterable[str], topics: Sequence[str]) -> list[str]:
    """Topics the pipeline stored offsets of that its pattern no longer finds (deleted, or
    the pattern changed): their offsets stay as they are, unread."""
    return sorted(set(stored_topics) - set(topics))


def resolve_routes(settings: Settings, topics: Sequence[str]) -> RunRoutes:
    """The run's routes, resolved: each topic's route ([sink] and its [sink.topics.*]
    keys, its table named), grouped into the run's tables (settings/routes.group: the
    topics of one table agree on its columns, key and mode), one sink each."""
    routes = {topic: settings.routes.for_topic(topic) for topic in topics}
    return RunRoutes(tuple(
        RunTable(t.sink, for_sink(t.sink, settings.schema, settings.name), t.topics)
        for t in group(routes)))


@dataclass(frozen=True)
class TableScope:
    """What a command that works on one results table (verify, a dead-letter replay) works
    on: the ``settings`` with [sink] the table's route and kafka.topics its topics; and
    ``topics``, the records it may look at (None: a pipeline of one table, all of them, as
    it always was)."""

    table: str
    settings: Settings
    topics: tuple[str, ...] | None = None


def table_scopes(settings: Settings, topics: Sequence[str], *, table: str | None = None,
                 topic: str | None = None) -> list[TableScope]:
    """The tables a per-table command works on, by name: every table of ``topics`` (the
    pipeline's now: run_topics), or only ``table``, or only ``topic``'s. Exit 2 naming the
    pipeline's tables when ``table`` is none of them."""
    routes = settings.routes
    if routes.one_table is not None and table in (None, routes.one_table):
        return [TableScope(routes.one_table, settings)]
    tables = routes.tables(topics)
    if topic is not None:
        tables = tuple(t for t in tables if topic in t.topics)
    if table is not None:
        tables = tuple(t for t in tables if t.table == table)
    if not tables:
        known = ", ".join(t.table for t in routes.tables(topics)) or "none yet"
        what = f"--table {table}" if table is not None else f"--topic {topic}"
        raise ConfigError(f"{what}: no topic of pipeline '{settings.name}' goes to it (its "
                          f"tables: {known}); give one of them")
    k = replace(settings.kafka, topics=(), topic_pattern=None)
    return [TableScope(t.table, replace(settings, sink=t.sink, sink_overrides=(),
                                        kafka=replace(k, topics=t.topics)), t.topics)
            for t in tables]
