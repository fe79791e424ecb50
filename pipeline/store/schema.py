"""The pipeline's schema: ``init-db`` (the migrations, then the sinks' tables) and the checks
a run makes before it reads anything (every table there; the sinks' tables take the rows
this config writes). Each takes the sinks whose tables it concerns (pipeline/sinks/: the
caller builds them from the settings)."""

from __future__ import annotations

import importlib.resources
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Table, inspect
from sqlalchemy.exc import CompileError, ProgrammingError, SAWarning
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
                if unresolved(sink):
                    applied.append(f"none yet for {schema}.{sink.settings.table}: its columns "
                                   "come from the writer's schema (sink.columns = 'schema'), "
                                   "the first run that reads the topic creates it")
                    continue
                applied += self._create(sink)
        return applied

    def _create(self, sink: Sink) -> list[str]:
        """The sink's tables and their upgrades, in the open transaction."""
        schema = self.db.settings.schema
        made = []
        for table in sink.tables:
            self.db.session.execute(CreateTable(table, if_not_exists=True))
            made.append(f"{sink.mode} table {schema}.{table.name}")
        for statement in sink.upgrades():
            self.db.conn.execute(statement)
        return made

    def create_missing(self, sinks: Sequence[Sink]) -> list[str]:
        """sink.columns = 'schema': the tables of these (resolved) sinks that do not exist
        yet, made from the writer's schema before the run reads, in a short transaction of
        their own (CREATE TABLE IF NOT EXISTS: a concurrent run's are kept). Returns what it
        made."""
        names = [t.name for sink in sinks for t in sink.tables]
        live = self._reflect(names)
        missing = [sink for sink in sinks if any(t.name not in live for t in sink.tables)]
        if not missing:
            return []
        made: list[str] = []
        try:
            with self.db.transaction():
                for sink in missing:
                    made += self._create(sink)
        except ProgrammingError as e:
            if not isinstance(e.orig, psycopg.errors.InsufficientPrivilege):
                raise
            tables_ = ", ".join(sorted(t.name for sink in missing for t in sink.tables))
            raise ConfigError(
                f"the run must create {tables_} in schema {self.db.settings.schema} (their "
                f"columns come from the writer's schema: sink.columns = 'schema') and the "
                f"job's role may not ({str(e.orig).splitlines()[0]}): grant it CREATE on the "
                "schema; nothing was read") from None
        return made

    def live_table(self, name: str) -> LiveTable | None:
        """A table's columns as Postgres DDL spells their types, with their nullability, and
        its primary key; None when it does not exist."""
        live = self._reflect([name]).get(name)
        if live is None:
            return None
        with self.db.transaction():
            key = inspect(self.db.session).get_pk_constraint(
                name, schema=self.db.settings.schema).get("constrained_columns", [])
        return LiveTable(name, {c["name"]: (_type_name(c["type"]), c["nullable"])
                                for c in live}, tuple(key))

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
        # A table whose columns come from the writer's schema is the run's to make.
        sink_tables = [t for sink in sinks if not unresolved(sink) for t in sink.tables]
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
        # A table whose columns come from the writer's schema is checked once the run has
        # read them (driver/schema_probe.py).
        sinks = [sink for sink in sinks if not unresolved(sink)]
        names = [t.name for sink in sinks for t in sink.tables]
        if not names:
            return self.evolution.plan([])
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
            # sink.columns = 'schema': the columns are the writer's; only a new one is
            # sink.evolve's to add.
            other = " or change [sink.columns]"
            if sink.settings.columns_from_schema:
                other = (" or set sink.evolve = 'add_columns'" if all(
                    fix.startswith("ADD COLUMN") for _, fix in fixes) else
                    " as the table's owner (the source's schema changed)")
            raise ConfigError(
                f"results table {name} does not match [sink] of {settings.source}: "
                + "; ".join(why for why, _ in fixes) + f" - run 'ALTER TABLE {name} "
                + ", ".join(fix for _, fix in fixes) + f"'{other}; nothing was read")


@dataclass(frozen=True)
class LiveTable:
    """A table as it is: ``columns`` name -> (type as DDL spells it, nullable), in order."""

    name: str
    columns: dict[str, tuple[str, bool]]
    key: tuple[str, ...]


def unresolved(sink: Sink) -> bool:
    """A sink of sink.columns = 'schema' whose columns no run has read yet: its tables are
    not known."""
    return sink.settings.columns_from_schema and not sink.settings.columns


def _type_name(type_) -> str:
    """A reflected column type as Postgres DDL spells it (tables.ddl_type)."""
    try:
        return tables.ddl_type(type_)
    except CompileError:  # NullType: a type SQLAlchemy does not know
        return "a type unknown to the pipeline"
