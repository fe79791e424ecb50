"""The one COPY ... FROM STDIN statement and binary framing (store/copy_in.py); COPYed
into real Postgres by test_arrow_binary, test_avro_binary, the publisher and replay."""

from psycopg import sql

from pipeline.formats.wire.binary import SIGNATURE, TRAILER
from pipeline.store.copy_in import copy_statement, framed


def test_statement_names_table_columns_and_wire():
    cols = sql.SQL(", ").join(map(sql.Identifier, ["a", "offset"]))
    assert copy_statement(sql.Identifier("s", "t"), cols).as_string(None) == \
        'COPY "s"."t" ("a", "offset") FROM STDIN'
    assert copy_statement(sql.Identifier("t"), None, binary=True).as_string(None) == \
        'COPY "t" FROM STDIN (FORMAT BINARY)'


def test_binary_rows_are_framed_by_signature_and_trailer_text_rows_are_not():
    assert list(framed([b"x", b"y"], binary=True)) == [SIGNATURE, b"x", b"y", TRAILER]
    assert list(framed(iter([b"x\n"]), binary=False)) == [b"x\n"]
    assert list(framed([], binary=True)) == [SIGNATURE, TRAILER]
