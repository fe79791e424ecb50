"""The pipeline's schema: ``init-db`` (the migrations, then the sinks' tables) and the checks
a run makes before it reads anything (every table there; the sinks' tables take the rows
this config writes). Each takes the sinks whose tables it concerns (pipeline/sinks/: the
caller builds them from the settings)."""

from __future__ import annotations

import importlib.resources
import logging
import warnings
from collections.abc import Sequence
from typing import Any

from psycopg import sql
from sqlalchemy import Table, inspect
from sqlalchemy.exc import CompileError, SAWarning
from sqlalchemy.schema import CreateTable

from pipeline.errors import ConfigError
from pipeline.store import tables
from pipeline.store.evolve import Addition, Evolution, additions
from pipeline.store.locks import LOCK_CLASS
from pipeline.store.results import Sink
from pipeline.store.session import Session
from pipeline.store.tables import offsets

log = logging.getLogger("pipeline")

# The migrations ship inside the package (pipeline/sql links to the repository's sql/), so a
# wheel installed anywhere applies them; in a checkout the link leads to the same files.
SQL_DIR = importlib.resources.files("pipeline") / "sql"


def migrations() -> list:
    """The schema scripts in the order they apply (sql/NNN_*.sql)."""
    return sorted((p for p in SQL_DIR.iterdir() if p.name.endswith(".sql")),
                  key=lambda p: p.name)


