"""A run of one topic: its ``topic`` column as a literal, so that the string never crosses
the JVM (the read tasks' Arrow -> rows and the rows -> the writer's Arrow each cost ~0.5
JVM CPU-s per string column per 2M records, docs/benchmarks.md).

The read tasks leave the column out (FeedTask.topic); the transform receives it as
``F.lit(topic)``, so its code sees the same DataFrame. The writer leaves it out only
where Spark's optimizer proves every output row still holds that literal (its
FoldablePropagation carries it through projections, filters and joins): then the column
is not selected, Spark prunes the literal, and the writer puts the topic in each COPY
line itself (LineStageTask.topic); a ``groupBy`` of it folds it too. Anything else (a
transform that changes the topic, a union on top) keeps the column, as the rows' own
values.
"""

from __future__ import annotations

TOPIC = "topic"


def with_topic(records, topic: str):
    """``records`` (the read tasks' rows, no topic column) with ``topic`` first, as the
    feed's schema has it."""
    from pyspark.sql import functions as F

    return records.select(F.lit(topic).alias(TOPIC), "*")


def proven_literal(df, topic: str) -> bool:
    """Does the optimized plan of ``df`` (a py4j Dataset's ``select`` of the staged
    columns) make its ``topic`` column the literal ``topic`` on every row? Only the top
    node's own expressions are read: a Project or an Aggregate whose ``topic`` is an
    Alias of that Literal. The plan is read through pyspark's private ``_jdf``: anything
    unexpected answers False (the column stays, as the rows' own values)."""
    try:
        return _proven_literal(df._jdf.queryExecution().optimizedPlan(), topic)
    except Exception:  # noqa: BLE001 - the plain path: the writer takes the column
        return False


def _proven_literal(plan, topic: str) -> bool:
    name = plan.nodeName()
    if name == "Project":
        exprs = plan.projectList()
    elif name == "Aggregate":
        exprs = plan.aggregateExpressions()
    else:
        return False
    for i in range(exprs.size()):
        e = exprs.apply(i)
        if e.name() != TOPIC:
            continue
        if e.nodeName() != "Alias":
            return False
        child = e.child()
        return (child.nodeName() == "Literal"
                and child.dataType().simpleString() == "string"
                and child.value() is not None and child.value().toString() == topic)
    return False
