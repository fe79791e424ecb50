"""A user transform ([sink] transform = "module:function"): loaded, applied to the
DataFrame of decoded records (executor/transform/feed.py), and its output held to the sink's
contract before anything is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.config import SinkSettings
from pipeline.errors import ConfigError

COORDINATES = ["topic", "partition", "offset"]


def apply(records, sink: SinkSettings):
    """The user's transform over ``records`` (the result columns, executor/transform/feed.py's
    DataFrame), its output checked against the sink's contract; run on the driver, where
    it only builds a plan."""
    from pyspark.errors import AnalysisException, ParseException

    transform = load_transform(sink.transform)
    try:
        results = transform(records)
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
    refuse_partial_reads(results, sink)
    return results


# Plan nodes that stop reading what is below them before its end, and what made them.
PARTIAL = {"GlobalLimit": "limit()", "LocalLimit": "limit()", "Offset": "offset()",
           "Sample": "sample()", "Tail": "tail()"}


def partial_read(plan) -> str | None:
    """What in a logical plan (py4j) reads only part of the transform's input (the
    read tasks' ``MapInArrow`` over ``Range``, executor/transform/feed.py), if any: a limit over a
    dimension table joined in is not one."""
    todo = [(plan, None)]
    while todo:
        node, above = todo.pop()
        name = node.nodeName()
        above = PARTIAL.get(name, above)
        kids = node.children()
        kids = [kids.apply(i) for i in range(kids.size())]
        if above and name == "MapInArrow" and any(k.nodeName() == "Range" for k in kids):
            return above
        todo += [(k, above) for k in kids]
    return None


def refuse_partial_reads(results, sink: SinkSettings) -> None:
    """A transform must read all of its input: its read tasks commit their dead letters and
    range summaries only when read to the end (executor/transform/feed.py). A limit or sample over
    the input is refused here, from the plan, before anything is read; the publisher
    refuses any other read that stopped early (Publisher.finish), which is also what is
    left when the plan cannot be read (pyspark's private ``_jdf``)."""
    try:
        node = partial_read(results._jdf.queryExecution().analyzed())
    except Exception:  # noqa: BLE001 - Publisher.finish still refuses a partial read
        node = None
    if node:
        raise ConfigError(
            f"[sink] transform {sink.transform!r} reads only part of its input (a {node} "
            "of it); a transform must read every record it is given, as each one is "
            "counted (a row, a dead letter or filtered): filter rows instead (where), then "
            "rerun; nothing was read")


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


def result_names(sink: SinkSettings) -> list[str]:
    if sink.format == "raw":
        return ["topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp"]
    return ["topic", "partition", "offset", "kafka_timestamp", *[c.name for c in sink.columns]]


def load_transform(spec: str):
    module_name, _, func_name = spec.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"sink.transform {spec!r} cannot be loaded: {e}") from None
    if not callable(func):
        raise ConfigError(f"sink.transform {spec!r} is not a function")
    return func


@contextmanager
def session_settings(spark, values: dict[str, str]) -> Iterator[None]:
    """The session's SQL ``values`` for the jobs run inside the block (Spark hands them to
    the tasks of each job), the values before it back after it: the process may run other
    work on the same session."""
    before = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
