"""Typed settings of a pipeline: one module per table of its TOML file (a pydantic model of
the table, and the frozen value a run uses), the environment's overrides (env.py), the
one-line errors (messages.py) and the secrets kept out of output (secrets.py)."""

from pipeline.settings.columns import COLUMN_TYPE, RESERVED_COLUMNS, Column
from pipeline.settings.document import SECTIONS, TABLES, ConfigFile, Settings
from pipeline.settings.kafka import (
    DEFAULT_MAX_RECORDS_PER_PARTITION,
    DEFAULT_MAX_RECORDS_PER_RUN,
    KafkaSettings,
)
from pipeline.settings.load import load_settings, parse_settings, with_overrides
from pipeline.settings.metrics import MetricsSettings
from pipeline.settings.secrets import (
    MASK_LOGS,
    SECRET_KEY,
    MaskingFilter,
    mask,
    redact_settings,
    redact_url,
)
from pipeline.settings.sink import (
    COLUMN_FORMATS,
    SINK_FORMATS,
    SINK_MODES,
    Evolve,
    SinkSettings,
)
from pipeline.settings.sink_modes import AGGREGATE, Aggregate
from pipeline.settings.spark import SparkSettings

__all__ = [
    "AGGREGATE", "COLUMN_FORMATS", "COLUMN_TYPE", "DEFAULT_MAX_RECORDS_PER_PARTITION",
    "DEFAULT_MAX_RECORDS_PER_RUN", "MASK_LOGS", "RESERVED_COLUMNS", "SECRET_KEY", "SECTIONS",
    "SINK_FORMATS", "SINK_MODES", "TABLES", "Aggregate", "Column", "ConfigFile", "Evolve",
    "KafkaSettings", "MaskingFilter", "MetricsSettings", "Settings", "SinkSettings",
    "SparkSettings", "load_settings", "mask", "parse_settings", "redact_settings",
    "redact_url", "with_overrides",
]
