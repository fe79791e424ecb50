"""What ``pipeline verify`` of an upsert or aggregate sink (and ``verify --values`` of an
append sink) runs in Postgres: the records
re-read from Kafka go into a temporary table (record_batch, as a run stages them), the
state they make is computed there (the newest record per key, tombstones deleting; the
totals per group), and compared with the results table both ways in SQL, so that memory
does not grow with the keys. Temporary tables only: the pipeline's tables are only read."""

from __future__ import annotations

from psycopg import sql
from sqlalchemy.schema import CreateTable

from pipeline.store import tables
from pipeline.store.copy_in import copy_in
from pipeline.store.identifiers import identifiers
from pipeline.store.session import Session

ROWS, STATE = "_verify_rows", "_verify_state"
SHOWN = 10  # differing keys named per direction


class StateVerification(Session):
    def state_scratch(self) -> None:
        """In the open transaction: the temp table the re-read records go into."""
        self.run(CreateTable(tables.record_batch(self.sink.settings, ROWS)))

    def copy_records(self, rows, tombstones, binary: bool) -> None:
        """One batch's encoded rows (the format's COPY wire) and tombstones (COPY text)."""
        conn = self.conn
        cols = identifiers(c.name for c in tables.written(self.records))
        with conn.cursor() as cur:
            if rows:
                copy_in(cur, sql.Identifier(ROWS), cols, rows, binary)
            if tombstones:
                copy_in(cur, sql.Identifier(ROWS),
                        identifiers(tables.tombstone_columns(self.sink.settings)), tombstones)

    def recompute_state(self) -> list[str]:
        """The state the results table should hold, made from the re-read records by the
        sink's own rule (Sink.state_sql) into a temp table; returns the columns compared."""
        for statement in self.sink.state_sql(sql.Identifier(ROWS), sql.Identifier(STATE)):
            self.conn.execute(statement)
        return self.sink.state_columns()

    def _different(self, columns: list[str], inexact: set[str]) -> sql.Composable:
        """The predicate 'row s and row t differ' (NULLs equal; inexact columns within a
        relative 1e-9)."""
        tests = []
        for c in columns:
            s_c, t_c = sql.SQL("s.{}").format(sql.Identifier(c)), \
                sql.SQL("t.{}").format(sql.Identifier(c))
            if c in inexact:
                tests.append(sql.SQL(
                    "({s} IS DISTINCT FROM {t} AND NOT coalesce(abs({s} - {t}) <= 1e-9 * "
                    "greatest(abs({s}), abs({t})), false))").format(s=s_c, t=t_c))
            else:
                tests.append(sql.SQL("{s} IS DISTINCT FROM {t}").format(s=s_c, t=t_c))
        return sql.SQL(" OR ").join(tests)

    def _joined_differences(self, columns: list[str], inexact: set[str]) -> dict:
        """State and table joined on the key: a key on one side only, or with a value that
        differs (inexact columns within a relative 1e-9), counts on both sides as EXCEPT ALL
        would count it."""
        key = self.sink.state_key()
        on = sql.SQL(" AND ").join(sql.SQL("s.{k} = t.{k}").format(k=sql.Identifier(k))
                                   for k in key)
        joined = sql.SQL(
            "SELECT {sk}, {tk}, s.{k0} IS NULL AS no_s, t.{k0} IS NULL AS no_t, ({diff}) "
            "AS differs FROM {state} s FULL JOIN {table} t ON {on}").format(
                sk=sql.SQL(", ").join(sql.SQL("s.{} AS {}").format(
                    sql.Identifier(k), sql.Identifier(f"s_{k}")) for k in key),
                tk=sql.SQL(", ").join(sql.SQL("t.{} AS {}").format(
                    sql.Identifier(k), sql.Identifier(f"t_{k}")) for k in key),
                k0=sql.Identifier(key[0]),
                diff=self._different(columns, inexact),
                state=sql.Identifier(STATE), table=self.t(self.results.name), on=on)
        out = {}
        for name, side, when in (("missing", "s", "no_t OR (NOT no_s AND differs)"),
                                 ("unexpected", "t", "no_s OR (NOT no_t AND differs)")):
            keys = sql.SQL(", ").join(sql.Identifier(f"{side}_{k}") for k in key)
            out[name] = self.conn.execute(sql.SQL("SELECT count(*) FROM ({j}) j WHERE {w}")
                                          .format(j=joined, w=sql.SQL(when))).fetchone()[0]
            first = self.conn.execute(sql.SQL(
                "SELECT {keys} FROM ({j}) j WHERE {w} ORDER BY {keys} LIMIT {n}").format(
                    keys=keys, j=joined, w=sql.SQL(when), n=sql.Literal(SHOWN))).fetchall()
            out[f"{name}_keys"] = [list(map(str, k)) for k in first]
        return out

    def state_differences(self, columns: list[str]) -> dict:
        """Rows the state holds that the table does not (``missing``: a key gone or a
        value changed) and rows the table holds that the state does not (``unexpected``),
        counted, with the first keys of each."""
        key = identifiers(self.sink.state_key())
        cols = identifiers(columns)
        table: sql.Composable = self.t(self.results.name)
        if not self.sink.state_is_whole_table:
            # Only the rows of the records re-read (a window of the table): rows no record
            # accounts for are the offset check's to find (driver/verify.py).
            table = sql.SQL("(SELECT * FROM {t} WHERE (topic, \"partition\", \"offset\") IN "
                            "(SELECT topic, \"partition\", \"offset\" FROM {s})) w").format(
                                t=table, s=sql.Identifier(STATE))
        if inexact := self.sink.state_inexact():
            out = self._joined_differences(columns, inexact)
        else:
            out = self._rows_differences(cols, key, table)
        out["state_rows"] = self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(STATE))).fetchone()[0]
        out["table_rows"] = self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            table)).fetchone()[0]
        return out

    def _rows_differences(self, cols: sql.Composable, key: sql.Composable,
                          table: sql.Composable) -> dict:
        """Rows on one side only, both ways (EXCEPT ALL: NULLs equal, duplicates count)."""
        out = {}
        for name, a, b in (("missing", sql.Identifier(STATE), table),
                           ("unexpected", table, sql.Identifier(STATE))):
            diff = sql.SQL("(SELECT {cols} FROM {a} EXCEPT ALL SELECT {cols} FROM {b})").format(
                cols=cols, a=a, b=b)
            count = self.conn.execute(sql.SQL("SELECT count(*) FROM {} d").format(diff)
                                      ).fetchone()[0]
            first = self.conn.execute(sql.SQL("SELECT {key} FROM {} d ORDER BY {key} LIMIT {n}")
                                      .format(diff, key=key, n=sql.Literal(SHOWN))).fetchall()
            out[name] = count
            out[f"{name}_keys"] = [list(map(str, k)) for k in first]
        return out
