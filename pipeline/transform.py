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
    """One JSON parse per record (from_json) decides good or bad; the diagnosis of a bad
    record (a second, untyped parse) runs only for the bad ones."""
    # String columns are parsed as VARIANT: Spark would quietly turn a JSON number into a
    # string, and a declared string must be a JSON string.
    fields = [f"`{c.name}` {'variant' if c.type == 'string' else c.spark_type}"
              for c in sink.columns]
    parsed = base.withColumn("_s", F.col("value").cast("string")).select(
        "*",
        F.from_json("_s", ", ".join(fields) + ", _corrupt string",
                    {"columnNameOfCorruptRecord": "_corrupt", "mode": "PERMISSIVE"}).alias("_p"),
    )

    def field(c):
        return F.col(f"_p.{c.name}")

    def absent(c):
        if c.type == "string":
            return field(c).isNull() | F.expr(f"is_variant_null(_p.{c.name})")
        return field(c).isNull()

    def kind_of(expr: str):
        return F.lower(F.expr(f"schema_of_variant({expr})"))

    # Bad records only: why from_json rejected the record.
    v = "try_parse_json(_s)"
    diagnosis = [
        (F.expr(f"{v} IS NULL"), "malformed_json", F.lit("value is not valid JSON")),
        (~F.expr(f"schema_of_variant({v}) LIKE 'OBJECT%'"), "not_an_object",
         F.concat(F.lit("value is JSON "), kind_of(v), F.lit(", expected an object"))),
    ]
    for c in sink.columns:
        raw = f"variant_get({v}, '$.{c.name}')"
        present = F.expr(f"{raw} IS NOT NULL AND NOT is_variant_null({raw})")
        if c.type != "string":
            diagnosis.append((field(c).isNull() & present, "wrong_type",
                              F.concat(F.lit(f"field '{c.name}': expected {c.type}, got "),
                                       kind_of(raw))))
    diagnosis.append((F.lit(True), "malformed_json",
                      F.lit("value does not match the declared columns")))

    checks = [
        (F.col("value").isNull(), "null_value", F.lit("value is null (tombstone)")),
        (~F.expr("is_valid_utf8(_s)"), "invalid_utf8", F.lit("value is not valid UTF-8")),
        (F.col("_p").isNull() | F.col("_p._corrupt").isNotNull(), diagnosis, None),
    ]
    for c in sink.columns:
        if c.required:
            checks.append((absent(c), "missing_field",
                           F.lit(f"required field '{c.name}' is missing or null")))
        if c.type == "string":
            checks.append((~absent(c) & (kind_of(f"_p.{c.name}") != F.lit("string")),
                           "wrong_type", F.concat(F.lit(f"field '{c.name}': expected string, "
                                                        "got "), kind_of(f"_p.{c.name}"))))
    error_type, error_message = _first_match(checks, F)
    values = [F.expr(f"variant_get(_p.{c.name}, '$', 'string')") if c.type == "string"
              else field(c) for c in sink.columns]
    return parsed.select(
        "topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp",
        *[value.alias(c.name) for value, c in zip(values, sink.columns, strict=True)],
        error_type.alias("error_type"), error_message.alias("error_message"))


def _first_match(checks, F):
    """CASE WHEN chains for (type, message): the first rule that matches names the error.
    A rule whose type is a list is a nested chain, evaluated only when its condition holds."""
    error_type = F.lit(None).cast("string")
    error_message = F.lit(None).cast("string")
    for cond, etype, message in reversed(checks):
        if isinstance(etype, list):
            etype, message = _first_match(etype, F)
        else:
            etype = F.lit(etype)
        error_type = F.when(cond, etype).otherwise(error_type)
        error_message = F.when(cond, message).otherwise(error_message)
    return error_type, error_message


def load_transform(spec: str):
    module_name, _, func_name = spec.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"sink.transform {spec!r} cannot be loaded: {e}") from None
    if not callable(func):
        raise ConfigError(f"sink.transform {spec!r} is not a function")
    return func
