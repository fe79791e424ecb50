"""What ``pipeline verify`` of an upsert or aggregate sink (and ``verify --values`` of an
append sink) runs in Postgres: the records
re-read from Kafka go into a temporary table (record_batch, as a run stages them), the
state they make is computed there (the newest record per key, tombstones deleting; the
totals per group), and compared with the results table both ways in SQL, so that memory
does not grow with the keys. Temporary tables only: the pipeline's tables are only read.

With ``[sink] transactions`` each re-read change's identity (plan/replays.py) is staged
beside the rows, and the rows of every record whose identity came earlier in its
partition (Kafka Connect's replays) are left out before the state is computed, as the
runs left them out: in Postgres, as the rows are, so that memory does not grow with the
partition either."""

from __future__ import annotations

from psycopg import sql
from sqlalchemy.schema import CreateTable

from pipeline.store import tables
from pipeline.store.copy_in import copy_in
from pipeline.store.identifiers import identifiers
from pipeline.store.results import COORDINATES, Sink
from pipeline.store.session import Session

ROWS, STATE = "_verify_rows", "_verify_state"
CHANGES = "_verify_changes"  # the re-read records' identities (plan/replays.py)
LOST, SKIPPED = "_verify_lost", "_verify_skipped"  # ranges not re-read; the keys they decide
SHOWN = 10  # differing keys named per direction


