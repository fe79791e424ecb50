"""``COPY <table> FROM STDIN`` of rows already in a COPY wire (text lines, or binary tuples
without the stream's framing, as the formats make them): the one place that writes the
statement and, for binary, the stream's signature before the rows and trailer after them.
The publisher's COPY stays open across blobs taken as they arrive, so it uses the
statement and framing here without ``copy_in``."""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql

from pipeline.formats.wire import binary as copy_binary


def copy_statement(table: sql.Composable, columns: sql.Composable | None = None,
                   binary: bool = False) -> sql.Composed:
    """``COPY table [(columns)] FROM STDIN [(FORMAT BINARY)]``."""
    return sql.SQL("COPY {}{} FROM STDIN{}").format(
        table, sql.SQL("") if columns is None else sql.SQL(" ({})").format(columns),
        sql.SQL(" (FORMAT BINARY)" if binary else ""))


def framed(chunks: Iterable[bytes], binary: bool) -> Iterable[bytes]:
    """``chunks``, between the binary stream's signature and trailer when ``binary``."""
    if binary:
        yield copy_binary.SIGNATURE
    yield from chunks
    if binary:
        yield copy_binary.TRAILER


def copy_in(cur, table: sql.Composable, columns: sql.Composable | None,
            chunks: Iterable[bytes], binary: bool = False) -> None:
    """COPY ``chunks`` (text lines or bare binary tuples, any grouping) into ``table``
    on the cursor's connection, inside its transaction."""
    with cur.copy(copy_statement(table, columns, binary)) as cp:
        for chunk in framed(chunks, binary):
            cp.write(chunk)