class Schema:
    """The schema of the Store's session (``store.schema``)."""

    def __init__(self, db: Session, evolution: Evolution):
        self.db, self.evolution = db, evolution

    def init_db(self, sinks: Sequence[Sink]) -> list[str]:
        """The migrations, then the tables of ``sinks``; what was applied."""
        db, schema = self.db, self.db.settings.schema
        applied = []
        with db.transaction() as conn:
            # Serialize concurrent init-db calls; IF NOT EXISTS alone races.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_CLASS,))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(schema)))
            for path in migrations():  # scripts: psycopg runs them whole
                conn.execute(path.read_text().replace("{schema}", f'"{schema}"'))
                applied.append(path.name)
            for sink in sinks:
                for table in sink.tables:
                    db.session.execute(CreateTable(table, if_not_exists=True))
                    applied.append(f"{sink.mode} table {schema}.{table.name}")
                for statement in sink.upgrades():
                    conn.execute(statement)
        return applied

    def create_missing(self, sinks: Sequence[Sink]) -> list[str]:
        """The tables of ``sinks`` that are not there yet, created (as init-db would) in a
        short transaction of their own; their names. A pipeline that reads a pattern of
        topics meets new tables as new topics appear (docs/operations.md)."""
        db, schema = self.db, self.db.settings.schema
        wanted = [t for sink in sinks for t in sink.tables]
        missing = [t for t in wanted if t.name in self.missing_tables(sinks)]
        if not missing:
            return []
        with db.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_CLASS,))  # as init-db
            for table in missing:
                db.session.execute(CreateTable(table, if_not_exists=True))
        names = [f"{schema}.{t.name}" for t in missing]
        log.info("created tables %s for topics new to the pipeline", ", ".join(names),
                 extra={"event": "tables.created", "tables": names})
        return names

    def missing_tables(self, sinks: Sequence[Sink]) -> list[str]:
        """The names of the ``sinks``' tables that are not there."""
        wanted = [t.name for sink in sinks for t in sink.tables]
        live = self._reflect(wanted)
        return [name for name in wanted if name not in live]

    def _reflect(self, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The live columns of the tables ``names`` that exist (one catalog query). It takes
        a share lock on each table (pg_get_expr of the defaults): a lock held elsewhere (a
        DBA's ALTER) is waited for as long as the publishing transaction would wait."""
        db = self.db
        with db.transaction() as conn, warnings.catch_warnings():
            db.set_timeouts(conn)
            # A column of a type SQLAlchemy does not know (an extension's) is reflected as
            # NullType with a warning; only its nullability and default are looked at.
            warnings.simplefilter("ignore", SAWarning)
            found = inspect(db.session).get_multi_columns(
                schema=db.settings.schema, filter_names=list(names))
        return {name: columns for (_, name), columns in found.items()}

    def check(self, sinks: Sequence[Sink]) -> None:
        """Every table of pipeline/store/tables.py is there, with every column it declares,
        and every table of ``sinks``."""
        settings = self.db.settings
        fixed = list(tables.metadata.tables.values())
        sink_tables = [t for sink in sinks for t in sink.tables]
        live = self._reflect([t.name for t in fixed + sink_tables])
        if offsets.name not in live or any(t.name not in live for t in sink_tables):
            raise ConfigError(f"tables missing in schema {settings.schema}: run "
                              f"'pipeline init-db --config {settings.source}' first")
        missing = [t.name for t in fixed if t.name not in live] + [
            f"{t.name}.{c.name}" for t in fixed if t.name in live for c in t.columns
            if c.name not in {col["name"] for col in live[t.name]}]
        if missing:
            raise ConfigError(f"schema {settings.schema} is older than this version (no "
                              f"{', '.join(missing)}): run 'pipeline init-db --config "
                              f"{settings.source}' to upgrade it (keeps all data)")

    def check_results_tables(self, sinks: Sequence[Sink]) -> tuple[Addition, ...]:
        """The sinks' tables must take the rows this config writes: compared before anything
        is read, so that drift is one clear error, not a COPY that fails after the whole
        read on every run. Extra columns are fine if they may stay NULL or have a default;
        the key must be the mode's (ON CONFLICT needs it). With sink.evolve =
        'add_columns', a declared column a table lacks is no error: it is planned, and
        added by the run before it reads (evolve.py). Returns the planned additions."""
        db, schema = self.db, self.db.settings.schema
        names = [t.name for sink in sinks for t in sink.tables]
        live = self._reflect(names)
        with db.transaction():
            keys = inspect(db.session).get_multi_pk_constraint(schema=schema,
                                                               filter_names=names)
        planned = []
        for sink in sinks:
            for table in sink.tables:
                have = {c["name"]: c for c in live.get(table.name, [])}
                key = keys.get((schema, table.name), {}).get("constrained_columns", [])
                added = additions(table, have, sink.settings)
                self._check_table(sink, table, have, key, {a.column for a in added})
                planned += added
        return self.evolution.plan(planned)

    def _check_table(self, sink: Sink, table: Table, have: dict[str, dict], key: list[str],
                     added: set[str]) -> None:
        settings = self.db.settings
        name = f'"{settings.schema}"."{table.name}"'
        want_key = [c.name for c in table.primary_key]
        if have and key != want_key:
            raise ConfigError(
                f"table {name} is keyed by ({', '.join(key) or 'nothing'}), sink.mode = "
                f"'{sink.mode}' of {settings.source} needs the key "
                f"({', '.join(want_key)}): point sink.table at a new table and run 'pipeline "
                "init-db', or rebuild this one by hand; nothing was read")
        want = tables.written(table)
        older = [c.name for c in want if c.info.get("upgrade") and c.name not in have]
        if have and older:
            raise ConfigError(
                f"table {name} was made by an older version of the pipeline (no "
                f"{', '.join(older)}): run 'pipeline init-db --config {settings.source}' "
                "to upgrade it (keeps all data); nothing was read")
        fixes = []
        for column in want:
            cname, pg_type = column.name, tables.ddl_type(column.type)
            col = sql.Identifier(cname).as_string(self.db.conn)
            if cname in added:
                continue  # sink.evolve adds it
            if cname not in have:
                fixes.append((f"column {cname} is missing", f"ADD COLUMN {col} {pg_type}"))
            elif _type_name(have[cname]["type"]) != pg_type:
                fixes.append((f"column {cname} is {_type_name(have[cname]['type'])}, the "
                              f"config writes {pg_type}", f"ALTER COLUMN {col} TYPE {pg_type}"))
            elif not have[cname]["nullable"] and column.nullable:
                fixes.append((f"column {cname} is NOT NULL, the config allows nulls",
                              f"ALTER COLUMN {col} DROP NOT NULL"))
        written = {c.name for c in want}
        for cname, c in have.items():
            if not c["nullable"] and c["default"] is None and cname not in written:
                fixes.append((f"column {cname} is NOT NULL without a default and the pipeline "
                              "does not write it",
                              f"ALTER COLUMN {sql.Identifier(cname).as_string(self.db.conn)} "
                              "DROP NOT NULL"))
        if fixes:
            raise ConfigError(
                f"results table {name} does not match [sink] of {settings.source}: "
                + "; ".join(why for why, _ in fixes) + f" - run 'ALTER TABLE {name} "
                + ", ".join(fix for _, fix in fixes) + "' or change [sink.columns]; "
                "nothing was read")


def _type_name(type_) -> str:
    """A reflected column type as Postgres DDL spells it (tables.ddl_type)."""
    try:
        return tables.ddl_type(type_)
    except CompileError:  # NullType: a type SQLAlchemy does not know
        return "a type unknown to the pipeline"
