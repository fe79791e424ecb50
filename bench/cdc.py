"""Whole-database CDC (``scripts/bench --cdc [N]``, issue 41): this pipeline against
Debezium's JDBC sink connector, on the same change topics of the sample shop.

The chain is made fresh (scripts/cdc reset, then up: the source Postgres, the Connect
worker, Debezium's Postgres connector with its transaction metadata), the shop's workload
runs N source transactions (10,000 unless told; pipeline/sample_shop_workload.py) and the
bench waits until Kafka holds every event of them. Then, on those topics, each into its own
fresh schema of the stack's Postgres, while the shop's invariant reader polls that schema
the whole time (pipeline/sample_shop_invariants.py; a poll that sees one broken sees a
source transaction applied in part):

    pipeline        this pipeline: one config for the shop's 5 tables (a route per topic),
                    every table's rows and all offsets in one transaction per run; runs
                    started one after the other until the stored offsets reach the topics'
                    ends, as a scheduler would, with the default budget per run; whole
                    source transactions (`[sink] transactions`; BENCH_CDC_TRANSACTIONS=0
                    leaves it out)
    pipeline_budget the same with a budget of BENCH_CDC_RECORDS records per partition and
                    run (2,500 unless told): several commits, each a moment where a reader
                    could see a source transaction in part
    debezium_jdbc   Debezium's JDBC sink connector on the same worker (bench/peers/
                    debezium_jdbc.py): upsert by the record key, deletes and truncates

Each is timed from its start (the first run's process; the connector's registration) to
the replica caught up, and compared with the source row by row, every column
(pipeline/sample_shop_compare.py). The table goes between the bench-cdc markers of
docs/benchmarks.md, the plot to docs/benchmarks_cdc.png.
"""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from bench.harness import BOOTSTRAP, DB, PY, ROOT, STAMP, checkpoint, machine_load
from bench.report import write_between

PREFIX = "shop_json"
SCHEMAS = {"pipeline": "bench_cdc_pipeline", "pipeline_budget": "bench_cdc_budget",
           "debezium_jdbc": "bench_cdc_debezium"}
RECORDS = int(os.environ.get("BENCH_CDC_RECORDS", "2500"))
LABELS = {"pipeline": "**this pipeline** (`pipeline run` until caught up, every table in "
                      "one transaction per run)",
          "pipeline_budget": f"this pipeline, {RECORDS:,} records per partition and run",
          "debezium_jdbc": "Debezium JDBC sink connector 3.6 (upsert, deletes, truncates; "
                           "one task)"}
SHORT = {"pipeline": "this pipeline", "pipeline_budget": f"this pipeline, {RECORDS:,}/run",
         "debezium_jdbc": "Debezium JDBC sink"}
POLL = 0.2
SOURCE = os.environ.get("CDC_SOURCE_URL") or (
    f"postgresql://postgres@127.0.0.1:{os.environ.get('PG_SOURCE_PORT', '5434')}/shop")
CONNECT = os.environ.get("CONNECT_URL") or (
    f"http://127.0.0.1:{os.environ.get('CONNECT_PORT', '8083')}")


