"""User transforms (``scripts/bench --transform [N ...]``, issue 25): what a transform costs
this pipeline, and how it compares with Structured Streaming running the same logic.

Contenders, on one topic of N JSON orders (4 partitions), in turns (A, B, C, ...; BENCH_REPEAT
rounds), each into a fresh table:

    pipeline_json      this pipeline, the built-in json path (the baseline: no transform)
    pipeline_identity  + ``transform = "tests.integration.transforms.orders:identity"``
                       (the job's own read and decode, Spark SQL; the transform changes nothing)
    pipeline_enrich    + the realistic transform of conf/examples/transform.toml
                       (order_enrichment.enrich: a filter, a broadcast join with
                       customers.csv, a derived column)
    sss_arrow          Spark Structured Streaming AvailableNow, foreachBatch -> mapInArrow +
                       CSV COPY (bench/peers/sss_arrow.py)
    sss_arrow_enrich   the same with order_enrichment.enrich inside foreachBatch

Both enrich contenders import the transform as a user would: its folder on PYTHONPATH.
Verified: the plain tables like the main table (count, sums, distinct coordinates); the
enriched ones against the transform recomputed here from the generator (count, sums,
distinct coordinates, and count and sum(amount) per region, segment and band). The table
goes between the bench-transform markers of docs/benchmarks.md, the plot to
docs/benchmarks_transform.png.
"""

from __future__ import annotations

import csv
import os
import platform
from datetime import UTC, datetime
from decimal import Decimal

import psycopg

from bench.contenders import IDENTITY, run_peer, run_pipeline
from bench.harness import DB, ROOT, Result, bench_topic, in_turns
from bench.report import plot_rates, write_between

EXAMPLE = ROOT / "conf" / "examples" / "transforms"
ENRICH = 'transform = "order_enrichment:enrich"\n'
ENRICHED_COLUMNS = 'region = "string"\nsegment = "string"\namount_band = "string"\n'
LABELS = {
    "pipeline_json": "this pipeline, json sink, no transform (the built-in path)",
    "pipeline_identity": "**this pipeline + identity transform** (the job's own read and decode, "
                         "Spark SQL)",
    "pipeline_enrich": "**this pipeline + the realistic transform** (filter, broadcast join "
                       "with customers.csv, derived column)",
    "sss_arrow": "Spark Structured Streaming AvailableNow, foreachBatch -> mapInArrow + "
                 "CSV COPY",
    "sss_arrow_enrich": "Spark Structured Streaming AvailableNow, the realistic transform "
                        "in foreachBatch -> mapInArrow + CSV COPY",
}
SHORT = {"pipeline_json": "pipeline, built-in", "pipeline_identity": "pipeline + identity",
         "pipeline_enrich": "pipeline + realistic", "sss_arrow": "Spark SS",
         "sss_arrow_enrich": "Spark SS + realistic"}


def enriched_expected(n: int) -> tuple[tuple, dict]:
    """What order_enrichment.enrich must leave of the generator's n orders
    (pipeline.sample.order), recomputed apart from it: ((rows, sum(order_id), sum(amount)),
    {(region, segment, band): (rows, sum(amount))})."""
    with (EXAMPLE / "customers.csv").open(newline="") as f:
        dimension = {r["customer"]: (r["region"], r["segment"]) for r in csv.DictReader(f)}
    rows = ids = 0
    total = Decimal(0)
    groups: dict[tuple, list] = {}
    for i in range(n):
        amount = Decimal(str(round(i * 1.25, 2)))
        if amount <= 0:
            continue
        band = "small" if amount < 1000 else "medium" if amount < 10000 else "large"
        key = (*dimension.get(f"c{i % 97}", ("unknown", None)), band)
        g = groups.setdefault(key, [0, Decimal(0)])
        g[0] += 1
        g[1] += amount
        rows, ids, total = rows + 1, ids + i, total + amount
    return (rows, ids, total), {k: tuple(v) for k, v in groups.items()}


