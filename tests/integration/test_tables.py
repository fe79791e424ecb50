"""pipeline/store/tables.py against what `init-db` really creates: the sql/*.sql history and the
Table definitions cannot drift apart silently."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from sqlalchemy import inspect

from pipeline.sinks import for_settings
from pipeline.store import Store, tables
from tests.helpers import TEST_DB_URL, init_db, make_settings, unique


def drop_schema(schema: str) -> None:
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def described(table) -> dict:
    """A Table as the comparison sees it: columns in order with type, nullability and
    whether the server fills a default (a bigserial's sequence, too); the primary key."""
    return {"columns": [(c.name, tables.ddl_type(c.type), c.nullable,
                         c.server_default is not None or c is table.autoincrement_column)
                        for c in table.columns],
            "primary_key": [c.name for c in table.primary_key]}


def reflected(inspector, name: str, schema: str) -> dict:
    return {"columns": [(c["name"], tables.ddl_type(c["type"]), c["nullable"],
                         c["default"] is not None) for c in inspector.get_columns(name, schema)],
            "primary_key": inspector.get_pk_constraint(name, schema)["constrained_columns"]}


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["json", "raw"])
def test_init_db_creates_exactly_the_tables_of_pipeline_tables(stack, fmt):
    settings = make_settings(unique("tables"), ["t"], fmt=fmt)
    settings = replace(settings, schema=unique("schema"))
    init_db(settings)
    store = Store(settings)
    try:
        with store.transaction():
            inspector = inspect(store.session)
            declared = [*tables.metadata.tables.values(), for_settings(settings).results]
            assert sorted(inspector.get_table_names(settings.schema)) == sorted(
                t.name for t in declared)
            for table in declared:
                assert reflected(inspector, table.name, settings.schema) == described(table), \
                    table.name
            indexes = {i["name"]: i["column_names"] for i in
                       inspector.get_indexes(tables.runs.name, settings.schema)}
            assert indexes == {i.name: [c.name for c in i.columns] for i in tables.runs.indexes}
        store.schema.check([for_settings(settings)])
        store.schema.check_results_tables([for_settings(settings)])
    finally:
        store.close()
        drop_schema(settings.schema)


@pytest.mark.integration
def test_a_schema_missing_a_declared_column_asks_for_init_db(stack):
    """The schema check is derived from the Table definitions: a database older than one of
    them (here: offsets without topic IDs, as before sql/004) is exit 2 naming init-db."""
    settings = replace(make_settings(unique("tables"), ["t"]), schema=unique("schema"))
    init_db(settings)
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{settings.schema}".pipeline_offsets DROP COLUMN topic_id')
    store = Store(settings)
    try:
        with pytest.raises(Exception, match=r"older than this version \(no "
                           r"pipeline_offsets.topic_id\): run 'pipeline init-db"):
            store.schema.check([for_settings(settings)])
    finally:
        store.close()
        drop_schema(settings.schema)
