"""This pipeline against another checkout of itself (``scripts/bench --paired <checkout>
[N]``): what a change cost or gained, on the same topics, in the same hour, in turns.

Three paths, each run by both checkouts through the same CLI (the other checkout's package
first on PYTHONPATH, its own folder as the working directory, this checkout's venv):

    json       the json sink on N JSON orders (the main table's path)
    identity   the transform path with a transform that changes nothing
    avro       the avro sink on the same N orders as Confluent wire-format Avro

Contenders run in turns (now, before, now, before, ...; BENCH_REPEAT rounds, 2 by
default), each from a warm topic into a fresh table, each verified like the main table. The
printed table gives each path's best and median wall seconds and median CPU seconds of
the run's whole process tree (driver, JVM, workers; sampled from /proc, so less swayed by
other load than the wall time) per checkout, and the ratios before/now (above 1: this
checkout is faster); it goes between the bench-paired markers of
docs/benchmarks.md. A ratio against Structured Streaming moves by exactly this ratio, since
the peer's code is the same in both.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from bench import harness
from bench.avro import REGISTRY, avro_topic
from bench.avro_orders import REGISTRY_URL
from bench.contenders import IDENTITY, run_pipeline
from bench.harness import ROOT, Result, bench_topic, in_turns
from bench.report import write_between

PATHS = ("json", "identity", "avro")
# BENCH_PATHS=identity (comma-separated): more rounds of one path where its ratio is in
# doubt; the table is then printed, and docs/ keep the whole run's.
CHOSEN = tuple(p for p in os.environ.get("BENCH_PATHS", ",".join(PATHS)).split(",") if p)
LABELS = {"json": "json sink", "identity": "transform path, identity transform",
          "avro": "avro sink (registry)"}


def run_one(name: str, topics: dict[str, str], n: int, run: int, env: dict,
            other: Path) -> tuple[float, float, dict]:
    path, who = name.split(":")
    root = ROOT if who == "now" else other
    env = {**env, "PYTHONPATH": str(root)}
    tag = f"_p{path[:2]}{who[0]}"
    if path == "avro":
        seconds, rss, phases = run_pipeline("avro", topics["avro"], n, run, env, tag=tag,
                                            tables=REGISTRY, root=root)
    else:
        seconds, rss, phases = run_pipeline("json", topics["json"], n, run, env, tag=tag,
                                            root=root,
                                            sink=IDENTITY if path == "identity" else "")
    return seconds, rss, {**phases, "tree_cpu": round(harness.last_tree_cpu, 1)}


def bench_paired(n: int, env: dict, other: Path) -> list[tuple[Result, list]]:
    env = {**env, "SCHEMA_REGISTRY_URL": REGISTRY_URL}
    topics = {"json": bench_topic(n)} if set(CHOSEN) - {"avro"} else {}
    if "avro" in CHOSEN:
        topics["avro"] = avro_topic(n)
    names = [f"{path}:{who}" for path in CHOSEN for who in ("now", "before")]
    return in_turns("paired", n, names,
                    lambda name: topics["avro" if name.startswith("avro") else "json"],
                    lambda name, run: run_one(name, topics, n, run, env, other))


def paired_report(rows: list[tuple[Result, list]], other: str) -> str:
    by = {r.name: r for r, _ in rows}
    n = rows[0][0].size
    lines = ["| records | path | wall s, this checkout: best / median | before: best / "
             "median | CPU s of the process tree, this: median | before: median | before / "
             "this: wall (median), CPU (median) |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for path in CHOSEN:
        now, before = by[f"{path}:now"], by[f"{path}:before"]
        wall_now, wall_before = statistics.median(now.seconds), statistics.median(before.seconds)
        cpu_now = statistics.median(p["tree_cpu"] for p in now.phases)
        cpu_before = statistics.median(p["tree_cpu"] for p in before.phases)
        lines.append(f"| {n:,} | {LABELS[path]} | {min(now.seconds):.1f} / {wall_now:.1f} | "
                     f"{min(before.seconds):.1f} / {wall_before:.1f} | {cpu_now:.1f} | "
                     f"{cpu_before:.1f} | {wall_before / wall_now:.2f}, "
                     f"{cpu_before / cpu_now:.2f} |")
    loads = [load for _, samples in rows for load, _ in samples]
    head = (f"Measured by `scripts/bench --paired <checkout of {other}> {n}` on "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} cores, Python "
            f"{platform.python_version()}; 1-minute load before the runs {min(loads):.2f}-"
            f"{max(loads):.2f}; {len(by[f'{CHOSEN[0]}:now'].seconds)} rounds in turns.\n\n")
    return head + "\n".join(lines)


def main(sizes: list[int], env: dict, other: str) -> int:
    path = Path(other).resolve()
    if not (path / "pipeline" / "__init__.py").is_file():
        raise SystemExit(f"bench: --paired needs a checkout of this repository, got {other}")
    rows = bench_paired(sizes[0], env, path)
    commit = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or path.name
    table = paired_report(rows, commit)
    print(table)
    if set(CHOSEN) != set(PATHS):
        return 0
    write_between(("<!-- bench-paired:start -->", "<!-- bench-paired:end -->"), table)
    print("bench: wrote the paired table in docs/benchmarks.md")
    return 0
