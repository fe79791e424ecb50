"""Avro records (``scripts/bench --avro [N ...]``, issue 26): this pipeline's Avro sink
against its JSON sink and against what a user would write instead for a Confluent Avro topic.

The same N orders (pipeline.sample.order, 4 partitions) are produced twice: once as JSON
(bench_topic: BENCH_TOPIC may reuse one) and once as Avro in the Confluent wire format
through the stack's Schema Registry (bench/avro_orders.py). Contenders, in turns
(BENCH_REPEAT rounds), each into a fresh table, each verified like the main table (count,
sums of the typed columns, distinct coordinates):

    pipeline_avro        this pipeline, ``format = "avro"``, ``[schema_registry] url``
    pipeline_json        this pipeline, the json sink on the JSON topic (the baseline)
    sss_avro             Spark Structured Streaming AvailableNow, header stripped,
                         from_avro (spark-avro), foreachBatch -> mapInArrow + CSV COPY
    single_process_avro  one Python process: confluent-kafka + fastavro + binary COPY

The table goes between the bench-avro markers of docs/benchmarks.md, the plot to
docs/benchmarks_avro.png.
"""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime

from bench.avro_orders import REGISTRY_URL, serializer
from bench.contenders import run_peer, run_pipeline
from bench.harness import PARTITIONS, ROOT, STAMP, Result, bench_topic, in_turns, produce
from bench.report import plot_rates, write_between

LABELS = {
    "pipeline_avro": "**this pipeline, avro sink** (Confluent wire format, schemas from "
                     "the registry)",
    "pipeline_json": "this pipeline, json sink, on the same orders as JSON (the baseline)",
    "sss_avro": "Spark Structured Streaming AvailableNow, header stripped + from_avro, "
                "foreachBatch -> mapInArrow + CSV COPY",
    "single_process_avro": "one Python process: confluent-kafka + fastavro + binary COPY, "
                           "offsets in the same transaction",
}
SHORT = {"pipeline_avro": "pipeline, avro", "pipeline_json": "pipeline, json",
         "sss_avro": "Spark SS + from_avro", "single_process_avro": "single process, fastavro"}
REGISTRY = f'[schema_registry]\nurl = "{REGISTRY_URL}"\n'


def avro_topic(n: int) -> str:
    topic = f"bench_{STAMP}_avro_{n}"
    print(f"bench: producing {n:,} Avro records to {topic} ({PARTITIONS} partitions) through "
          f"the registry at {REGISTRY_URL}", flush=True)
    produce(topic, n, serializer(topic))
    return topic


def run_one(name: str, topics: dict[str, str], n: int, run: int,
            env: dict) -> tuple[float, float, dict]:
    if name == "pipeline_avro":
        return run_pipeline("avro", topics["avro"], n, run, env, tag="_aavro",
                            tables=REGISTRY)
    if name == "pipeline_json":
        return run_pipeline("json", topics["json"], n, run, env, tag="_ajson")
    return (*run_peer(name, topics["avro"], n, run, env), {})


def bench_avro(sizes: list[int], env: dict) -> list[tuple[Result, list]]:
    """(result, load samples) per size and contender."""
    env = {**env, "SCHEMA_REGISTRY_URL": REGISTRY_URL}
    out = []
    for n in sizes:
        topics = {"json": bench_topic(n), "avro": avro_topic(n)}

        def topic_of(name: str, topics=topics) -> str:
            return topics["json" if name == "pipeline_json" else "avro"]

        def one(name: str, run: int, topics=topics, n=n) -> tuple[float, float, dict]:
            return run_one(name, topics, n, run, env)

        out += in_turns("avro", n, list(LABELS), topic_of, one)
    return out


def avro_report(rows: list[tuple[Result, list]]) -> str:
    """The issue's ratios: each contender's speed against the JSON sink (the Avro sink's
    target: >= 1), and this pipeline's Avro sink against each (Structured Streaming's
    target: >= 2)."""
    lines = ["| records | contender | runs | seconds (min-max) | rows/s (best) | speed "
             "relative to this pipeline's json sink | speed of this pipeline (avro) relative "
             "to it | peak RSS MB | read_and_stage (best) |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({r.size for r, _ in rows}):
        group = {r.name: r for r, _ in rows if r.size == n}
        json_s, avro_s = min(group["pipeline_json"].seconds), min(group["pipeline_avro"].seconds)
        for name, r in group.items():
            best = min(r.seconds)
            stage = (f"{min(p.get('read_and_stage', 0) for p in r.phases):.2f}"
                     if name.startswith("pipeline_") else "")
            lines.append(f"| {n:,} | {LABELS[name]} | {len(r.seconds)} | "
                         f"{best:.1f}-{max(r.seconds):.1f} | {n / best / 1000:,.1f}k | "
                         f"{json_s / best:.2f}x | {best / avro_s:.2f}x | "
                         f"{max(r.rss_mb):,.0f} | {stage} |")
    return "\n".join(lines)


def main(sizes: list[int], env: dict) -> int:
    rows = bench_avro(sizes, env)
    table = avro_report(rows)
    print(table)
    loads = [load for _, samples in rows for load, _ in samples]
    header = (f"Measured by `scripts/bench --avro {' '.join(map(str, sizes))}` on "
              f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} cores, `local[2]`, "
              f"Python {platform.python_version()}, the local stack and its Schema Registry "
              f"on the same machine; 1-minute load average before the runs "
              f"{min(loads):.2f}-{max(loads):.2f}. Every contender reads its topic from the "
              "start into a fresh table and is verified.\n\n![avro](benchmarks_avro.png)\n\n")
    write_between(("<!-- bench-avro:start -->", "<!-- bench-avro:end -->"), header + table)
    plot_rates([r for r, _ in rows], SHORT,
               "Avro: {n:,} orders, 4 partitions, 2 cores", ROOT / "docs" / "benchmarks_avro.png")
    print("bench: wrote the avro table in docs/benchmarks.md and docs/benchmarks_avro.png")
    return 0