def check_enriched(table: str, n: int) -> None:
    want_totals, want_groups = enriched_expected(n)
    with psycopg.connect(DB) as conn:
        totals = conn.execute(f'SELECT count(*), sum(order_id), sum(amount), count(DISTINCT '
                              f'("partition", "offset")) FROM {table}').fetchone()
        groups = {tuple(r[:3]): tuple(r[3:]) for r in conn.execute(
            f"SELECT region, segment, amount_band, count(*), sum(amount) FROM {table} "
            "GROUP BY 1, 2, 3").fetchall()}
    assert tuple(totals[:3]) == want_totals and totals[3] == want_totals[0], \
        (table, totals, want_totals)
    assert groups == want_groups, (table, {k: (groups.get(k), v) for k, v in
                                           want_groups.items() if groups.get(k) != v})


def run_one(name: str, topic: str, n: int, run: int, env: dict) -> tuple[float, float, dict]:
    if name == "pipeline_json":
        return run_pipeline("json", topic, n, run, env, tag="_tplain")
    if name == "pipeline_identity":
        return run_pipeline("json", topic, n, run, env, tag="_tident", sink=IDENTITY)
    if name == "pipeline_enrich":
        return run_pipeline("json", topic, n, run, env, tag="_tenrich", sink=ENRICH,
                            more_columns=ENRICHED_COLUMNS, check=check_enriched)
    check = check_enriched if name == "sss_arrow_enrich" else None
    return (*run_peer(name, topic, n, run, env, check=check), {})


def bench_transform(sizes: list[int], env: dict) -> list[tuple[Result, list]]:
    """(result, load samples) per size and contender."""
    env = {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{EXAMPLE}"}
    out = []
    for n in sizes:
        topic = bench_topic(n)
        out += in_turns("transform", n, list(LABELS), lambda _, t=topic: t,
                        lambda name, run, t=topic, n=n: run_one(name, t, n, run, env))
    return out


def transform_report(rows: list[tuple[Result, list]]) -> str:
    """The issue's ratios: each against the built-in path, and the pipeline's transform
    contenders against Structured Streaming with the same logic."""
    lines = ["| records | contender | runs | seconds (min-max) | rows/s (best) | time "
             "relative to the built-in path | speed relative to Spark SS, same logic | "
             "peak RSS MB | read_and_stage (best) |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({r.size for r, _ in rows}):
        group = {r.name: r for r, _ in rows if r.size == n}
        base = min(group["pipeline_json"].seconds)
        peer = {"pipeline_identity": "sss_arrow", "pipeline_enrich": "sss_arrow_enrich"}
        for name, r in group.items():
            best = min(r.seconds)
            versus = (f"{min(group[peer[name]].seconds) / best:.2f}x" if name in peer
                      else "")
            stage = (f"{min(p.get('read_and_stage', 0) for p in r.phases):.2f}"
                     if name.startswith("pipeline_") else "")
            lines.append(f"| {n:,} | {LABELS[name]} | {len(r.seconds)} | "
                         f"{best:.1f}-{max(r.seconds):.1f} | {n / best / 1000:,.1f}k | "
                         f"{best / base:.2f} | {versus} | {max(r.rss_mb):,.0f} | {stage} |")
    return "\n".join(lines)


def main(sizes: list[int], env: dict) -> int:
    rows = bench_transform(sizes, env)
    table = transform_report(rows)
    print(table)
    loads = [load for _, samples in rows for load, _ in samples]
    header = (f"Measured by `scripts/bench --transform {' '.join(map(str, sizes))}` on "
              f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} cores, `local[2]`, "
              f"Python {platform.python_version()}, the local stack on the same machine; "
              f"1-minute load average before the runs {min(loads):.2f}-{max(loads):.2f}. "
              "Every contender reads the same topic from the start into a fresh table and "
              "is verified.\n\n![transforms](benchmarks_transform.png)\n\n")
    write_between(("<!-- bench-transform:start -->", "<!-- bench-transform:end -->"),
                  header + table)
    plot_rates([r for r, _ in rows], SHORT,
               "transforms: {n:,} JSON orders, 4 partitions, 2 cores",
               ROOT / "docs" / "benchmarks_transform.png")
    print("bench: wrote the transform table in docs/benchmarks.md and "
          "docs/benchmarks_transform.png")
    return 0
