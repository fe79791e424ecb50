"""Kafka records -> result rows + dead-letter rows, all in Spark (no Python per record).

A record that cannot become a result row is never dropped and never crashes the run: it
becomes a dead-letter row with its original coordinates and the reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from pipeline.config import SinkSettings
from pipeline.errors import ConfigError

COORDINATES = ["topic", "partition", "offset"]


def _headers_json(F, headers="headers"):
    # Header values are bytes and may not be UTF-8: keep them exactly, as base64.
    return F.to_json(F.transform(
        F.coalesce(F.col(headers), F.array().cast("array<struct<key:string,value:binary>>")),
        lambda h: F.struct(h["key"].alias("key"), F.base64(h["value"]).alias("value_b64"))))


def mark(df, sink: SinkSettings, schemas=None, carry: Sequence[str] = ()):
    """One DataFrame with every record: the result columns, the dead-letter columns and
    ``error_code`` (null for a good record, else a short code that json_diagnose.diagnose
    explains, with ``_parsed`` = Spark's typed parse for a rejected parse). Lets a single
    pass stage both outputs. JSON: key, value and headers (Kafka's array, serialised by
    ``split``) are kept for bad records only. ``carry``: columns of ``df`` kept as they are
    (spark/record_hash.DIGEST)."""
    from pyspark.sql import functions as F

    if sink.format == "raw":
        return df.select(
            "topic", "partition", "offset", "key", "value",
            _headers_json(F).alias("headers"),
            F.col("timestamp").alias("kafka_timestamp"),
            F.lit(None).cast("string").alias("error_code"),
            F.lit(None).cast("string").alias("_parsed"), *carry)
    base = df.select("topic", "partition", "offset", "key", "value", "headers",
                     F.col("timestamp").alias("kafka_timestamp"), *carry)
    if sink.format in ("avro", "protobuf"):
        return typed_columns(base, sink, schemas, F, carry)
    return _parse_json(base, sink, F, carry)


def typed_columns(base, sink: SinkSettings, schemas, F, carry: Sequence[str] = ()):
    """A schema format's raw value column -> the declared typed columns (or error_code and
    its reason in _parsed), decoded by the built-in sinks' own Encoder in an Arrow step
    (formats/decoded_columns.py says why not from_avro). ``schemas``: [schema_registry].
    ``carry``: string columns of ``base`` passed through (the ledger's digest)."""
    from pipeline.executor.task import EncoderSettings
    from pipeline.formats import decoded_columns

    columns = tuple((c.name, c.type, c.required, c.source) for c in sink.columns)
    decode = decoded_columns.decoder(EncoderSettings(sink.format, columns, 0, (), schemas))
    marked = base.mapInArrow(decode, decoded_columns.output_schema(columns, carry))
    bad = F.col("error_code").isNotNull()
    return marked.select(
        "topic", "partition", "offset",
        *[F.when(bad, F.col(n)).alias(n) for n in ("key", "value", "headers")],
        "kafka_timestamp", *[F.col(f"`{c.name}`") for c in sink.columns], "error_code",
        F.col("_parsed"), *carry)


def to_rows(df, sink: SinkSettings):
    """Returns (results, dead_letters) DataFrames, the user transform applied to results."""
    return split(mark(df, sink), sink)


def split(marked, sink: SinkSettings):
    """A marked DataFrame (``mark``) -> (results, dead_letters), the user transform applied
    to results. ``marked`` should be persisted: both outputs filter it, and a filter over an
    unpersisted ``mark`` is pushed below its parse, which Spark then evaluates once per
    check that reads the parse (docs/benchmarks.md, "Transform path: profile")."""
    from pyspark.sql import functions as F

    good = marked.where(F.col("error_code").isNull())
    results = good.select(*result_names(sink))
    dead = marked.where(F.col("error_code").isNotNull())
    if dict(dead.dtypes)["headers"].startswith("array"):  # the JSON format's mark
        dead = dead.withColumn("headers", _headers_json(F))
    dead = dead.select(*DEAD_INPUT_COLUMNS)
    if sink.transform:
        from pyspark.errors import AnalysisException, ParseException

        transform = load_transform(sink.transform)
        try:
            results = transform(results)
        # The user's code, run here on the driver, built no plan: Spark refused it, or the
        # code itself is wrong. Anything else (the JVM gone, Kafka or I/O errors from an
        # action the transform ran) goes on to the usual classification (transient or not).
        except (AnalysisException, ParseException, TypeError, AttributeError, KeyError,
                NameError, ValueError, IndexError, AssertionError) as e:
            raise ConfigError(
                f"[sink] transform {sink.transform!r} failed while building its DataFrame "
                f"({type(e).__name__}: {first_line(e)}); nothing was read: fix the transform "
                "(it runs on the driver when a run starts), then rerun") from None
        check_output(results.columns, sink)
    return results, dead


def first_line(e: Exception) -> str:
    """Spark's analysis errors span many lines (the plan); the first says what is wrong."""
    text = str(e).strip()
    return text.splitlines()[0] if text else "no message"


def check_output(columns: list[str], sink: SinkSettings) -> None:
    """The sink's contract with a transform, checked on the driver from the output's schema
    (nothing is read yet): every column the table is staged with is still there. The
    coordinates keep one row per record; an upsert's key and Kafka timestamp pick the
    newest record per key (sinks/upsert.newer); an aggregate's group_by are its groups."""
    missing = [c for c in result_names(sink) if c not in columns]
    if not missing:
        return
    # The explanation names the column whose loss matters most.
    first = min(missing, key=lambda c: (c not in COORDINATES, c not in sink.key,
                                        c != "kafka_timestamp"))
    if first in COORDINATES:
        why = ("the record's coordinates (topic, partition, offset): the table holds one "
               "row per Kafka record")
    elif first in sink.key:
        why = (f"the {'upsert key' if sink.mode == 'upsert' else 'aggregate group_by'} "
               f"column '{first}'")
    elif first == "kafka_timestamp" and sink.mode == "upsert":
        why = ("'kafka_timestamp': the upsert sink orders a key's records across partitions "
               "by it")
    else:
        why = f"'{first}', a column of the table {sink.table}"
    raise ConfigError(
        f"[sink] transform {sink.transform!r} dropped {why} (missing: {', '.join(missing)}); "
        "a transform may add, change and filter rows, but must keep these columns: return "
        "them from the transform (select them, or drop only columns of your own), then rerun")


# What a dead letter is made of before its diagnosis (see formats/json_diagnose.py).
DEAD_INPUT_COLUMNS = ["topic", "partition", "offset", "key", "value", "headers",
                      "kafka_timestamp", "error_code", "_parsed"]


def result_names(sink: SinkSettings) -> list[str]:
    if sink.format == "raw":
        return ["topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp"]
    return ["topic", "partition", "offset", "kafka_timestamp", *[c.name for c in sink.columns]]


def _parse_json(base, sink: SinkSettings, F, carry: Sequence[str] = ()):
    """One typed JSON parse per record (from_json) and a short chain of checks that yields
    a literal code: the generated code stays small (it is JIT-compiled in every fresh
    JVM), and the explanation of a bad record is left to json_diagnose.py."""
    from pipeline.formats import json_diagnose as d
    from pipeline.formats.types import column_type
    from pipeline.spark.session import has_variant

    # String columns are parsed as VARIANT: Spark would quietly turn a JSON number into a
    # string, and a declared string must be a JSON string. Spark 3.5 has no VARIANT: there a
    # JSON number or object in a string column lands as its JSON text (README, Spark lines).
    variant = has_variant()
    fields = [f"`{c.name}` "
              f"{'variant' if c.type == 'string' and variant else column_type(c.type).spark}"
              for c in sink.columns]
    parsed = base.withColumn("_s", F.col("value").cast("string")).select(
        "*",
        F.from_json("_s", ", ".join(fields) + ", _corrupt string",
                    {"columnNameOfCorruptRecord": "_corrupt", "mode": "PERMISSIVE"}).alias("_p"),
    )

    def field(c):
        return F.col(f"_p.`{c.name}`")

    def absent(c):
        if c.type == "string" and variant:
            return field(c).isNull() | F.expr(f"is_variant_null(_p.`{c.name}`)")
        return field(c).isNull()

    checks = [
        (F.col("value").isNull(), d.NULL_VALUE),
        # is_valid_utf8 is new in Spark 4; before, a decode that replaced bytes.
        (~F.expr("is_valid_utf8(_s)") if variant
         else F.encode("_s", "UTF-8") != F.col("value"), d.INVALID_UTF8),
        (F.col("_p").isNull() | F.col("_p._corrupt").isNotNull(), d.PARSE),
    ]
    for c in sink.columns:
        if c.required:
            checks.append((absent(c), d.MISSING + c.name))
        if c.type == "string" and variant:
            checks.append((~absent(c) & (F.lower(F.expr(f"schema_of_variant(_p.`{c.name}`)"))
                                         != F.lit("string")), d.NOT_A_STRING + c.name))
    code = F.lit(None).cast("string")
    for cond, value in reversed(checks):
        code = F.when(cond, F.lit(value)).otherwise(code)
    values = [F.expr(f"variant_get(_p.`{c.name}`, '$', 'string')")
              if c.type == "string" and variant else field(c) for c in sink.columns]
    marked = parsed.select(
        "topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp",
        *[value.alias(c.name) for value, c in zip(values, sink.columns, strict=True)],
        code.alias("error_code"), "_p", *carry)
    # A good record carries no dead-letter columns (null): nothing to cache for it. The
    # headers stay Kafka's array here (split serialises a dead letter's): to_json over a
    # lambda has no generated code, and would make this whole projection interpreted.
    bad = F.col("error_code").isNotNull()
    return marked.select(
        "topic", "partition", "offset",
        *[F.when(bad, F.col(n)).alias(n) for n in ("key", "value", "headers")],
        "kafka_timestamp", *[F.col(f"`{c.name}`") for c in sink.columns], "error_code",
        F.when(F.col("error_code") == F.lit(d.PARSE), F.to_json("_p")).alias("_parsed"),
        *carry)


def load_transform(spec: str):
    module_name, _, func_name = spec.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"sink.transform {spec!r} cannot be loaded: {e}") from None
    if not callable(func):
        raise ConfigError(f"sink.transform {spec!r} is not a function")
    return func
