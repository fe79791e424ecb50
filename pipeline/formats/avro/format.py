"""The Avro record format: a value in the Confluent wire format (magic byte 0, a 4-byte
big-endian schema id, the Avro binary encoding) decoded with fastavro against its writer
schema (avro/schemas.py), then projected to the declared columns by name; its rows are COPY
text lines, like the JSON format's.

Projection, not Avro schema resolution: the record is decoded with its own writer schema
and each declared column takes the field of its name, by the Avro value rules
(avro/values.py). So schema evolution works as users meet it: a field the writer added is
ignored, a declared column the writer lacks is null (or, if the column is ``not null``, a
dead letter naming the field and schema id), and int -> long, float -> double are the same
Python values. Every bad record is refused here with its reason: no second pass.

The rows a run stages are COPY binary tuples (``binary``: binary_fields.py; a timestamp is
one subtraction and a pack, a decimal numeric's own form, nothing for Postgres to parse),
unless a declared column has no binary form (an array); a transform's feed asks for COPY
text, which it reads into Arrow (executor/transform/typed_rows.py). The text rules decide
either way.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from functools import partial

from pipeline.formats import binary_fields, paths
from pipeline.formats.avro.raw import raw_plan
from pipeline.formats.avro.rows import batch_encoder, reads_values, record_encoder
from pipeline.formats.avro.schemas import SchemaSource, UnknownSchema, writer_schema
from pipeline.formats.avro.values import avro_kind
from pipeline.formats.json.values import WrongType
from pipeline.formats.refused import Refused, decoded_rows, unconvertible
from pipeline.formats.timestamps import kafka_timestamp
from pipeline.formats.types import column_type
from pipeline.formats.wire.binary import BINARY, pack_iq
from pipeline.formats.wire.text import NULL, TEXT, Unstorable

MAGIC = 0
HEADER = 5  # magic byte + schema id


class AvroFormat:
    """``columns``: the declared (name, type, required[, path]) columns, in table order;
    ``schemas``: where writer schemas come from (config's [schema_registry]);
    ``binary``: rows as COPY binary tuples (only where ``binary_for(columns)``), else COPY
    text lines."""

    def __init__(self, columns: Sequence[Sequence], run_id: int,
                 schemas: SchemaSource | None = None, binary: bool = False):
        if schemas is None:
            raise ValueError("the avro format needs a schema source ([schema_registry])")
        # A top-level field is read by its key; a nested one (a field of a record field) by
        # its path (paths.py): key None.
        self.columns = [(p[0] if len(p) == 1 else None, p, column_type(t).from_avro, r, t, n)
                        for n, t, r, p in paths.columns(columns)]
        self.schemas = schemas
        if binary and not self.binary_for(columns):
            raise ValueError("an array column has no COPY binary form here: text rows")
        self.binary = binary
        self.wire = BINARY if binary else TEXT
        self.tail = pack_iq(8, run_id) if binary else f"\t{run_id}\n"
        # The general path's text fields -> binary ones; a tuple's start per partition.
        self._tuple = binary_fields.tuple_of([c[4] for c in self.columns]) if binary else None
        self._heads: dict[tuple[str, int], bytes] = {}
        # A header (magic byte + schema id) that decoded once -> (the schema to decode its
        # records with, the id, the columns with raw converters or None (avro/raw.py), its
        # generated batch loop or None (avro/rows.py), whether that loop decodes each
        # value's own bytes).
        self._known: dict[bytes, tuple] = {}
        # A header -> its writer's one-record encoder (avro/rows.record_encoder).
        self._ones: dict[bytes, Callable] = {}

    @staticmethod
    def binary_for(columns: Sequence[Sequence]) -> bool:
        """True when every declared column's type has a COPY binary form (not an array)."""
        return binary_fields.binary_types([c[1] for c in columns])

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[str] | list[bytes]:
        """The batch's values are decoded from ONE buffer, each from where it starts in it
        (a BytesIO per record cost about as much as the decoding). A record is taken there
        only when its schema id was seen before and the decode ends exactly where its bytes
        end: then it read exactly its own bytes, as ``fields`` would. Anything else (a new
        id, a bad header, an error, a short or long read) goes to ``fields``, alone, which
        says why. The batch goes through its first writer schema's generated loop
        (avro/rows.py), which takes the values of other writers it has met through their
        own one-record encoders; the rest (and every value when there is no loop) through
        ``general``. A flat writer's loop decodes each value's own bytes: then there is no
        buffer, and ``general`` decodes a value alone. ``binary``: the general path's text
        fields become binary ones (binary_fields.tuple_of), the loop writes binary."""
        from fastavro import schemaless_reader as read

        known = self._known
        header = writer = None
        tried = 0
        for m in records:  # the loop's writer: the first of the batch's first values with one
            value = m.value()
            if value is None:
                continue
            if value[:HEADER] not in known:
                try:  # a task's first batch: learn its writer, for the loop's sake
                    self.fields(value, read)
                except Refused:
                    pass  # said again, with the record, by general()
            writer = known.get(value[:HEADER])
            if writer is not None and writer[3] is not None:
                header = value[:HEADER]
                break
            writer = None
            tried += 1
            if tried == 8:  # a batch of unknown or bad values: general() says why
                break
        # A flat writer's loop decodes each value's own bytes: no buffer of the batch.
        own = writer is not None and writer[3] is not None and writer[4]
        shared = None if own else io.BytesIO(
            b"".join([v for m in records if (v := m.value()) is not None]))
        project = self.project

        def general_text(value: bytes, start: int) -> str:
            fo = io.BytesIO(value) if shared is None else shared
            if shared is None:
                start = 0
            end = start + len(value)
            writer = known.get(value[:HEADER])
            if writer is not None:
                fo.seek(start + HEADER)
                try:
                    doc = read(fo, writer[0], None)
                except Exception:  # noqa: BLE001 - fields() decodes it alone and says why
                    doc = None
                if fo.tell() == end and type(doc) is dict:
                    if writer[2] is None:
                        return project(doc, writer[1])
                    try:  # raw values: their usual case only (avro/raw.py)
                        return project(doc, writer[1], writer[2])
                    except Exception:  # noqa: BLE001 - fields(): the typed rules say why
                        pass
            return self.fields(value, read)

        general, ts = general_text, kafka_timestamp
        if self.binary:
            head = self._heads.get((topic, partition))
            if head is None:  # field count: topic, partition, offset, timestamp, run_id
                head = self._heads[(topic, partition)] = binary_fields.row_head(
                    topic, partition, len(self.columns) + 5)
            to_tuple, ts = self._tuple, binary_fields.kafka_millis

            def general(value: bytes, start: int) -> bytes:
                return to_tuple(general_text(value, start))

        if writer is not None and writer[3] is not None:
            return writer[3](records, head, self.tail, header, shared, read,
                             writer[0], general, ts, rejected, refuse,
                             self._ones, *[c[2] for c in writer[2] or self.columns])
        at = [0]

        def fields(value: bytes) -> str | bytes:
            start = at[0]
            at[0] = start + len(value)
            return general(value, start)

        return decoded_rows(records, head, self.tail, fields, rejected, refuse, self.binary)

    def fields(self, value: bytes, read) -> str:
        """The declared columns' COPY text fields of one value; raises Refused."""
        doc, schema_id, schema = decode_wire(self.schemas, value, read, "value")
        first = value[:HEADER] not in self._known
        if first:
            raw, converters = raw_plan(schema, self.columns)
            fast = None if raw is None else [
                c if convert is None else (*c[:2], convert, *c[3:])
                for c, convert in zip(self.columns, converters, strict=True)]
            record = type(schema) is dict and schema.get("type") == "record"
            loop = (batch_encoder(fast or self.columns, raw or schema, self.binary) if record
                    else None)
            own = record and reads_values(fast or self.columns, raw or schema)
            self._known[value[:HEADER]] = (raw or schema, schema_id, fast, loop, own)
            if loop is not None:  # for its values in batches of another first writer
                self._ones[value[:HEADER]] = partial(
                    record_encoder(fast or self.columns, raw or schema, self.binary),
                    *[c[2] for c in fast or self.columns])
        if type(doc) is not dict:
            raise Refused("not_a_record", f"writer schema id {schema_id} is an Avro "
                          f"{avro_kind(doc)}, not a record: nothing to project to columns")
        fast = self._known[value[:HEADER]][2]
        if first and fast is not None:
            # The text the writer's later records get (a raw decimal's is "625e-2", the
            # typed rule's "6.25": the same value), as general() writes it.
            fo = io.BytesIO(value)
            fo.seek(HEADER)
            try:
                return self.project(read(fo, self._known[value[:HEADER]][0], None),
                                    schema_id, fast)
            except Exception:  # noqa: BLE001 - the typed rules say why, below
                pass
        return self.project(doc, schema_id)

    def project(self, doc: dict, schema_id: int, columns: list | None = None) -> str:
        """A decoded record's declared columns (``columns``: self.columns, or theirs with
        raw converters) as COPY text fields; raises Refused."""
        out = []
        for key, path, convert, required, declared, name in columns or self.columns:
            if key is not None:
                x = doc.get(key)
            else:
                try:
                    x = paths.lookup(doc, path)
                except paths.NotAnObject as e:
                    raise Refused("wrong_type", f"field {paths.field(name, path)} (writer schema "
                                  f"id {schema_id}): '{paths.label(e.where)}' is an Avro "
                                  f"{avro_kind(e.value)}, not a record") from None
            if x is None:
                if required:
                    why = "is null" if paths.holds_key(doc, path) else ("is not in the writer "
                                                                         "schema")
                    raise Refused("missing_field", f"required field {paths.field(name, path)} "
                                  f"{why} (writer schema id {schema_id})")
                out.append(NULL)
                continue
            try:
                out.append(convert(x))
            except (WrongType, Unstorable) as e:
                raise unconvertible(e, name, path, schema_id, declared, avro_kind(x)) from None
        return "\t".join(out)

    def explain(self, m) -> tuple[str, str]:
        """Only a null value is rejected (and not a tombstone this sink deletes by)."""
        return "null_value", "value is null (tombstone)"


_ADDRESS = re.compile(r" object at 0x[0-9a-fA-F]+")


def decode_wire(schemas: SchemaSource, value: bytes, read, what: str):
    """(decoded, writer schema id, parsed writer schema) of a Confluent wire format
    ``value`` (``what``: "value" or "key", for the messages); raises Refused."""
    if len(value) < HEADER:
        if value[:1] not in (b"", bytes([MAGIC])):
            raise _bad_magic(value)
        raise Refused("corrupt_avro", f"{what} is {len(value)} bytes, shorter than the "
                      "Confluent wire format's 5-byte header (magic byte, schema id)")
    if value[0] != MAGIC:
        raise _bad_magic(value)
    schema_id = int.from_bytes(value[1:HEADER], "big")
    try:
        schema = writer_schema(schemas, schema_id)
    except UnknownSchema as e:
        raise Refused(e.error_type, e.message) from None
    fo = io.BytesIO(value)
    fo.seek(HEADER)
    try:
        doc = read(fo, schema, None)
    except Exception as e:  # noqa: BLE001 - truncated or corrupt: the record's
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        # fastavro names its stream with its address: the same record, the same reason.
        why = _ADDRESS.sub(" object", why)
        raise Refused("corrupt_avro", f"{what} does not decode with writer schema id "
                      f"{schema_id} ({why}): truncated or corrupt") from None
    left = len(value) - fo.tell()
    if left:
        raise Refused("corrupt_avro", f"{left} bytes left after decoding the {what} with "
                      f"writer schema id {schema_id}: corrupt, or another schema's")
    return doc, schema_id, schema


def _bad_magic(value: bytes) -> Refused:
    return Refused("bad_magic_byte", f"first byte is 0x{value[0]:02x}, not the Confluent wire "
                   "format's magic byte 0x00: not written by a Confluent Avro serializer")
