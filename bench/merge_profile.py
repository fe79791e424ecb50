"""Where an upsert or aggregate publish spends its time: each statement of pipeline/sinks/,
timed alone on a temp table of N rows shaped like a run's (no Kafka, no Spark).

    .venv/bin/python -m bench.merge_profile            # 2,000,000 rows
    .venv/bin/python -m bench.merge_profile 200000 --explain

The rows are the bench's orders (pipeline.sample.order: order_id = i, customer c{i % 97},
partition i % 4, offset i / 4), generated in SQL into the temp table the publisher fills by
COPY (tables.record_batch), then merged by the product's own code (Upsert.merge,
Aggregate.merge_sql) on a connection that times every statement: the first upsert of N new
keys (ingest), the replay of the same rows (backfill: 0 rows change), the aggregate. Then
alternatives to the upsert's statements (not the product's code), each in a transaction of
its own that is rolled back. ``--explain`` adds EXPLAIN (ANALYZE, BUFFERS, WAL) of every
upsert statement, first run and replay. The tables are dropped at the end.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy import MetaData
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateTable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.contenders import pipeline_config  # noqa: E402
from bench.harness import DB, STAMP  # noqa: E402
from pipeline import sinks  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.sinks import upsert as upsert_sink  # noqa: E402
from pipeline.store import tables  # noqa: E402
from pipeline.store.identifiers import identifiers  # noqa: E402
from pipeline.store.run import Kind, Run  # noqa: E402

SOURCE, LATEST = "_publish_rows", upsert_sink._LATEST  # the publisher's and the merge's temp tables
FILL = """INSERT INTO {src} (topic, "partition", "offset", kafka_timestamp, order_id, customer,
    amount, placed_at, run_id)
SELECT 'bench', i % 4, i / 4, now(), i, 'c' || (i % 97), round(i * 1.25, 2),
       timestamptz '2026-01-01 00:00:00+00' + i * interval '1 minute', {run}
FROM generate_series(0, {last}) AS i"""


class Timing:
    """A psycopg connection whose execute() records (statement, seconds, rowcount)."""

    def __init__(self, conn: psycopg.Connection):
        self.conn, self.log = conn, []

    def execute(self, query, params=None):
        text = query if isinstance(query, str) else query.as_string(self.conn)
        if params is not None:  # the merge lock's and the aggregate's: inline them
            text = psycopg.ClientCursor(self.conn).mogrify(text, params)
        lsn = wal_lsn(self.conn)
        t0 = time.perf_counter()
        cur = self.conn.execute(text)
        self.log.append((text, time.perf_counter() - t0, cur.rowcount,
                         wal_since(self.conn, lsn)))
        return cur


def wal_lsn(conn) -> str:
    return conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]


def wal_since(conn, lsn: str) -> float:
    """MB of WAL written since ``lsn`` (by anyone: the machine's other writers count too)."""
    return conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)",
                        (lsn,)).fetchone()[0] / 2**20


def label(statement: str) -> str:
    """A statement of a sink's merge, named for the table."""
    s = " ".join(statement.split())
    if s.startswith("SELECT pg_advisory"):
        return "merge lock: pg_advisory_xact_lock"
    if s.startswith("SELECT count(*)"):
        return "keys in several partitions: count(*) vs count(DISTINCT key)"
    if s.startswith("CREATE TEMP TABLE"):
        return "newest per key and partition: CREATE TEMP TABLE AS SELECT DISTINCT ON ... ORDER BY"
    if s.startswith("ANALYZE"):
        return "ANALYZE the newest-per-key temp table"
    if s.startswith("MERGE"):
        return "MERGE rows: WHEN MATCHED AND newer UPDATE, WHEN NOT MATCHED INSERT"
    if "GROUP BY" in s:
        return "aggregate: INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE (add up)"
    target = s.split()[2].split(".")[-1].strip('"')
    if s.startswith("DELETE") and target == LATEST:
        return "the rule across partitions: DELETE the older of a key's records"
    if s.startswith("DELETE"):
        return (f"DELETE FROM {target}" if target.endswith("_deleted")
                else "DELETE rows of tombstones")
    return "INSERT tombstones ... ON CONFLICT"


