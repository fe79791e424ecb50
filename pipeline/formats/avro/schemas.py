"""Avro writer schemas by the id in the Confluent wire format's header, parsed with
fastavro; fetching and caching (once per id, per process) are schema_source.py's, shared
with the protobuf format. A schemas_dir holds them as ``<id>.avsc``.
"""

from __future__ import annotations

import json

from pipeline.errors import Kind
from pipeline.formats.schema_source import (
    SchemaKind,
    SchemaSource,
    SchemaSourceError,
    UnknownSchema,
    cached_schema,
)

__all__ = ["SchemaSource", "SchemaSourceError", "UnknownSchema", "writer_schema"]


def _parse(source: SchemaSource, schema_id: int, text: str):
    import fastavro

    try:
        # A fresh namespace per id: two versions of one record name must not clash.
        return fastavro.parse_schema(json.loads(text), named_schemas={})
    except Exception as e:  # noqa: BLE001 - whatever the parser says, the schema is bad
        raise SchemaSourceError(Kind.CONFIG, f"{source.describe()}: writer schema id "
                                f"{schema_id} is not a valid Avro schema ({type(e).__name__}: "
                                f"{e}); fix the schema, then rerun") from None


AVRO = SchemaKind("AVRO", ".avsc", "avro", _parse)


def writer_schema(source: SchemaSource, schema_id: int):
    """The parsed (fastavro) writer schema of ``schema_id``; raises UnknownSchema or
    SchemaSourceError."""
    return cached_schema(source, AVRO, schema_id)
