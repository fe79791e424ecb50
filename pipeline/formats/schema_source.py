"""Writer schemas by the id in the Confluent wire format's header, for the formats that
decode by one (avro, protobuf): fetched once per id and kept for the life of the process
(an executor's Python worker, or the driver replaying dead letters), from a Schema
Registry (confluent-kafka's SchemaRegistryClient, which speaks the Confluent API:
``GET /schemas/ids/{id}``) or from a folder of ``<id>.<suffix>`` files (the air-gapped
option). Each format brings its schema kind, file suffix and parser.

What goes wrong is told apart by who can fix it: an id the source does not know is the
record's problem (UnknownSchema: a dead letter, replayable once the schema is there); a
registry that cannot be reached is transient (a TaskError the driver turns into exit 75,
nothing committed); a registry that refuses our login, or a schema that does not parse, is
the operator's (a TaskError of kind config: exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.errors import Kind, TaskError


@dataclass(frozen=True)
class SchemaSource:
    """``[schema_registry]``: ``url`` (+ basic auth, a CA file) or ``schemas_dir``."""

    url: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    schemas_dir: str | None = None
    timeout_seconds: float = 10.0

    def describe(self) -> str:
        if self.url is None:
            return f"schemas_dir {self.schemas_dir}"
        parts = urlsplit(self.url)  # a password written into the URL stays out of messages
        host = parts.netloc.rpartition("@")[2]
        return f"schema registry {parts.scheme}://{host}{parts.path}"


class UnknownSchema(LookupError):
    """The source has no schema of this id and kind: the record is a dead letter."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type
        self.message = message


class SchemaSourceError(TaskError):
    """The schema source failed as a whole: the run stops (transient or config)."""


@dataclass(frozen=True)
class SchemaKind:
    """What a format reads: the registry's schemaType ('AVRO', 'PROTOBUF'), the suffix of
    its files in a schemas_dir, the format's name (for messages) and its parser, which
    turns the schema text into what the format decodes with (raises SchemaSourceError).
    ``references``: the parser resolves schema references (the files a schema imports,
    registered under subjects of their own); it is then also given every schema the
    writer schema reaches, by the name it is referenced as."""

    registry_type: str
    suffix: str
    format: str
    parse: Callable[..., object] = field(compare=False)
    references: bool = False


# Process-wide: fetched once per (source, kind, id) by every task this worker runs. An
# unknown id is kept too, so that a topic full of one bad id costs one request, not one per
# record.
_SCHEMAS: dict[tuple[SchemaSource, str, int], object] = {}
_CLIENTS: dict[SchemaSource, object] = {}


def cached_schema(source: SchemaSource, kind: SchemaKind, schema_id: int):
    """The parsed writer schema of ``schema_id``; raises UnknownSchema or
    SchemaSourceError."""
    key = (source, kind.registry_type, schema_id)
    found = _SCHEMAS.get(key)
    if found is None:
        try:
            text, references = _fetch(source, kind, schema_id)
            found = (kind.parse(source, schema_id, text, references) if kind.references
                     else kind.parse(source, schema_id, text))
        except UnknownSchema as e:
            found = e
        _SCHEMAS[key] = found
    if isinstance(found, UnknownSchema):
        raise found
    return found


def _fetch(source: SchemaSource, kind: SchemaKind, schema_id: int
           ) -> tuple[str, dict[str, str]]:
    """The schema's text and, for a kind that resolves them, its references' texts."""
    if source.url is None:
        return _from_dir(source, kind, schema_id), {}
    return _from_registry(source, kind, schema_id)


def _from_dir(source: SchemaSource, kind: SchemaKind, schema_id: int) -> str:
    folder = Path(source.schemas_dir or "")
    name = f"{schema_id}{kind.suffix}"
    if not folder.is_dir():
        raise SchemaSourceError(Kind.CONFIG, f"[schema_registry] schemas_dir {folder} is not "
                                f"a folder this executor can read; put the <id>{kind.suffix} "
                                "files where every executor sees them, then rerun")
    try:
        return (folder / name).read_text()
    except FileNotFoundError:
        raise UnknownSchema("unknown_schema", f"schema id {schema_id} is not in {folder} (no "
                            f"{name}); add it and replay the dead letters") from None


def _client(source: SchemaSource):
    client = _CLIENTS.get(source)
    if client is None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf = {"url": source.url, "timeout": source.timeout_seconds, "max.retries": 2}
        if source.user is not None:
            conf["basic.auth.user.info"] = f"{source.user}:{source.password or ''}"
        if source.ssl_ca_location is not None:
            conf["ssl.ca.location"] = source.ssl_ca_location
        client = _CLIENTS[source] = SchemaRegistryClient(conf)
    return client


def _from_registry(source: SchemaSource, kind: SchemaKind, schema_id: int
                   ) -> tuple[str, dict[str, str]]:
    where = source.describe()
    what = f"schema id {schema_id}"
    schema = _registry_call(source, what, lambda c: c.get_schema(schema_id))
    got = (schema.schema_type or "AVRO").upper()
    if got != kind.registry_type:
        raise UnknownSchema(f"not_{kind.format}", f"schema id {schema_id} in {where} is a "
                            f"{got} schema, not {kind.registry_type.capitalize()}; this sink "
                            f"has format = '{kind.format}'")
    if schema.references and not kind.references:
        raise UnknownSchema("unknown_schema", f"schema id {schema_id} in {where} uses schema "
                            "references, which this pipeline does not resolve yet")
    references: dict[str, str] = {}
    todo = list(schema.references or ())
    while todo:  # every schema the writer schema reaches, each fetched once
        ref = todo.pop()
        if ref.name in references:
            continue
        found = _registry_call(source, f"{what}'s reference {ref.name!r} (subject "
                               f"{ref.subject} version {ref.version})",
                               lambda c, r=ref: c.get_version(r.subject, r.version))
        references[ref.name] = found.schema.schema_str
        todo += found.schema.references or ()
    return schema.schema_str, references


def _registry_call(source: SchemaSource, what: str, call: Callable):
    """``call(client)``, its failure told apart by who can fix it (the module docstring)."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    where = source.describe()
    try:
        return call(_client(source))
    except SchemaRegistryError as e:
        status = e.http_status_code
        if status == 404:
            raise UnknownSchema("unknown_schema", f"{where} has no {what} "
                                f"({e.error_message}); register it and replay the dead "
                                "letters") from None
        if status in (401, 403):
            raise SchemaSourceError(Kind.CONFIG, f"{where} refused fetching {what} "
                                    f"(HTTP {status}: {e.error_message}); check "
                                    "[schema_registry] user and password; nothing "
                                    "committed") from None
        raise SchemaSourceError(Kind.TRANSIENT, f"{where} failed fetching {what} "
                                f"(HTTP {status}: {e.error_message}); nothing "
                                "committed, rerun when the registry is healthy") from None
    except Exception as e:  # noqa: BLE001 - connection refused, DNS, TLS, timeout
        raise SchemaSourceError(Kind.TRANSIENT, f"{where} unreachable fetching {what} "
                                f"({type(e).__name__}: {e}); nothing committed, "
                                "rerun when the registry is reachable") from None
