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
    """The pipeline's sink: chosen once, from [sink] mode."""
    return for_sink(settings.sink, settings.schema, settings.name)


__all__ = ["MODES", "Aggregate", "Append", "Merged", "Sink", "Upsert", "for_settings",
           "for_sink"]
