"""Sink modes (append, upsert, aggregate): how staged rows become the results table. One
module per mode behind pipeline/sinks/base.Sink; a new mode is a new module here and a line
in MODES (and its [sink] rules in settings/sink_modes.py)."""

from __future__ import annotations

from pipeline.config import Settings, SinkSettings
from pipeline.sinks.aggregate import Aggregate
from pipeline.sinks.append import Append
from pipeline.sinks.base import Merged, Sink
from pipeline.sinks.upsert import Upsert

MODES: dict[str, type[Sink]] = {s.mode: s for s in (Append, Upsert, Aggregate)}


def for_sink(sink: SinkSettings, schema: str, pipeline: str) -> Sink:
    return MODES[sink.mode](sink, schema, pipeline)


def for_settings(settings: Settings) -> Sink:
    """The sink of [sink] as written: a pipeline of one table's (its routes all take
    [sink]'s table: ``settings.routes.one_table``); a pipeline of several tables has a sink
    per table (``for_tables``)."""
    return for_sink(settings.sink, settings.schema, settings.name)


def for_tables(settings: Settings, topics) -> list[Sink]:
    """One sink per table the ``topics`` go to (their routes: settings/routes.py), by
    table name."""
    return [for_sink(t.sink, settings.schema, settings.name)
            for t in settings.routes.tables(topics)]


__all__ = ["MODES", "Aggregate", "Append", "Merged", "Sink", "Upsert", "for_settings",
           "for_sink", "for_tables"]