class StateVerification:
    """Verify of one results table's state, on the Store's session and in its open
    transaction (``Store.state(sink)``)."""

    def __init__(self, db: Session, sink: Sink):
        self.db, self.sink = db, sink
        self.identified = False  # scratch made CHANGES

    def scratch(self, identities: bool = False) -> None:
        """In the open transaction: the temp table the re-read records go into, and with
        ``identities`` ([sink] transactions) the one their identities go into."""
        self.db.run(CreateTable(tables.record_batch(self.sink.settings, ROWS)))
        self.identified = identities
        if identities:
            self.db.conn.execute(sql.SQL(
                'CREATE TEMP TABLE {} (topic text, "partition" int, "offset" bigint, tx text, '
                '"order" bigint, follows bigint) ON COMMIT DROP').format(
                    sql.Identifier(CHANGES)))

    def copy_records(self, rows, tombstones, binary: bool) -> None:
        """One batch's encoded rows (the format's COPY wire) and tombstones (COPY text)."""
        conn = self.db.conn
        cols = identifiers(c.name for c in tables.written(self.sink.records))
        with conn.cursor() as cur:
            if rows:
                copy_in(cur, sql.Identifier(ROWS), cols, rows, binary)
            if tombstones:
                copy_in(cur, sql.Identifier(ROWS),
                        identifiers(tables.tombstone_columns(self.sink.settings)), tombstones)

    def copy_identities(self, topic: str, partition: int,
                        identified: list[tuple[int, tuple[str, int, int]]]) -> None:
        """A batch's records that have an identity: (offset, identity)."""
        if not identified:
            return
        with self.db.conn.cursor() as cur, cur.copy(sql.SQL(
                'COPY {} (topic, "partition", "offset", tx, "order", follows) FROM STDIN'
        ).format(sql.Identifier(CHANGES))) as cp:
            for offset, (tx, order, follows) in identified:
                cp.write_row((topic, partition, offset, tx, order, follows))

    def leave_out_replays(self) -> int:
        """plan/replays.py's rule over every record re-read: of a partition's changes with
        one identity the first stays, and the rows of the others (Kafka Connect's replays)
        and of the tombstones right after them are deleted from the records re-read.
        Returns how many records were replays."""
        return self.db.conn.execute(sql.SQL(
            'WITH again AS (SELECT topic, "partition", "offset" FROM (SELECT topic, '
            '"partition", "offset", row_number() OVER (PARTITION BY topic, "partition", tx, '
            '"order" ORDER BY "offset") AS n FROM {c} WHERE follows < 0) x WHERE n > 1), '
            "replays AS (SELECT * FROM again UNION ALL SELECT c.topic, c.\"partition\", "
            'c."offset" FROM {c} c JOIN again a ON c.topic = a.topic AND c."partition" = '
            'a."partition" AND c.follows = a."offset"), '
            'gone AS (DELETE FROM {r} r USING replays d WHERE r.topic = d.topic AND '
            'r."partition" = d."partition" AND r."offset" = d."offset") '
            "SELECT count(*) FROM replays").format(
                c=sql.Identifier(CHANGES), r=sql.Identifier(ROWS))).fetchone()[0]

    def forget_records(self, topic: str, partition: int) -> None:
        """The partition's records re-read so far (to read it again from where Kafka's log
        starts now: retention deleted records while verify read them)."""
        for table in (ROWS, CHANGES) if self.identified else (ROWS,):
            self.db.conn.execute(sql.SQL(
                'DELETE FROM {} WHERE topic = %s AND "partition" = %s').format(
                    sql.Identifier(table)), (topic, partition))

    def names_records(self) -> bool:
        """Whether each state row names the record it is (coordinates): then the rows of
        records Kafka no longer holds can be left out of the comparison, else (totals) the
        state cannot be compared without every record."""
        return set(COORDINATES) <= set(self.sink.state_columns())

    def leave_out(self, lost: list[tuple[str, int, int, int]]) -> int:
        """The ranges of published records Kafka no longer holds ((topic, partition, from,
        until)): the table rows they made are not compared, and for a table that is the
        whole state, neither is any key such a row, or a record the sink keeps of it (an
        upsert's tombstones), names (it may be newer than every record re-read). Returns the
        table rows left out."""
        lost_t, skipped = sql.Identifier(LOST), sql.Identifier(SKIPPED)
        self.db.conn.execute(sql.SQL("CREATE TEMP TABLE {} (topic text, \"partition\" int, "
                                     "from_offset bigint, until_offset bigint) ON COMMIT DROP")
                             .format(lost_t))
        with self.db.conn.cursor() as cur:
            cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(lost_t),
                            lost)

        def in_lost(table: str, cols: sql.Composable) -> sql.Composable:
            return sql.SQL("SELECT {cols} FROM {t} x JOIN {l} l ON x.topic = l.topic AND "
                           "x.\"partition\" = l.\"partition\" AND x.\"offset\" >= "
                           "l.from_offset AND x.\"offset\" < l.until_offset").format(
                               cols=cols, t=self.db.t(table), l=lost_t)
        rows = self.db.conn.execute(in_lost(self.sink.results.name, sql.SQL("count(*)"))
                                    ).fetchone()[0]
        if self.sink.state_is_whole_table:
            key = self.sink.state_key()
            cols = sql.SQL(", ").join(sql.SQL("x.{}").format(sql.Identifier(k)) for k in key)
            keeping = [t for t in self.sink.tables if {*COORDINATES, *key} <= set(t.c.keys())]
            self.db.conn.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS {}").format(
                skipped, sql.SQL(" UNION ").join(in_lost(t.name, cols) for t in keeping)))
        return rows

    def recompute(self) -> list[str]:
        """The state the results table should hold, made from the re-read records by the
        sink's own rule (Sink.state_sql) into a temp table; returns the columns compared."""
        for statement in self.sink.state_sql(sql.Identifier(ROWS), sql.Identifier(STATE)):
            self.db.conn.execute(statement)
        return self.sink.state_columns()

    def _compared(self, columns: list[str]) -> sql.Composable:
        """The select list of the compared columns: a column that keeps each value's scale
        (Sink.state_scaled) as its text, so that 1.50 differs from 1.5; the others as they
        are."""
        scaled = self.sink.state_scaled()
        return sql.SQL(", ").join(
            sql.SQL("{c}::text AS {c}").format(c=sql.Identifier(c)) if c in scaled
            else sql.Identifier(c) for c in columns)

    def _different(self, columns: list[str], inexact: set[str]) -> sql.Composable:
        """The predicate 'row s and row t differ' (NULLs equal; inexact columns within a
        relative 1e-9; scaled ones with their scale)."""
        tests = []
        scaled = self.sink.state_scaled()
        for c in columns:
            s_c, t_c = sql.SQL("s.{}").format(sql.Identifier(c)), \
                sql.SQL("t.{}").format(sql.Identifier(c))
            if c in scaled:
                s_c, t_c = sql.SQL("{}::text").format(s_c), sql.SQL("{}::text").format(t_c)
            if c in inexact:
                tests.append(sql.SQL(
                    "({s} IS DISTINCT FROM {t} AND NOT coalesce(abs({s} - {t}) <= 1e-9 * "
                    "greatest(abs({s}), abs({t})), false))").format(s=s_c, t=t_c))
            else:
                tests.append(sql.SQL("{s} IS DISTINCT FROM {t}").format(s=s_c, t=t_c))
        return sql.SQL(" OR ").join(tests)

    def _joined_differences(self, columns: list[str], inexact: set[str],
                            state: sql.Composable, table: sql.Composable) -> dict:
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
                state=state, table=table, on=on)
        out = {}
        for name, side, when in (("missing", "s", "no_t OR (NOT no_s AND differs)"),
                                 ("unexpected", "t", "no_s OR (NOT no_t AND differs)")):
            keys = sql.SQL(", ").join(sql.Identifier(f"{side}_{k}") for k in key)
            out[name] = self.db.conn.execute(sql.SQL("SELECT count(*) FROM ({j}) j WHERE {w}")
                                             .format(j=joined, w=sql.SQL(when))).fetchone()[0]
            first = self.db.conn.execute(sql.SQL(
                "SELECT {keys} FROM ({j}) j WHERE {w} ORDER BY {keys} LIMIT {n}").format(
                    keys=keys, j=joined, w=sql.SQL(when), n=sql.Literal(SHOWN))).fetchall()
            out[f"{name}_keys"] = [list(map(str, k)) for k in first]
        return out

    def differences(self, columns: list[str], left_out: bool = False) -> dict:
        """Rows the state holds that the table does not (``missing``: a key gone or a
        value changed) and rows the table holds that the state does not (``unexpected``),
        counted (per partition too, when rows name their records), with the first keys of
        each. ``left_out``: ``leave_out`` named keys not to compare."""
        key = identifiers(self.sink.state_key())
        cols = self._compared(columns)
        state: sql.Composable = sql.Identifier(STATE)
        table: sql.Composable = self.db.t(self.sink.results.name)
        if not self.sink.state_is_whole_table:
            # Only the rows of the records re-read (a window of the table): rows no record
            # accounts for are the offset check's to find (driver/verify.py).
            table = sql.SQL("(SELECT * FROM {t} WHERE (topic, \"partition\", \"offset\") IN "
                            "(SELECT topic, \"partition\", \"offset\" FROM {s}))").format(
                                t=table, s=state)
        elif left_out:
            state, table = (sql.SQL(
                "(SELECT * FROM {t} x WHERE NOT EXISTS (SELECT FROM {k} k WHERE {on}))").format(
                    t=t, k=sql.Identifier(SKIPPED), on=sql.SQL(" AND ").join(
                        sql.SQL("k.{c} = x.{c}").format(c=sql.Identifier(c))
                        for c in self.sink.state_key())) for t in (state, table))
        if inexact := self.sink.state_inexact():
            out = self._joined_differences(columns, inexact, state, table)
        else:
            out = self._rows_differences(cols, key, state, table,
                                         {"topic", "partition"} <= set(columns))
        out["state_rows"] = self.db.conn.execute(sql.SQL("SELECT count(*) FROM {} s").format(
            state)).fetchone()[0]
        out["table_rows"] = self.db.conn.execute(sql.SQL("SELECT count(*) FROM {} t").format(
            table)).fetchone()[0]
        return out

    def _rows_differences(self, cols: sql.Composable, key: sql.Composable,
                          state: sql.Composable, table: sql.Composable,
                          by_partition: bool) -> dict:
        """Rows on one side only, both ways (EXCEPT ALL: NULLs equal, duplicates count);
        ``by_partition``: counted per (topic, partition) of the row, too."""
        out: dict = {}
        for name, a, b in (("missing", state, table), ("unexpected", table, state)):
            diff = sql.SQL("(SELECT {cols} FROM {a} a EXCEPT ALL SELECT {cols} FROM {b} b)"
                           ).format(cols=cols, a=a, b=b)
            if by_partition:
                counts = self.db.conn.execute(sql.SQL(
                    "SELECT topic, \"partition\", count(*) FROM {} d GROUP BY 1, 2").format(
                        diff)).fetchall()
                out[f"{name}_by_partition"] = {(t, p): n for t, p, n in counts}
                count = sum(n for _, _, n in counts)
            else:
                count = self.db.conn.execute(sql.SQL("SELECT count(*) FROM {} d").format(diff)
                                             ).fetchone()[0]
            first = self.db.conn.execute(sql.SQL(
                "SELECT {key} FROM {} d ORDER BY {key} LIMIT {n}").format(
                    diff, key=key, n=sql.Literal(SHOWN))).fetchall()
            out[name] = count
            out[f"{name}_keys"] = [list(map(str, k)) for k in first]
        return out
