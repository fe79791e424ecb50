"""The JSON format's values, one list per column (json/rows.column_encoder) -> the typed
Arrow batch a user transform receives (typed_rows.py): the lines' round trip
(COPY text written per record, then split again by Arrow's CSV reader) skipped.

Each column becomes the Arrow array arrow_rows.RowReader would read from the lines, by
the same rules: coordinates, integers and strings straight from their Python values (a
string is the value itself: its COPY text unescaped is the same); the Kafka timestamp
from its epoch milliseconds; every other type (double, boolean, decimal, timestamp, date)
from the very text the line would hold (a number's str(), the other rules' COPY text),
cast by RowReader.typed, with its roundings and fallbacks. tests/unit/test_arrow_columns.py
holds the batch equal to the lines' batch. Pure: no Spark, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

# Declared types whose values are Python objects Arrow takes as they are.
_DIRECT = {"long": "int64", "int": "int32", "string": "string"}


def column_batch(reader, topic: str, partition: int, values: Sequence[list], pa):
    """``values``: offsets, epoch ms, then each declared column's values (None = NULL);
    ``reader``: the sink's arrow_rows.RowReader (its schema and casts) -> pa.RecordBatch."""
    import pyarrow.compute as pc

    offsets, millis, *declared = values
    n = len(offsets)
    offset = pa.array(offsets, pa.int64())
    head = [pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n), offset]
    # ms -> us cannot overflow: typed_rows left out what Spark cannot hold (SPARK_MAX_MS).
    head.append(pc.multiply(pa.array(millis, pa.int64()), 1000).cast(
        pa.timestamp("us", tz="UTC")))
    table = None
    arrays = list(head)
    for (_, t), exact, column in zip(reader.columns[4:], reader.exact[4:], declared,
                                     strict=True):
        direct = _DIRECT.get(t)
        if direct is not None:
            arrays.append(pa.array(column, getattr(pa, direct)()))
            continue
        texts = None
        if t.startswith("decimal"):
            # The rules pass a plain float or int as written (its repr, Python's shortest
            # round trip); Arrow writes a double's shortest round trip too, ~4x faster.
            try:
                texts = pc.cast(pa.array(column, pa.float64()), pa.string())
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                pass  # a value the exact rule wrote as text
        if texts is None:  # the line's text of each value: str() of a passed number
            texts = pa.array([v if v is None or type(v) is str else str(v) for v in column]
                             if None in column else list(map(str, column)), pa.string())
        if table is None:  # names a record whose timestamp Spark cannot hold
            table = pa.table(head[:3], names=["topic", "partition", "offset"])
        arrays.append(reader.typed(pa.chunked_array([texts]), t, exact, table))
    return pa.RecordBatch.from_arrays(arrays, schema=reader.schema)