def settings_for(name: str, mode: str, tables_toml: str = ""):
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "profile.toml"
        pipeline_config(config, name, "bench", "json", mode=mode, tables=tables_toml)
        return load_settings(config, environ={})


def ddl(table) -> str:
    if table.schema is not None:  # tables.SCHEMA: the pipeline's schema, here the default
        table = table.to_metadata(MetaData(), schema=None)
    return str(CreateTable(table).compile(dialect=postgresql.dialect()))


def fill(conn, settings, n: int, run: int) -> float:
    conn.execute(ddl(tables.record_batch(settings.sink, SOURCE)))
    t0 = time.perf_counter()
    conn.execute(FILL.format(src=SOURCE, run=run, last=n - 1))
    return time.perf_counter() - t0


def sink_of(settings) -> sinks.Sink:
    """The product's sink (its tables in the bench database's default schema, public)."""
    return sinks.for_settings(settings)


def show(title: str, log: list, total: float) -> None:
    print(f"\n{title}")
    for text, seconds, rows, wal in log:
        print(f"  {seconds:7.2f} s  {rows:>10,} rows  {wal:7.1f} MB WAL  {label(text)}")
    print(f"  {total:7.2f} s  all, with COMMIT")


def statement(log: list[str], prefix: str) -> str:
    return next(text for text in log if text.lstrip().startswith(prefix))


def on_conflict_statement(conn, settings, table: str, merge_sql: str, kind: str) -> str:
    """The product's MERGE as the INSERT ... ON CONFLICT DO UPDATE WHERE newer it replaced:
    the same rows (its USING subquery), the same newer rule."""
    names = [c.name for c in tables.written(sink_of(settings).results)]
    rows = merge_sql.split(" USING (", 1)[1].split(") AS l ON ", 1)[0]
    key = settings.sink.key
    return sql.SQL(
        "INSERT INTO {res} AS r ({cols}) {rows} ON CONFLICT ({key}) DO UPDATE SET {updates}, "
        "ingested_at = now() WHERE {newer}").format(
        res=sql.Identifier(table), cols=identifiers(names),
        rows=sql.SQL(rows.replace("SELECT * FROM", "SELECT {} FROM".format(
            ", ".join(f"l.{sql.Identifier(n).as_string(conn)}" for n in names)), 1)),
        key=identifiers(key),
        updates=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
                                   for n in names if n not in key),
        newer=upsert_sink.newer("excluded", "r")).as_string(conn)


def alternatives(conn, settings, table: str, statements: dict[str, list[str]]) -> dict:
    """name -> (setup statements, untimed; timed statements); run on a fresh temp table."""
    latest = statement(statements["backfill"], "CREATE TEMP TABLE")
    out = {}
    for kind, what in (("backfill", "replay"), ("ingest", "first run")):
        merge_sql = statement(statements[kind], "MERGE")
        setup = [latest] + ([f"TRUNCATE {table}"] if kind == "ingest" else [])
        insert = on_conflict_statement(conn, settings, table, merge_sql, kind)
        out[f"{what}: the product's MERGE (for comparison)"] = (setup, [merge_sql])
        out[f"{what}: INSERT ... ON CONFLICT DO UPDATE WHERE newer (the former statement)"] = (
            setup, [insert])
        if kind == "ingest":  # what inserting the rows costs at least
            out["first run: the same INSERT without ON CONFLICT (a lower bound, not a "
                "candidate)"] = (setup, [insert.split(" ON CONFLICT")[0]])
    src = SOURCE
    out.update({
        "check: GROUP BY key HAVING min(text) <> max(text) on every record (the former check)":
            ([], [f"SELECT order_id, min(topic || '[' || partition || ']'), max(topic || '[' "
                  f"|| partition || ']') FROM {src} GROUP BY order_id HAVING min(topic || '[' "
                  f"|| partition || ']') <> max(topic || '[' || partition || ']') LIMIT 1"]),
        "check: count(DISTINCT (topic, partition)) > 1 per key": ([], [
            f'SELECT order_id FROM {src} GROUP BY order_id '
            f'HAVING count(DISTINCT (topic, "partition")) > 1 LIMIT 1']),
        "newest per key with work_mem = 256MB (sort in memory)": (
            ["SET LOCAL work_mem = '256MB'"], [latest]),
    })
    return out