def fresh_chain(env: dict) -> None:
    """The chain as a new user finds it: no connector offsets, slots, topics or shop left
    by earlier runs, so the topics hold this workload's events only."""
    for args in (["reset"], ["up"]):
        r = subprocess.run([str(ROOT / "scripts" / "cdc"), *args], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise SystemExit(f"bench: scripts/cdc {args[0]} failed:\n{r.stderr[-3000:]}")


def workload(n: int) -> tuple[dict, dict]:
    from pipeline.sample_shop import run_workload
    from pipeline.sample_shop_replica import delivered

    print(f"bench: the shop's workload, {n:,} source transactions", flush=True)
    summary = run_workload(SOURCE, n, seed=1)
    print(f"bench: workload done in {summary['seconds']} s ({summary['per_second']}/s); "
          "waiting for the chain to deliver it", flush=True)
    ends = delivered(BOOTSTRAP, PREFIX, summary["last_txid"], timeout=600 + n / 20)
    return summary, ends


def watching(schema: str):
    """A thread polling ``schema``'s invariants until the returned stop() is called, which
    returns the reader's summary."""
    from pipeline.sample_shop import watch

    stop, out = threading.Event(), {}

    def poll() -> None:
        try:
            out.update(watch(DB, schema, POLL, stop).summary())
        except Exception as e:  # noqa: BLE001 - reported with the contender
            out["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()

    def done() -> dict:
        stop.set()
        thread.join(timeout=60)
        if "error" in out:
            raise SystemExit(f"bench: the invariant reader failed: {out['error']}")
        return out

    return done


def diffs_summary(diffs) -> dict:
    return {"equal": all(d.equal for d in diffs),
            "tables": {d.table: {**vars(d), "equal": d.equal} for d in diffs}}


def run_pipeline(variant: str, ends: dict, env: dict, transactions: bool) -> dict:
    from pipeline.sample_shop_compare import compare
    from pipeline.sample_shop_replica import Runs, config

    schema, name = SCHEMAS[variant], f"{SCHEMAS[variant]}_{STAMP}"
    records = RECORDS if variant == "pipeline_budget" else 0
    with psycopg.connect(DB, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cdc.toml"
        path.write_text(config(name, BOOTSTRAP, DB, schema, prefix=PREFIX,
                               transactions=transactions, records_per_partition=records))
        subprocess.run([PY, "-m", "pipeline", "init-db", "--config",
                        str(path)], env=env, cwd=ROOT, check=True, capture_output=True)
        runs = Runs(str(path), DB, schema, name, env)
        stop = watching(schema)
        try:
            seconds = runs.until_caught_up(ends, timeout=3600)
        finally:
            reader = stop()
    events = sum(ends.values())
    return {"events": events, "seconds": round(seconds, 3),
            "events_per_second": round(events / seconds, 1), "runs": len(runs.log),
            "first_commit_seconds": runs.log[0]["seconds"] if runs.log else None,
            "reader": reader, "transactions": transactions,
            "compare": diffs_summary(compare(SOURCE, DB, schema))}


def run_peer() -> dict:
    from bench.peers.debezium_jdbc import run

    return run(CONNECT, BOOTSTRAP, PREFIX, SOURCE, DB, SCHEMAS["debezium_jdbc"], POLL,
               timeout=3600, keep=False)


def differences(r: dict) -> str:
    if r["compare"]["equal"]:
        return "yes"
    out = []
    for t, d in r["compare"]["tables"].items():
        if not d["equal"]:
            what = ", ".join(f"{c} in {k:,}" for c, k in d["columns"].items())
            rows = [f"{d[k]:,} {k}" for k in ("missing", "extra") if d[k]]
            out.append(f"{t}: " + "; ".join(filter(None, [what, *rows])))
    return "no: " + "; ".join(out)


def cdc_report(n: int, results: dict[str, dict]) -> str:
    lines = ["| source transactions | contender | events | seconds | events/s | speed of this "
             "pipeline relative to it | polls | polls that saw a torn transaction | "
             "invariants seen broken (polls) | replica equals the source |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    ours = results["pipeline"]["events_per_second"]
    for name, r in results.items():
        rd = r["reader"]
        broken = ", ".join(f"{k} {v['polls']}" for k, v in rd["checks"].items()) or "none"
        lines.append(f"| {n:,} | {LABELS[name]} | {r['events']:,} | {r['seconds']:.1f} | "
                     f"{r['events_per_second']:,.0f} | {ours / r['events_per_second']:.2f}x | "
                     f"{rd['polls']:,} | {rd['broken_polls']:,} | {broken} | "
                     f"{differences(r)} |")
    return "\n".join(lines)


def plot(n: int, results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    colors = ["#aa3377" if k.startswith("pipeline") else "#4477aa" for k in names]
    fig, (rate, torn) = plt.subplots(1, 2, figsize=(12, 2.6))
    rate.barh([SHORT[k] for k in names][::-1],
              [results[k]["events_per_second"] for k in names][::-1], color=colors[::-1])
    rate.set_xlabel("events/s into Postgres (higher is better)")
    torn.barh([SHORT[k] for k in names][::-1],
              [100 * results[k]["reader"]["broken_polls"] / max(results[k]["reader"]["polls"], 1)
               for k in names][::-1], color=colors[::-1])
    torn.set_xlabel("% of polls that saw a torn transaction (lower is better)")
    torn.set_xlim(0, 100)
    fig.suptitle(f"CDC: {n:,} source transactions of the sample shop, 5 tables, 2 cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(sizes: list[int], env: dict) -> int:
    n = sizes[0] if sizes else 10_000
    transactions = os.environ.get("BENCH_CDC_TRANSACTIONS", "1") != "0"
    if not transactions:
        print("bench: BENCH_CDC_TRANSACTIONS=0: this pipeline runs without whole source "
              "transactions", flush=True)
    fresh_chain(env)
    summary, ends = workload(n)
    print(f"bench: {sum(ends.values()):,} events in {len(ends)} topics", flush=True)
    results, loads = {}, []
    for name in SCHEMAS:
        checkpoint()
        loads.append(machine_load()[0])
        t = time.perf_counter()
        results[name] = (run_pipeline(name, ends, env, transactions)
                         if name.startswith("pipeline") else run_peer())
        r = results[name]
        print(f"bench: cdc {name}: {r['events']:,} events in {r['seconds']:.1f} s, "
              f"{r['events_per_second']:,.1f} events/s; reader {r['reader']['polls']} polls, "
              f"{r['reader']['broken_polls']} torn; replica equals source: "
              f"{differences(r)} ({time.perf_counter() - t:.0f} s with the comparison)",
              flush=True)
    peer = results["debezium_jdbc"]
    for name in ("pipeline", "pipeline_budget"):
        r = results[name]
        print(f"bench: {SHORT[name]}: {r['events_per_second'] / peer['events_per_second']:.2f}"
              f"x the JDBC sink's events/s; torn polls {r['reader']['broken_polls']} of "
              f"{r['reader']['polls']} against {peer['reader']['broken_polls']} of "
              f"{peer['reader']['polls']}", flush=True)
    table = cdc_report(n, results)
    print(table)
    how = ("whole source transactions (`[sink] transactions`)" if transactions else
           "**without** whole source transactions (BENCH_CDC_TRANSACTIONS=0)")
    header = (f"Measured by `scripts/bench --cdc {n}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: "
              f"{os.cpu_count()} cores, Python {platform.python_version()}; the source "
              "Postgres, Kafka Connect with Debezium 3.6, Kafka, the replica's Postgres and "
              f"`local[2]` on this one machine; 1-minute load average before each contender "
              f"{min(loads):.2f}-{max(loads):.2f}. The workload: {summary['transactions']:,} "
              f"source transactions ({summary['statements']:,} statements) over the shop's 5 "
              "tables, delivered to Kafka before any contender starts. This pipeline "
              f"{how}: {results['pipeline']['runs']} run(s) with the default budget, "
              f"{results['pipeline_budget']['runs']} with {RECORDS:,} records per partition "
              f"and run. A reader polled each replica every {POLL} s, one snapshot a poll. "
              "Each is timed from its start (the first run's process, the connector's "
              "registration) to the replica caught up.\n\n![cdc](benchmarks_cdc.png)\n\n")
    write_between(("<!-- bench-cdc:start -->", "<!-- bench-cdc:end -->"), header + table)
    plot(n, results, ROOT / "docs" / "benchmarks_cdc.png")
    print("bench: wrote the cdc table in docs/benchmarks.md and docs/benchmarks_cdc.png")
    return 0
