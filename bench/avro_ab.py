"""Paired A/B of the avro sink through the CLI (issue 26): two checkouts alternated on one
Avro topic (the bench orders through the stack's Schema Registry), with this checkout's json
sink on the same orders as JSON in each round as the baseline; each run into a fresh
verified table; wall seconds, CPU-seconds of the whole run (the CLI, its JVM, Spark's Python
workers; not Kafka, Postgres or the registry), peak RSS, read_and_stage, and the CPU-seconds
of the stack's Postgres over the run (its postmaster with every backend, ended ones
included: a private stack, so only this run's; the init-db before it counts too).

    .venv/bin/python -m bench.avro_ab N ROUNDS A_CHECKOUT B_CHECKOUT
    AVRO_AB_TOPIC=bench_..._avro_N .venv/bin/python -m bench.avro_ab ...  # a topic produced before
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.avro import REGISTRY, avro_topic
from bench.avro_orders import REGISTRY_URL
from bench.contenders import run_pipeline
from bench.harness import ROOT, bench_topic, postgres_cpu
from bench.transform_ab import TreeCpu


def main(argv: list[str]) -> int:
    n, rounds, a, b = int(argv[0]), int(argv[1]), argv[2], argv[3]
    topics = {"avro": os.environ.get("AVRO_AB_TOPIC") or avro_topic(n),
              "json": bench_topic(n)}
    runs = (("A avro", a, "avro"), ("B avro", b, "avro"), ("json", str(ROOT), "json"))
    for i in range(rounds):
        for label, root, fmt in runs:
            env = {**os.environ, "PYTHONPATH": root, "SCHEMA_REGISTRY_URL": REGISTRY_URL}
            load = os.getloadavg()[0]
            pg = postgres_cpu()
            cpu = TreeCpu()
            seconds, rss, timings = run_pipeline(
                fmt, topics[fmt], n, i, env, root=Path(root),
                tag=f"_ab{label[0].lower()}", tables=REGISTRY if fmt == "avro" else "")
            pg = postgres_cpu() - pg
            print(f"round {i} {label}: {seconds:.1f} s, {cpu.done():.1f} CPU-s, "
                  f"Postgres {pg:.1f} CPU-s, {rss:.0f} MB,"
                  f" read_and_stage {timings.get('read_and_stage', 0):.1f} s, load {load:.1f}; "
                  + ", ".join(f"{k} {v:.1f}" for k, v in cpu.kinds.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
