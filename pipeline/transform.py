"""Kafka records -> result rows + dead-letter rows, all in Spark (no Python per record).

A record that cannot become a result row is never dropped and never crashes the run: it
becomes a dead-letter row with its original coordinates and the reason.
"""

from __future__ import annotations

import importlib

from pipeline.config import SinkSettings
from pipeline.errors import ConfigError

COORDINATES = ["topic", "partition", "offset"]
DEAD_LETTER_COLUMNS = ["topic", "partition", "offset", "key", "value", "headers",
                       "kafka_timestamp", "error_type", "error_message"]


def _headers_json(F):
    # Header values are bytes and may not be UTF-8: keep them exactly, as base64.
    return F.to_json(F.transform(
        F.coalesce(F.col("headers"), F.array().cast("array<struct<key:string,value:binary>>")),
        lambda h: F.struct(h["key"].alias("key"), F.base64(h["value"]).alias("value_b64"))))


def mark(df, sink: SinkSettings):
    """One DataFrame with every record: the result columns, the dead-letter columns, and
    ``error_type`` (null for a good record). Lets a single pass stage both outputs."""
    from pyspark.sql import functions as F

    base = df.select(
        "topic", "partition", "offset", "key", "value",
        _headers_json(F).alias("headers"),
        F.col("timestamp").alias("kafka_timestamp"),
    )
    if sink.format == "raw":
        return base.select("*", F.lit(None).cast("string").alias("error_type"),
                           F.lit(None).cast("string").alias("error_message"))
    return _parse_json(base, sink, F)


def to_rows(df, sink: SinkSettings):
    """Returns (results, dead_letters) DataFrames, the user transform applied to results."""
    from pyspark.sql import functions as F

    marked = mark(df, sink)
    good = marked.where(F.col("error_type").isNull())
    results = good.select(*result_names(sink))
    dead = marked.where(F.col("error_type").isNotNull()).select(*DEAD_LETTER_COLUMNS)
    if sink.transform:
        results = load_transform(sink.transform)(results)
        missing = [c for c in COORDINATES if c not in results.columns]
        if missing:
            raise ConfigError(f"transform {sink.transform} dropped the columns {missing}; "
                              "results must keep topic, partition and offset")
    return results, dead


def result_names(sink: SinkSettings) -> list[str]:
    if sink.format == "raw":
        return ["topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp"]
    return ["topic", "partition", "offset", "kafka_timestamp", *[c.name for c in sink.columns]]


def _parse_json(base, sink: SinkSettings, F):
    schema = ", ".join(f"`{c.name}` {c.spark_type}" for c in sink.columns) + ", _corrupt string"
    parsed = base.withColumn("_s", F.col("value").cast("string")).select(
        "*",
        F.from_json("_s", schema, {"columnNameOfCorruptRecord": "_corrupt",
                                   "mode": "PERMISSIVE"}).alias("_p"),
        F.expr("try_parse_json(_s)").alias("_v"),
    )
    # The first rule that matches names the error; order matters.
    checks = [
        (F.col("value").isNull(), "null_value", F.lit("value is null (tombstone)")),
        (~F.expr("is_valid_utf8(_s)"), "invalid_utf8", F.lit("value is not valid UTF-8")),
        (F.col("_v").isNull(), "malformed_json", F.lit("value is not valid JSON")),
        (~F.expr("schema_of_variant(_v) LIKE 'OBJECT%'"), "not_an_object",
         F.concat(F.lit("value is JSON "), F.lower(F.expr("schema_of_variant(_v)")),
                  F.lit(", expected an object"))),
    ]
    for c in sink.columns:
        raw = F.expr(f"variant_get(_v, '$.{c.name}')")
        absent = raw.isNull() | F.expr(f"is_variant_null(variant_get(_v, '$.{c.name}'))")
        got = F.lower(F.expr(f"schema_of_variant(variant_get(_v, '$.{c.name}'))"))
        if c.required:
            checks.append((absent, "missing_field",
                           F.lit(f"required field '{c.name}' is missing or null")))
        wrong = F.col(f"_p.{c.name}").isNull() & ~absent
        if c.type == "string":
            # Spark would quietly turn numbers into strings; a declared string is a string.
            wrong = wrong | (~absent & (got != F.lit("string")))
        checks.append((wrong, "wrong_type",
                       F.concat(F.lit(f"field '{c.name}': expected {c.type}, got "), got)))
    error_type = F.lit(None).cast("string")
    error_message = F.lit(None).cast("string")
    for cond, etype, message in reversed(checks):
        error_type = F.when(cond, F.lit(etype)).otherwise(error_type)
        error_message = F.when(cond, message).otherwise(error_message)
    return parsed.select(
        "topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp",
        *[F.col(f"_p.{c.name}").alias(c.name) for c in sink.columns],
        error_type.alias("error_type"), error_message.alias("error_message"))


def load_transform(spec: str):
    module_name, _, func_name = spec.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"sink.transform {spec!r} cannot be loaded: {e}") from None
    if not callable(func):
        raise ConfigError(f"sink.transform {spec!r} is not a function")
    return func