def main(argv: list[str]) -> int:
    explain = "--explain" in argv
    n = next((int(a) for a in argv if a.isdigit()), 2_000_000)
    up, agg = f"b_prof_up_{STAMP}", f"b_prof_agg_{STAMP}"
    upsert = settings_for(up, 'mode = "upsert"\nkey = ["order_id"]\n')
    aggregate = settings_for(agg, 'mode = "aggregate"\ngroup_by = ["customer"]\n',
                             '[sink.aggregates]\norders = "count(*)"\ntotal = "sum(amount)"\n'
                             'first_placed = "min(placed_at)"\nbiggest = "max(amount)"\n')
    print(f"merge_profile: {n:,} rows; load average {os.getloadavg()[0]:.2f}")
    statements: dict[str, list[str]] = {}
    with psycopg.connect(DB) as conn:
        try:
            with conn.transaction():
                for t in [*sink_of(upsert).tables, *sink_of(aggregate).tables]:
                    conn.execute(ddl(t))
            for title, kind, run in (("upsert, first run (every key new)", "ingest", 1),
                                     ("upsert replay (backfill of the same rows: 0 change)",
                                      "backfill", 2)):
                timing = Timing(conn)
                with conn.transaction():
                    filled = fill(conn, upsert, n, run)
                    t0 = time.perf_counter()
                    merged = sink_of(upsert).merge(timing, SOURCE,
                                                   Run(run, Kind(kind), up, "public"))
                print(f"\n(temp table filled in {filled:.2f} s; rows written {merged.rows:,})")
                show(title, timing.log, time.perf_counter() - t0)
                statements[kind] = [text for text, *_ in timing.log]
            timing = Timing(conn)
            with conn.transaction():
                fill(conn, aggregate, n, 1)
                t0 = time.perf_counter()
                timing.execute(sink_of(aggregate).merge_sql(SOURCE), (1,))
            show("aggregate (97 groups)", timing.log, time.perf_counter() - t0)

            print("\nalternatives (each on a fresh temp table, rolled back):")
            for name, (setup, timed) in alternatives(conn, upsert, up, statements).items():
                with conn.transaction(force_rollback=True):
                    fill(conn, upsert, n, 3)
                    for s in setup:
                        conn.execute(s)
                    lsn, t0 = wal_lsn(conn), time.perf_counter()
                    rows = [conn.execute(s).rowcount for s in timed]
                    seconds = time.perf_counter() - t0
                    print(f"  {seconds:7.2f} s  {rows[-1]:>10,} rows  "
                          f"{wal_since(conn, lsn):7.1f} MB WAL  {name}")
            if explain:
                for kind in ("ingest", "backfill"):
                    with conn.transaction(force_rollback=True):
                        if kind == "ingest":
                            conn.execute(f"TRUNCATE {up}")
                        fill(conn, upsert, n, 4)
                        for text in statements[kind]:
                            if text.startswith("ANALYZE"):  # cannot be EXPLAINed: run it
                                conn.execute(text)
                                continue
                            print(f"\nEXPLAIN ANALYZE ({kind}) {label(text)}:")
                            for (line,) in conn.execute(
                                    "EXPLAIN (ANALYZE, BUFFERS, WAL) " + text).fetchall():
                                print(f"  {line}")
        finally:
            conn.rollback()
            with conn.transaction():
                for t in (up, f"{up}_deleted", agg):
                    conn.execute(f"DROP TABLE IF EXISTS {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
