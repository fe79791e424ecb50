"""Protobuf writer schemas by the id in the Confluent wire format's header: the ``.proto``
text (from the registry, or ``<id>.proto`` in a schemas_dir; fetched and cached once per id
per process by schema_source.py) compiled at runtime into message classes.

The registry hands out the schema as .proto text (Apicurio ignores the Confluent API's
``format=serialized``), so it has to be parsed here: by protoc itself, the copy bundled in
grpcio-tools, run as ``python -m grpc_tools.protoc`` to a descriptor set (a subprocess, so
that protoc's error text can be captured: it writes to the process's stderr). It costs one
process start per schema id and executor. Well-known imports (google/protobuf/*.proto)
resolve from the includes grpcio-tools ships. Each id gets its own DescriptorPool: two
versions of one message name must not clash.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.executor.task_errors import Kind
from pipeline.formats.schema_source import (
    SchemaKind,
    SchemaSource,
    SchemaSourceError,
    UnknownSchema,
    cached_schema,
)


class UnknownMessage(LookupError):
    """The record's message indexes name no message of its writer schema."""


class ProtoSchema:
    """One writer schema: its file's descriptor and the message classes by index path."""

    def __init__(self, pool, file_proto):
        self.pool = pool
        self.file = file_proto
        self._classes: dict[tuple[int, ...], type] = {}

    def message(self, indexes: tuple[int, ...]):
        """The message class at ``indexes`` (Confluent's path: the top-level message's
        index in the file, then nested messages' indexes); raises UnknownMessage."""
        cls = self._classes.get(indexes)
        if cls is None:
            from google.protobuf.message_factory import GetMessageClass

            names, types = [], self.file.message_type
            for i in indexes:
                if not 0 <= i < len(types):
                    raise UnknownMessage(f"message indexes {list(indexes)} name no message "
                                         f"of {self.file.name}")
                names.append(types[i].name)
                types = types[i].nested_type
            full = ".".join(([self.file.package] if self.file.package else []) + names)
            cls = self._classes[indexes] = GetMessageClass(
                self.pool.FindMessageTypeByName(full))
        return cls


def compile_proto(text: str, name: str = "schema.proto"):
    """(FileDescriptorSet bytes, None) of a .proto text, or (None, protoc's error)."""
    import grpc_tools

    includes = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="pipeline-proto-") as tmp:
        (Path(tmp) / name).write_text(text)
        out = Path(tmp) / "set.pb"
        done = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{includes}",
             "--include_imports", f"--descriptor_set_out={out}", name],
            cwd=tmp, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).replace(f"{tmp}/", "")  # our temp dir: noise
            return None, " ".join(said.split()) or "protoc failed"
        return out.read_bytes(), None


def _parse(source: SchemaSource, schema_id: int, text: str) -> ProtoSchema:
    from google.protobuf import descriptor_pb2, descriptor_pool

    name = f"schema_{schema_id}.proto"
    data, error = compile_proto(text, name)
    if data is None:
        raise SchemaSourceError(Kind.CONFIG, f"{source.describe()}: writer schema id "
                                f"{schema_id} is not a valid .proto ({error}); fix the "
                                "schema, then rerun")
    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    pool = descriptor_pool.DescriptorPool()
    for f in files:  # dependencies first: protoc writes them in that order
        pool.Add(f)
    return ProtoSchema(pool, next(f for f in files if f.name == name))


PROTOBUF = SchemaKind("PROTOBUF", ".proto", "protobuf", _parse)


def writer_schema(source: SchemaSource, schema_id: int) -> ProtoSchema:
    """The compiled writer schema of ``schema_id``; raises UnknownSchema or
    SchemaSourceError."""
    return cached_schema(source, PROTOBUF, schema_id)


__all__ = ["ProtoSchema", "UnknownMessage", "UnknownSchema", "writer_schema"]
