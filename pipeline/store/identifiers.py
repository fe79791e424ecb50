"""psycopg SQL pieces built the same way everywhere (store, sinks, publish)."""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql


def identifiers(names: Iterable[str]) -> sql.Composed:
    """``"a", "b", "c"``: a column list."""
    return sql.SQL(", ").join(map(sql.Identifier, names))


def qualified(schema: str, name: str) -> sql.Identifier:
    """``"schema"."name"``."""
    return sql.Identifier(schema, name)
