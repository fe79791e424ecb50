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
from bench.transform_profile import TICK
from bench.transform_profile import descendants, processes

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"A": "pyspark.daemon", "B": "pipeline.executor.daemon"}


def is_worker(cmd: str) -> bool:
    """A Python daemon or worker (the JVM's command line names the daemon module too)."""
    return "java" not in cmd and ("pyspark.daemon" in cmd or "pyspark.worker" in cmd)


def pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class TreePss(TreeCpu):
    """TreeCpu, plus the peak PSS of the tree and of its Python workers."""

    def __init__(self):
        self.pss = self.workers_pss = self.workers_cpu = 0.0
        super().__init__()

    def sample(self):
        while not self.stop.wait(0.2):
            procs = processes(with_cmdline=True)
            total = workers = 0.0
            for pid in descendants(procs, os.getpid()):
                mb = pss_mb(pid)
                total += mb
                if is_worker(procs[pid][2]):
                    workers += mb
            self.pss, self.workers_pss = max(self.pss, total), max(self.workers_pss, workers)
            self.workers_cpu = max(self.workers_cpu, sum(
                sum(int(x) for x in procs[p][1][11:15]) / TICK
                for p in descendants(procs, os.getpid()) if is_worker(procs[p][2])))


def main(argv: list[str]) -> int:
    topic, n, rounds = argv[0], int(argv[1]), int(argv[2])
    kind = argv[3] if len(argv) > 3 else "json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{EXAMPLE}"}
    for i in range(rounds):
        for label in ("A", "B") if i % 2 == 0 else ("B", "A"):
            spark = f'[spark.conf]\n"spark.python.daemon.module" = "{SIDES[label]}"\n'
            pss = TreePss()
            cpu = TreeCpu()
            seconds, _, _ = run_pipeline("json", topic, n, i, env, root=ROOT,
                                         tag=f"_d{label.lower()}", spark="\n" + spark,
                                         sink=IDENTITY if kind == "identity" else "")
            cpu_s = cpu.done()
            pss.done()
            print(f"{kind} {n} round {i} {label}: {seconds:.1f} s, {cpu_s:.2f} CPU-s, "
                  f"workers {pss.workers_cpu:.2f} CPU-s, "
                  f"PSS tree {pss.pss:.0f} MB, workers {pss.workers_pss:.0f} MB, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
