"""The record formats: how a Kafka record's value becomes a result row, or the reason it
cannot, chosen once per run by ``[sink] format``.

A format is a class with the interface below, in its own folder of formats/ (its format.py,
or one module per encoding: debezium/); adding one is a folder and a line in FORMATS
(tests/unit/test_format_registry.py holds the two together). The COPY wire encoding of its
rows (wire/text.TEXT or wire/binary.BINARY) is the format's ``wire``: staging writes the
rows' blobs with it and the publisher frames them for it. What every format shares (the
guard that makes any failing record a dead letter, tombstones, the dead-letter line) is
encode.Encoder's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from pipeline.formats.avro.format import AvroFormat
from pipeline.formats.debezium.avro import DebeziumAvroFormat
from pipeline.formats.debezium.json import DebeziumFormat
from pipeline.formats.json.format import JsonFormat
from pipeline.formats.protobuf.format import ProtobufFormat
from pipeline.formats.raw.format import RawFormat
from pipeline.formats.wire.binary import BinaryWire
from pipeline.formats.wire.text import TextWire


class RecordFormat(Protocol):
    wire: TextWire | BinaryWire  # the COPY encoding of its rows

    # A format that decodes by writer schemas (avro, protobuf) also takes ``schemas=``, a
    # SchemaSource (the Encoder passes it when [schema_registry] is configured).
    def __init__(self, columns: Sequence[tuple[str, str, bool]], run_id: int): ...

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list:
        """The batch fast path: the result rows (each ending with ``run_id``) of the records
        it can take. Each other record goes to ``rejected`` (``explain`` says why, later)
        or, with its reason, to ``refuse(record, error_type, message)``. May raise
        anything: the Encoder then takes the batch one record at a time."""
        ...

    def explain(self, m) -> tuple[str, str]:
        """(error_type, message) of a record ``rows`` rejected; slow is fine."""
        ...

    # Optional, for a format whose records delete by more than a null value (debezium):
    # ``delete_key(m, key_columns)``, the key (Kafka key bytes or a document) of the row a rejected
    # record deletes under an upsert sink; without it only a null value deletes, by its key.


FORMATS: dict[str, type[RecordFormat]] = {"json": JsonFormat, "raw": RawFormat,
                                           "avro": AvroFormat, "debezium": DebeziumFormat,
                                           "protobuf": ProtobufFormat,
                                           "debezium_avro": DebeziumAvroFormat}


def record_format(name: str) -> type[RecordFormat]:
    return FORMATS[name]


# The formats that write either COPY wire (a ``binary`` keyword and ``binary_for(columns)``):
# binary where the columns allow it, text for a transform's feed (encode.Encoder).
CHOOSE_WIRE = ("avro",)


def binary_rows(fmt: str, columns: Sequence[Sequence]) -> bool:
    """True when a format's staged result rows are COPY binary (raw; avro when every
    declared (name, type, ...) column has a binary form), False for COPY text (json,
    protobuf, the debezium formats, avro with an array column)."""
    if fmt in CHOOSE_WIRE:
        return FORMATS[fmt].binary_for(columns)
    return FORMATS[fmt].wire.binary
