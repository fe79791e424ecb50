"""A schema format's (avro, protobuf) records as typed columns for a user transform: the
transform path's decoding step, one Arrow batch at a time (Spark's ``mapInArrow``, wired
in spark/transform.py).

Why our own decoders and not Spark's ``from_avro`` over the value minus its 5-byte header:
``from_avro`` takes ONE reader schema, fixed when the job is planned, so records of other
writer schema ids would be read with the wrong schema (garbage or a failed task, not a dead
letter), and it has no Protobuf-with-registry counterpart, no per-record dead letters with a
reason, and a jar to pin per Spark line. Here each batch goes through exactly the Encoder
the built-in sinks use (its format's writer-schema lookup by id, projection by name,
evolution rules, logical types, and the guard that makes any failing record a dead
letter), so a record is a row or a dead letter, with the same reason, on both paths. The
Encoder's result rows are COPY text; each field is read back into its column's typed value
(the text is exact: it is what Postgres would parse), so the transform gets the declared
columns typed as Spark types, as the JSON path gives them.

A refused record's error type travels in ``error_code`` as ``refused:<error_type>`` and its
message in ``_parsed``; json_diagnose.diagnose hands them back for its dead letter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import date, datetime
from decimal import Decimal

from pipeline.formats import paths
from pipeline.formats.copy_text import NULL
from pipeline.formats.json_diagnose import REFUSED
from pipeline.formats.types import column_type

# The columns of the records the step receives, in order (spark/transform.mark's base).
INPUT = ("topic string, partition int, offset bigint, key binary, value binary, "
         "headers array<struct<key:string,value:binary>>, kafka_timestamp timestamp")
_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPED = re.compile(r"\\(.)")


def output_schema(columns: Sequence[Sequence], carry: Sequence[str] = ()) -> str:
    """The step's output (Spark DDL): the input (with ``carry``, string columns passed
    through), the declared columns as their Spark types, ``error_code`` and ``_parsed``."""
    typed = ", ".join(f"`{name}` {column_type(t).spark}"
                      for name, t, _, _ in paths.columns(columns))
    carried = "".join(f", `{name}` string" for name in carry)
    return f"{INPUT}{carried}, {typed}, error_code string, _parsed string"


def unescape(field: str) -> str:
    """A COPY text field's string (copy_text.text undone)."""
    if "\\" not in field:
        return field
    return _ESCAPED.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), field)


def _reader(declared: str) -> Callable[[str], object]:
    """A COPY text field the Encoder wrote for a column of ``declared`` -> its value."""
    t = column_type(declared)
    if not t.scalar:
        raise ValueError(f"column type {declared} is not read back for a transform")
    if t.precision is not None:
        return Decimal
    return {"string": unescape, "long": int, "int": int, "double": float,
            "boolean": lambda f: f == "t", "timestamp": datetime.fromisoformat,
            "date": date.fromisoformat}[declared]


def _arrow_type(declared: str, pa):
    t = column_type(declared)
    if t.precision is not None:
        return pa.decimal128(t.precision, t.scale)
    return {"string": pa.string(), "long": pa.int64(), "int": pa.int32(),
            "double": pa.float64(), "boolean": pa.bool_(), "timestamp": pa.timestamp(
                "us", tz="UTC"), "date": pa.date32()}[declared]


class _Record:
    """One Arrow row as the Encoder reads a Kafka record (confluent-kafka's Message)."""
    __slots__ = ("o", "k", "v", "ts")

    def __init__(self, o, k, v, ts):
        self.o, self.k, self.v, self.ts = o, k, v, ts

    def offset(self):
        return self.o

    def key(self):
        return self.k

    def value(self):
        return self.v

    def headers(self):  # only a dead line's, and only its error type and message are kept
        return None

    def timestamp(self):
        return (0, self.ts)


def decoder(encoding) -> Callable:
    """A picklable function for ``mapInArrow`` over INPUT batches -> ``output_schema``
    batches. ``encoding``: executor.task.EncoderSettings of the sink's format (no
    tombstone key: on the transform path a null value is a dead letter)."""

    def decode(batches):
        import pyarrow as pa

        encoder = encoding.encoder()
        declared = [(n, t) for n, t, _, _ in paths.columns(encoding.columns)]
        names = [n for n, _ in declared]
        readers = [_reader(t) for _, t in declared]
        types = [_arrow_type(t, pa) for _, t in declared]
        for batch in batches:
            yield _decoded(batch, encoder, names, readers, types, pa)

    return decode


def _decoded(batch, encoder, names, readers, types, pa):
    """One batch with its typed columns, error_code and _parsed appended."""
    n = len(batch)
    topics = batch.column("topic").to_pylist()
    partitions = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    micros = batch.column("kafka_timestamp").cast(pa.int64()).to_pylist()
    columns: list[list] = [[None] * n for _ in readers]
    codes: list[str | None] = [None] * n
    reasons: list[str | None] = [None] * n
    start = 0
    while start < n:  # runs of one (topic, partition): the Encoder's batch
        end = start
        while end < n and topics[end] == topics[start] and partitions[end] == partitions[start]:
            end += 1
        at = {offsets[i]: i for i in range(start, end)}
        records = [_Record(offsets[i], keys[i], values[i],
                           None if micros[i] is None else micros[i] // 1000)
                   for i in range(start, end)]
        encoded = encoder.encode(topics[start], partitions[start], records)
        for line in encoded.rows:
            fields = line.rstrip("\n").split("\t")
            i = at[int(fields[2])]
            for c, (read, field) in enumerate(zip(readers, fields[4:-1], strict=True)):
                columns[c][i] = None if field == NULL else read(field)
        for line in encoded.dead:
            fields = line.rstrip("\n").split("\t")
            i = at[int(fields[2])]
            codes[i] = REFUSED + unescape(fields[7])
            reasons[i] = unescape(fields[8])
        start = end
    arrays = [*batch.columns,
              *(pa.array(col, type=t) for col, t in zip(columns, types, strict=True)),
              pa.array(codes, type=pa.string()), pa.array(reasons, type=pa.string())]
    return pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *names,
                                                     "error_code", "_parsed"])
