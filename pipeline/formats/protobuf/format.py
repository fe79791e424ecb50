"""The Protobuf record format: a value in the Confluent wire format (magic byte 0, a
4-byte schema id, the message indexes: protobuf/header.py) decoded with the message class
its writer schema compiles to (protobuf/schemas.py), then projected to the declared columns
by field name, by protobuf/values.py's rules; its rows are COPY text lines, like Avro's.

Projection by name, as for Avro: a field the writer added is ignored, a declared column the
writer's message lacks is null (or, if the column is ``not null``, a dead letter naming the
field and schema id). Every bad record is refused here with its reason: no second pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipeline.formats import paths
from pipeline.formats.json.values import WrongType
from pipeline.formats.protobuf.header import header
from pipeline.formats.protobuf.schemas import UnknownMessage, UnknownSchema, writer_schema
from pipeline.formats.protobuf.values import NotAMessage, kind, path_getter
from pipeline.formats.refused import Refused, decoded_rows, unconvertible
from pipeline.formats.schema_source import SchemaSource
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import NULL, TEXT, Unstorable


class ProtobufFormat:
    """``columns``: the declared (name, type, required[, path]) columns, in table order;
    ``schemas``: where writer schemas come from (config's [schema_registry])."""
    wire = TEXT

    def __init__(self, columns: Sequence[Sequence], run_id: int,
                 schemas: SchemaSource | None = None):
        if schemas is None:
            raise ValueError("the protobuf format needs a schema source ([schema_registry])")
        self.columns = [(n, column_type(t).from_avro, r, t, p)
                        for n, t, r, p in paths.columns(columns)]
        self.schemas = schemas
        self.tail = f"\t{run_id}\n"
        # (schema id, indexes) -> (message class, per column: (getter, field) or None)
        self._plans: dict[tuple[int, tuple[int, ...]], tuple] = {}

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[str]:
        return decoded_rows(records, head, self.tail, self.fields, rejected, refuse)

    def _plan(self, schema_id: int, indexes: tuple[int, ...]) -> tuple:
        plan = self._plans.get((schema_id, indexes))
        if plan is None:
            try:
                cls = writer_schema(self.schemas, schema_id).message(indexes)
            except UnknownSchema as e:
                raise Refused(e.error_type, e.message) from None
            except UnknownMessage as e:
                raise Refused("unknown_message", f"{e} (writer schema id {schema_id})") \
                    from None
            getters = [self._getter(cls, schema_id, name, path)
                       for name, _, _, _, path in self.columns]
            plan = self._plans[(schema_id, indexes)] = (cls, getters)
        return plan

    @staticmethod
    def _getter(cls, schema_id: int, name: str, path: tuple[str, ...]):
        """(getter, field) of a column in the writer's message, None if it has no such
        path, or the Refused of a path through a field that is not a message."""
        try:
            return path_getter(cls.DESCRIPTOR, path)
        except NotAMessage as e:
            return Refused("wrong_type", f"field {paths.field(name, path)} (writer schema id "
                           f"{schema_id}): '{paths.label(e.where)}' is a {kind(e.field)}, "
                           "not a message")

    def fields(self, value: bytes) -> str:
        """The declared columns' COPY text fields of one value; raises Refused."""
        schema_id, indexes, start = header(value)
        cls, getters = self._plan(schema_id, indexes)
        try:
            msg = cls.FromString(value[start:])
        except Exception as e:  # noqa: BLE001 - DecodeError and kin: the record's
            what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise Refused("corrupt_protobuf", f"value does not decode as "
                          f"{cls.DESCRIPTOR.full_name} of writer schema id {schema_id} "
                          f"({what}): truncated or corrupt") from None
        out = []
        for (name, convert, required, declared, path), got in zip(self.columns, getters,
                                                                   strict=True):
            if type(got) is Refused:
                raise got
            try:
                x = None if got is None else got[0](msg)
                if x is None:
                    if required:
                        why = "is not in the writer schema" if got is None else "is not set"
                        raise Refused("missing_field", f"required field "
                                      f"{paths.field(name, path)} {why} (writer schema id "
                                      f"{schema_id}, {cls.DESCRIPTOR.full_name})")
                    out.append(NULL)
                    continue
                out.append(convert(x))
            except (WrongType, Unstorable) as e:  # from convert: ``got`` is a field
                raise unconvertible(e, name, path, schema_id, declared, kind(got[1])) from None
        return "\t".join(out)

    def explain(self, m) -> tuple[str, str]:
        """Only a null value is rejected (and not a tombstone this sink deletes by)."""
        return "null_value", "value is null (tombstone)"
