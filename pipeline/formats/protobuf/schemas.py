"""Protobuf writer schemas by the id in the Confluent wire format's header, compiled at
runtime into message classes. A schema (from the registry, or ``<id>.proto`` in a
schemas_dir; fetched and cached once per id per process by schema_source.py) comes in
either of the two forms the Confluent API allows, and so do its references (the files it
imports, registered under subjects of their own):

- ``.proto`` text: parsed by protoc itself, the copy bundled in grpcio-tools, run as
  ``python -m grpc_tools.protoc`` to a descriptor set (a subprocess, so that protoc's error
  text can be captured: it writes to the process's stderr; absl's log lines around it are
  dropped). One process start per schema id and executor;
- a base64 serialized ``FileDescriptorProto``: what confluent-kafka's ProtobufSerializer
  registers by default, and what a registry that keeps the form it was given (Apicurio)
  hands back. Decoded as it is, no protoc.

Imports of well-known files (google/protobuf/*.proto, and google/type/*, confluent/* where
their Python modules are installed) resolve without a reference, as the serializer skips
them. Each id gets its own DescriptorPool: two versions of one message name must not clash.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.errors import Kind
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
    return compile_protos({name: text}, name)


def compile_protos(files: dict[str, str], *roots: str, imports: bytes | None = None):
    """(FileDescriptorSet bytes of ``roots`` and everything they import, None), or (None,
    protoc's error, one line). ``files``: .proto texts by the name they are imported as;
    ``imports``: a FileDescriptorSet of files given as descriptors (protoc resolves imports
    from it too)."""
    import grpc_tools

    includes = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="pipeline-proto-") as tmp:
        for name, text in files.items():
            path = Path(tmp) / "src" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        out = Path(tmp) / "set.pb"
        given = []
        if imports is not None:
            (Path(tmp) / "in.pb").write_bytes(imports)
            given = [f"--descriptor_set_in={Path(tmp) / 'in.pb'}"]
        done = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{Path(tmp) / 'src'}",
             f"-I{includes}", *given, "--include_imports", f"--descriptor_set_out={out}",
             *roots], cwd=tmp, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).replace(f"{tmp}/src/", "")  # noise
            return None, protoc_error(said)
        return out.read_bytes(), None


# absl's log lines protoc writes beside its error: "WARNING: All log messages before
# absl::InitializeLog() ..." and glog-style "W0000 00:00:1795787442.411141 21932 parser.cc:659]".
_ABSL_PREAMBLE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is "
                            r"called are written to STDERR")
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w.-]+:\d+\] ")


def protoc_error(stderr: str) -> str:
    """protoc's error, one line: its own messages, without absl's log lines (a warning
    such as "No edition or syntax specified" is kept only when nothing else was said)."""
    lines = [line.strip() for line in _ABSL_PREAMBLE.sub("", stderr).splitlines()]
    own = [line for line in lines if line and not _ABSL_LINE.match(line)]
    logged = [_ABSL_LINE.sub("", line) for line in lines if _ABSL_LINE.match(line)]
    return " ".join(own or logged) or "protoc failed"


_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def serialized_descriptor(text: str):
    """The FileDescriptorProto a schema holds as base64 (the Confluent API's serialized
    form), or None when it is .proto text (which is never valid base64: it has spaces,
    quotes, braces or semicolons)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    compact = "".join(text.split())
    if not _BASE64.fullmatch(compact):
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(compact, validate=True))
    except (binascii.Error, DecodeError, ValueError):
        return None


def well_known(name: str):
    """A FileDescriptorProto of an import that needs no reference (google/protobuf/*, and
    google/type/*, confluent/* when their modules are installed), or None."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    module = name.removesuffix(".proto").replace("/", ".").replace("-", "_") + "_pb2"
    for candidate in (module, f"confluent_kafka.schema_registry.{module}"):
        try:
            importlib.import_module(candidate)
            break
        except ImportError:
            continue
    try:
        found = descriptor_pool.Default().FindFileByName(name)
    except KeyError:
        return None
    proto = descriptor_pb2.FileDescriptorProto()
    found.CopyToProto(proto)
    return proto


def _parse(source: SchemaSource, schema_id: int, text: str,
           references: dict[str, str] | None = None) -> ProtoSchema:
    """The writer schema ``text`` and its ``references`` (import name -> schema, every
    one the schema reaches), each .proto text or a serialized descriptor."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    name = f"schema_{schema_id}.proto"
    what = f"{source.describe()}: writer schema id {schema_id}"
    given = serialized_descriptor(text)
    root = given.name if given is not None and given.name else name
    protos: dict[str, object] = {}
    texts: dict[str, str] = {}
    for file, body in [(root, text), *(references or {}).items()]:
        proto = given if file == root else serialized_descriptor(body)
        if proto is None:
            texts[file] = body
        else:
            proto.name = file  # imported by its reference's name
            protos[file] = proto
    if texts:
        known = descriptor_pb2.FileDescriptorSet(file=list(protos.values()))
        data, error = compile_protos(texts, *texts,
                                     imports=known.SerializeToString() if protos else None)
        if data is None:
            raise SchemaSourceError(Kind.CONFIG, f"{what} is not a valid .proto ({error}); "
                                    "fix the schema, then rerun")
        for f in descriptor_pb2.FileDescriptorSet.FromString(data).file:
            protos.setdefault(f.name, f)
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: str, via: str) -> None:
        if file in added:
            return
        proto = protos.get(file) or well_known(file)
        if proto is None:
            raise SchemaSourceError(Kind.CONFIG, f"{what} imports {file!r} ({via}), which is "
                                    "neither among its schema references nor a well-known "
                                    "file; register the schema with its references, then "
                                    "rerun")
        added.add(file)
        for dependency in proto.dependency:  # dependencies first
            add(dependency, f"from {file}")
        try:
            pool.Add(proto)
        except (TypeError, ValueError) as e:  # a descriptor that does not build
            raise SchemaSourceError(Kind.CONFIG, f"{what} is not a valid protobuf descriptor "
                                    f"({file}: {e}); fix the schema, then rerun") from None

    add(root, "the schema itself")
    return ProtoSchema(pool, protos[root])


PROTOBUF = SchemaKind("PROTOBUF", ".proto", "protobuf", _parse, references=True)


def writer_schema(source: SchemaSource, schema_id: int) -> ProtoSchema:
    """The compiled writer schema of ``schema_id``; raises UnknownSchema or
    SchemaSourceError."""
    return cached_schema(source, PROTOBUF, schema_id)


__all__ = ["ProtoSchema", "UnknownMessage", "UnknownSchema", "writer_schema"]
