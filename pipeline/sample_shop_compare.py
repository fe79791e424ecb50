"""A replica compared with its source, table by table, row by row, every column of the
source (a replica's extra columns are ignored). Values are compared by what they mean:
numerics exactly by value (1.50 = 1.5, a double by its shortest repr), timestamps as
instants (a naive one read as UTC), JSON as parsed, bytes as bytes.

``diff_table`` is pure; ``compare`` reads both databases (each table in one snapshot).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from uuid import UUID

FIRST = 5  # differences shown per table


def normal(v):
    """A value in a form that compares by meaning across column types."""
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | Decimal):
        return Decimal(v)
    if isinstance(v, float):
        return Decimal(repr(v))
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).astimezone(UTC)
    if isinstance(v, memoryview | bytearray):
        return bytes(v)
    if isinstance(v, UUID):
        return str(v)
    return v


def same(a, b) -> bool:
    a, b = normal(a), normal(b)
    if type(a) is type(b) or a is None or b is None:
        return a == b
    # One side kept as text what the other typed: a numeric, JSON, a timestamp.
    if isinstance(a, str):
        a, b = b, a
    if isinstance(b, str):
        try:
            if isinstance(a, Decimal):
                return a == Decimal(b)
            if isinstance(a, dict | list):
                return a == json.loads(b)
            if isinstance(a, datetime):
                return a == normal(datetime.fromisoformat(b))
        except (InvalidOperation, ValueError):
            return False
    return a == b


def shown(v) -> str:
    text = repr(normal(v)) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} chars)"


@dataclass
class TableDiff:
    table: str
    source_rows: int = 0
    replica_rows: int = 0
    missing: int = 0     # in the source, not in the replica
    extra: int = 0       # in the replica, not in the source
    differing: int = 0   # in both, some column different
    missing_columns: list[str] = field(default_factory=list)
    columns: dict[str, int] = field(default_factory=dict)  # column -> rows it differs in
    first: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.differing or self.missing_columns)

    def note(self, line: str) -> None:
        if len(self.first) < FIRST:
            self.first.append(line)


def diff_table(table: str, key: list[str], columns: list[str], source: dict[tuple, dict],
               replica: dict[tuple, dict], replica_columns: set[str]) -> TableDiff:
    """``source``/``replica``: rows by primary key (as tuples of normal() values)."""
    d = TableDiff(table, len(source), len(replica))
    d.missing_columns = [c for c in columns if c not in replica_columns]
    for c in d.missing_columns:
        d.note(f"column {c} is not in the replica")
    compared = [c for c in columns if c in replica_columns]
    for k in sorted(source.keys() | replica.keys(), key=repr):
        name = ", ".join(f"{c}={v}" for c, v in zip(key, k, strict=True))
        if k not in replica:
            d.missing += 1
            d.note(f"{table} ({name}): missing in the replica")
        elif k not in source:
            d.extra += 1
            d.note(f"{table} ({name}): in the replica only")
        else:
            cols = [c for c in compared if not same(source[k][c], replica[k][c])]
            if cols:
                d.differing += 1
                for c in cols:
                    d.columns[c] = d.columns.get(c, 0) + 1
                c = cols[0]
                more = f" (and {len(cols) - 1} more column(s))" if len(cols) > 1 else ""
                d.note(f"{table} ({name}): {c} source {shown(source[k][c])} != replica "
                       f"{shown(replica[k][c])}{more}")
    return d


def _columns(conn, schema: str, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
        "table_name = %s ORDER BY ordinal_position", (schema, table))]


def _primary_key(conn, schema: str, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY (i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
        "ORDER BY array_position(i.indkey, a.attnum)", (f'"{schema}"."{table}"',))]


def _rows(conn, schema: str, table: str, columns: list[str], key: list[str]) -> dict:
    from psycopg import sql

    q = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(schema),
        sql.Identifier(table))
    out = {}
    for r in conn.execute(q):
        row = dict(zip(columns, r, strict=True))
        out[tuple(normal(row[c]) for c in key)] = row
    return out


def compare(source_url: str, replica_url: str, replica_schema: str,
            source_schema: str = "public", tables: list[str] | None = None) -> list[TableDiff]:
    """Every table of the source schema (or ``tables``) against the replica's namesake."""
    import psycopg

    with psycopg.connect(source_url, autocommit=True) as src, \
            psycopg.connect(replica_url, autocommit=True) as dst:
        names = tables or [r[0] for r in src.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND "
            "table_type = 'BASE TABLE' ORDER BY table_name", (source_schema,))]
        out = []
        for t in names:
            with src.transaction(), dst.transaction():
                for c in (src, dst):
                    c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                columns, key = _columns(src, source_schema, t), _primary_key(src, source_schema, t)
                have = set(_columns(dst, replica_schema, t))
                source = _rows(src, source_schema, t, columns, key)
                if not have:
                    d = diff_table(t, key, columns, source, {}, set())
                    d.first.insert(0, f"table {replica_schema}.{t} is not in the replica")
                    del d.first[FIRST:]
                    out.append(d)
                    continue
                kept = [c for c in columns if c in have]
                replica = _rows(dst, replica_schema, t, kept, key) if set(key) <= have else {}
                out.append(diff_table(t, key, columns, source, replica, have))
        return out
