"""[schema_registry]: where the avro and protobuf formats' writer schemas come from, a
registry's url (basic auth via ${VAR}) or a folder of <id>.avsc / <id>.proto files."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr

from pipeline.errors import ConfigError
from pipeline.formats.schema_source import SchemaSource
from pipeline.settings.base import Table, expand_env
from pipeline.settings.secrets import mask


class SchemaRegistryTable(Table):
    url: str | None = None
    user: str | None = None
    password: SecretStr | None = None
    ssl_ca_location: str | None = None
    schemas_dir: str | None = None
    timeout_seconds: float = Field(10.0, gt=0)


def schema_source(table: SchemaRegistryTable | None, fmt: str,
                  env: dict[str, str]) -> SchemaSource | None:
    if fmt not in ("avro", "protobuf"):
        if table is not None:
            raise ConfigError("[schema_registry] is only for sink.format = 'avro' or "
                              "'protobuf'; remove it")
        return None
    r = table or SchemaRegistryTable()
    if (r.url is None) == (r.schemas_dir is None):
        raise ConfigError(f"sink.format = '{fmt}' needs exactly one of schema_registry.url (a "
                          "Confluent-API registry) or schema_registry.schemas_dir (a folder "
                          "of <id>.avsc or <id>.proto files) in [schema_registry]")
    if r.schemas_dir is not None:
        for key in ("user", "password", "ssl_ca_location"):
            if key in r.model_fields_set:
                raise ConfigError(f"'schema_registry.{key}' is for a registry url; "
                                  "schemas_dir reads files")
        path = Path(expand_env(r.schemas_dir, "schema_registry.schemas_dir", env)).resolve()
        if not path.is_dir():
            raise ConfigError(f"'schema_registry.schemas_dir' = {r.schemas_dir!r} is not a "
                              "folder; point it at the folder of <id>.avsc files")
        return SchemaSource(schemas_dir=str(path), timeout_seconds=r.timeout_seconds)
    url = expand_env(r.url, "schema_registry.url", env)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"'schema_registry.url' = {mask(url)!r}: write the "
                          "registry's URL as http(s)://host:port (Apicurio: "
                          ".../apis/ccompat/v7)")
    user = expand_env(r.user, "schema_registry.user", env) if r.user is not None else None
    password = (expand_env(r.password.get_secret_value(), "schema_registry.password", env)
                if r.password is not None else None)
    if password is not None and user is None:
        raise ConfigError("'schema_registry.password' needs schema_registry.user")
    return SchemaSource(url=url, user=user, password=password,
                        ssl_ca_location=r.ssl_ca_location, timeout_seconds=r.timeout_seconds)
