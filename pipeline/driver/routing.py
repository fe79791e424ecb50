"""A run's topics and where their records go: the topics (the config's list, or its pattern
against the broker's topics now), then each topic's route resolved and grouped into the
run's tables, one sink each (settings/routes.py says what a route is).

``resolve_routes`` is the one step of a run that decides routes, after the plan and before
any table is checked or read: where ``columns = "schema"`` will make a route's columns and
key from its topic's writer schema.
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
    keys, its table named), grouped into the run's tables, one sink each. This is the one
    place a run decides a route: a route whose columns come from the writer's schema
    (columns = "schema") is to be resolved here, per topic, before the grouping (which holds
    the topics of one table to one set of columns) and before any table is checked."""
    routes = {topic: settings.routes.for_topic(topic) for topic in topics}
    return RunRoutes(tuple(
        RunTable(t.sink, for_sink(t.sink, settings.schema, settings.name), t.topics)
        for t in group(routes)))


def one_table_settings(settings: Settings, what: str) -> Settings:
    """The settings of a command that works on one results table (``what``: verify, a
    dead-letter replay), with [sink] that table's route: exit 2 for a pipeline of several
    tables (such a command per table is not built yet)."""
    routes = settings.routes
    if routes.one_table is not None:
        return settings
    if settings.kafka.topic_pattern is None:
        tables = routes.tables(settings.kafka.topics)
        if len(tables) == 1:
            return replace(settings, sink=tables[0].sink, sink_overrides=())
        names = ", ".join(t.table for t in tables)
    else:
        names = f"a table per topic of kafka.topic_pattern = {settings.kafka.topic_pattern!r}"
    raise ConfigError(f"{what}: not yet for several tables (pipeline '{settings.name}' writes "
                      f"{names}); it works on a pipeline of one table")
