"""The sample shop for the CDC chain (docs/cdc.md): a workload against the source database,
an invariant reader for a replica, and a row-by-row comparison of a replica with its source.

    python -m pipeline.sample_shop run --url postgresql://postgres@127.0.0.1:5434/shop \\
        --transactions 10000 --seed 1 [--rate 500]
    python -m pipeline.sample_shop check --url postgresql://.../pipeline --schema replica \\
        --poll 0.2 --until-stopped --json
    python -m pipeline.sample_shop compare --source postgresql://.../shop \\
        --replica postgresql://.../pipeline --schema replica

run: empties the shop (drops the column the workload adds, deletes every row: captured
like any change), then runs the planned transactions, each in one transaction
(pipeline/sample_shop_workload.py); its summary names the last one's transaction id.
check: polls the replica's tables (the shop's names, in --schema), each poll one REPEATABLE
READ snapshot, and counts every invariant seen broken (exit 3 if any was). compare: exit 0
if the replica equals the source, 3 if not, printing the first differences per table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter

from pipeline.errors import EXIT_CONFIG, EXIT_DATA, EXIT_OK, EXIT_TRANSIENT, ConfigError

DEFAULT_SOURCE = os.environ.get("CDC_SOURCE_URL", "postgresql://postgres@127.0.0.1:5434/shop")


def run_workload(url: str, transactions: int, seed: int, rate: float = 0.0, reset: bool = True,
                 progress=None) -> dict:
    """The planned transactions against ``url``; a summary. ``rate``: transactions per second
    at most (0: as fast as the database takes them)."""
    import psycopg

    from pipeline.sample_shop_workload import RESET, plan

    kinds: Counter[str] = Counter()
    statements = 0
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        # A sample's commits need not wait for the disk: the change stream is the same.
        conn.execute("SET synchronous_commit = off")
        if reset:
            with conn.transaction():
                for q, _ in RESET:
                    conn.execute(q)
        last_txid = None
        for i, txn in enumerate(plan(seed, transactions)):
            if rate > 0:
                wait = t0 + i / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            with conn.transaction():
                for q, params in txn.statements:
                    conn.execute(q, params or None)
                if i == transactions - 1:
                    # Where a reader of the change stream knows the run ends: Debezium's
                    # source.txId (the 32-bit xid) of the last transaction.
                    last_txid = conn.execute(
                        "SELECT pg_current_xact_id()::text::bigint % 4294967296").fetchone()[0]
            kinds[txn.kind] += 1
            statements += len(txn.statements)
            if progress and (i + 1) % 1000 == 0:
                progress(i + 1)
    seconds = time.perf_counter() - t0
    return {"transactions": sum(kinds.values()), "statements": statements,
            "last_txid": last_txid,
            "seconds": round(seconds, 3),
            "per_second": round(sum(kinds.values()) / seconds, 1) if seconds else None,
            "kinds": dict(sorted(kinds.items()))}


def watch(url: str, schema: str, poll: float, stop: threading.Event,
          until: float | None = None, on_broken=None):
    """Polls the replica until ``stop`` is set (or ``until`` seconds passed); a Watch."""
    import psycopg

    from pipeline.sample_shop_invariants import Watch, check, fetch

    w = Watch()
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        # Tables appear as a sink creates them, so a missing one reads as empty; a missing
        # schema is a wrong argument that would read as a replica never torn.
        if not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (schema,)).fetchone():
            raise ConfigError(f"schema {schema!r} does not exist in the replica's database: "
                              "name the schema the replica writes (--schema)")
        while not stop.is_set():
            at = time.perf_counter() - t0
            broken = check(fetch(conn, schema))
            w.add(w.polls, at, broken)
            if broken and on_broken:
                on_broken(w.polls, at, broken)
            if until is not None and at >= until:
                break
            stop.wait(poll)
    return w


def _run(a) -> int:
    summary = run_workload(a.url, a.transactions, a.seed, a.rate, reset=not a.no_reset,
                           progress=None if a.json else
                           lambda n: print(f"{n} transactions", file=sys.stderr))
    print(json.dumps(summary) if a.json else
          f"{summary['transactions']} transactions ({summary['statements']} statements) in "
          f"{summary['seconds']} s, {summary['per_second']}/s: "
          + ", ".join(f"{k} {n}" for k, n in summary["kinds"].items()))
    return EXIT_OK


def _check(a) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def show(poll, at, broken):
        if not a.json:
            print(f"poll {poll} at {at:.1f} s: " + "; ".join(
                f"{b.check} x{b.count} ({b.samples[0]})" for b in broken), flush=True)

    until = None if a.until_stopped else a.seconds
    w = watch(a.url, a.schema, a.poll, stop, until=until, on_broken=show)
    s = w.summary()
    print(json.dumps(s) if a.json else
          f"{s['polls']} polls, {s['broken_polls']} with a broken invariant: "
          + (", ".join(f"{k} in {v['polls']}" for k, v in s["checks"].items()) or "none"))
    return EXIT_DATA if s["broken_polls"] else EXIT_OK


def _compare(a) -> int:
    from pipeline.sample_shop_compare import compare

    diffs = compare(a.source, a.replica, a.schema, a.source_schema)
    if a.json:
        print(json.dumps({"equal": all(d.equal for d in diffs),
                          "tables": {d.table: {**vars(d), "equal": d.equal} for d in diffs}}))
    else:
        for d in diffs:
            print(f"{d.table}: {'equal' if d.equal else 'DIFFERENT'} ({d.source_rows} source "
                  f"rows, {d.replica_rows} replica rows, {d.missing} missing, {d.extra} extra, "
                  f"{d.differing} differing)")
            for line in d.first:
                print(f"  {line}")
    return EXIT_OK if all(d.equal for d in diffs) else EXIT_DATA


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.sample_shop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the workload against the source")
    r.add_argument("--url", default=DEFAULT_SOURCE, help="the source (CDC_SOURCE_URL)")
    r.add_argument("--transactions", type=int, default=10_000)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--rate", type=float, default=0.0,
                   help="transactions per second at most (0: unlimited)")
    r.add_argument("--no-reset", action="store_true",
                   help="keep what the shop holds (the plan then assumes an empty shop: "
                        "only for a shop this workload never wrote)")
    r.add_argument("--json", action="store_true")
    c = sub.add_parser("check", help="poll a replica's invariants")
    c.add_argument("--url", required=True, help="the replica's database")
    c.add_argument("--schema", required=True, help="the replica's schema (the shop's tables)")
    c.add_argument("--poll", type=float, default=0.2, help="seconds between snapshots")
    g = c.add_mutually_exclusive_group()
    g.add_argument("--until-stopped", action="store_true", help="until SIGINT/SIGTERM")
    g.add_argument("--seconds", type=float, default=0.0, help="then stop (0: one poll)")
    c.add_argument("--json", action="store_true")
    m = sub.add_parser("compare", help="compare a replica with the source, row by row")
    m.add_argument("--source", default=DEFAULT_SOURCE, help="the source (CDC_SOURCE_URL)")
    m.add_argument("--source-schema", default="public")
    m.add_argument("--replica", required=True, help="the replica's database")
    m.add_argument("--schema", required=True, help="the replica's schema")
    m.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if getattr(a, "transactions", 1) < 1:
        p.error("--transactions must be at least 1")
    import psycopg

    try:
        return {"run": _run, "check": _check, "compare": _compare}[a.command](a)
    except ConfigError as e:
        print(f"sample_shop: error: {e.message}", file=sys.stderr)
        return e.exit_code
    except psycopg.OperationalError as e:
        print(f"sample_shop: error: database unreachable ({str(e).strip().splitlines()[0]}); "
              "start it (scripts/stack cdc up) and retry", file=sys.stderr)
        return EXIT_TRANSIENT
    except psycopg.errors.UndefinedTable as e:
        print(f"sample_shop: error: {str(e).strip().splitlines()[0]}: the shop's tables are "
              "not there (scripts/stack cdc up applies conf/examples/cdc/shop.sql)",
              file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
