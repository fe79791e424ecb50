"""[database]: where results, offsets and runs are written, and how long a publish waits."""

from __future__ import annotations

from pydantic import Field, SecretStr
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from pipeline.errors import ConfigError
from pipeline.settings.base import Identifier, Table, expand_env


class DatabaseTable(Table):
    # A secret: it may hold the password (or ${VAR} of one), never shown (pydantic's repr).
    url: SecretStr
    schema_: Identifier = Field("public", alias="schema")
    # The publishing transaction's waits (0 = none): for a lock another session holds on
    # our tables (a DBA's ALTER or VACUUM FULL), and for any one statement - note the COPY
    # that streams results lasts as long as Spark's read.
    lock_timeout_seconds: float = Field(60.0, ge=0, description="0 = no limit")
    statement_timeout_seconds: float = Field(0.0, ge=0, description="0 = no limit")

    def database_url(self, env: dict[str, str]) -> str:
        # ${VAR} as in the client tables: the password (percent-encoded) stays out of the file.
        url = expand_env(self.url.get_secret_value(), "database.url", env)
        if not url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                "'database.url' must be a postgresql:// URL (or set PIPELINE__DATABASE__URL)")
        try:
            make_url(url)
        except (ArgumentError, ValueError):  # ValueError: a port that is not a number
            raise ConfigError("'database.url' is not a valid URL: write "
                              "postgresql://user:password@host:port/database") from None
        return url
