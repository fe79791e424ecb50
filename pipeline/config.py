"""A pipeline's settings, as the rest of the code imports them: the tables' models, the
checks and the values a run uses live in pipeline/settings/ (one module per table)."""

from pipeline.settings import (
    COLUMN_TYPE,
    MASK_LOGS,
    Aggregate,
    Column,
    KafkaSettings,
    Settings,
    SinkSettings,
    load_settings,
    mask,
    parse_settings,
    redact_url,
    with_overrides,
)

__all__ = ["COLUMN_TYPE", "MASK_LOGS", "Aggregate", "Column", "KafkaSettings", "Settings",
           "SinkSettings", "load_settings", "mask", "parse_settings", "redact_url",
           "with_overrides"]
