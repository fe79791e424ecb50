"""Paired A/B of Spark's Python daemon module (issue: preimported workers): the same
checkout, A with pyspark's own daemon, B with ours (pipeline/executor/daemon.py, the
default), alternated on one topic, each run into a fresh verified table. Per run: wall
seconds, CPU-seconds of the whole run (the CLI, its JVM, Spark's Python workers; not Kafka
or Postgres), the workers' CPU-s, and the peak PSS (MB, /proc/PID/smaps_rollup) of the
tree and of the workers: a worker's RSS counts the pages it shares with its daemon, PSS
splits them.

    .venv/bin/python -m bench.daemon_ab TOPIC N ROUNDS [json|identity]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.contenders import run_pipeline
from bench.transform import EXAMPLE, IDENTITY
from bench.transform_ab import TreeCpu

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"A": "pyspark.daemon", "B": "pipeline.executor.daemon"}
WORKERS = "python workers"  # transform_profile.process_kind's name for the daemon and workers


def main(argv: list[str]) -> int:
    topic, n, rounds = argv[0], int(argv[1]), int(argv[2])
    kind = argv[3] if len(argv) > 3 else "json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{EXAMPLE}"}
    for i in range(rounds):
        for label in ("A", "B") if i % 2 == 0 else ("B", "A"):
            spark = f'[spark.conf]\n"spark.python.daemon.module" = "{SIDES[label]}"\n'
            tree = TreeCpu()  # CPU, and RSS and PSS by kind of process, at their peaks
            seconds, _, _ = run_pipeline("json", topic, n, i, env, root=ROOT,
                                         tag=f"_d{label.lower()}", spark="\n" + spark,
                                         sink=IDENTITY if kind == "identity" else "")
            cpu_s = tree.done()
            print(f"{kind} {n} round {i} {label}: {seconds:.1f} s, {cpu_s:.2f} CPU-s, "
                  f"workers {tree.kinds.get(WORKERS, 0.0):.2f} CPU-s, "
                  f"PSS tree {tree.tree_pss:.0f} MB, workers {tree.pss.get(WORKERS, 0.0):.0f} MB, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
