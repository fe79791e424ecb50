"""Paired A/B of the transform path through the CLI (issue 25): two checkouts alternated
on one topic, each run into a fresh verified table, wall seconds, CPU-seconds of the whole
run (the CLI, its JVM, Spark's Python workers; not Kafka or Postgres), the CPU-seconds of
the stack's Postgres over the run (harness.postgres_cpu: a private stack, so only this
run's, its init-db included) and peak RSS.

    .venv/bin/python -m bench.transform_ab TOPIC N ROUNDS A_CHECKOUT B_CHECKOUT [KIND]

KIND: identity (the default), enrich (conf/examples/transform.toml) or json (no transform).
BENCH_SPARK: a [spark] section for both (e.g. a [spark.conf] with JVM flags). BENCH_B_ENV:
environment settings for B only, as a shell would split them (e.g. "MALLOC_ARENA_MAX=2", or
JAVA_TOOL_OPTIONS=-Xmx512m): A/B of a setting on one checkout. Each line prints
CPU-seconds, ``spark_start`` and the seconds outside the run's own timer (the CLI's
imports before it, the process's exit after it: wall minus ``total``), the peak RSS by kind
of process, and the peak of the tree's summed RSS and PSS (/proc/<pid>/smaps_rollup,
sampled at one instant; PSS counts the pages forked workers share once).
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from pathlib import Path

from bench.contenders import run_pipeline
from bench.harness import postgres_cpu
from bench.transform import ENRICH, ENRICHED_COLUMNS, EXAMPLE, IDENTITY
from bench.transform_profile import tree_cpu, tree_cpu_by_kind, tree_pss_by_kind, tree_rss_by_kind


class TreeCpu:
    """CPU-seconds of this process's descendants, sampled every 0.2 s: a JVM its CLI does
    not wait for is not in getrusage's children (a process exiting between two samples
    loses at most 0.2 s)."""

    def __init__(self):
        self.peak, self.stop, self.kinds, self.rss = 0.0, threading.Event(), {}, {}
        self.pss: dict[str, float] = {}
        self.tree_rss = self.tree_pss = 0.0
        self.base = tree_cpu(os.getpid())
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self):
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, tree_cpu(os.getpid()) - self.base)
            for k, v in tree_cpu_by_kind(os.getpid()).items():
                self.kinds[k] = max(self.kinds.get(k, 0.0), v)
            rss, pss = tree_rss_by_kind(os.getpid()), tree_pss_by_kind(os.getpid())
            for k, v in rss.items():
                self.rss[k] = max(self.rss.get(k, 0.0), v)
            for k, v in pss.items():
                self.pss[k] = max(self.pss.get(k, 0.0), v)
            self.tree_rss = max(self.tree_rss, sum(rss.values()))
            self.tree_pss = max(self.tree_pss, sum(pss.values()))

    def done(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak


def main(argv: list[str]) -> int:
    topic, n, rounds, a, b = argv[0], int(argv[1]), int(argv[2]), argv[3], argv[4]
    kind = argv[5] if len(argv) > 5 else "identity"
    for i in range(rounds):
        for label, root in (("A", a), ("B", b)):
            env = {**os.environ, "PYTHONPATH": f"{root}:{EXAMPLE}"}
            if label == "B":
                b_env = shlex.split(os.environ.get("BENCH_B_ENV", ""))
                env.update(kv.split("=", 1) for kv in b_env)
            kw = {}
            if kind == "identity":
                kw = {"sink": IDENTITY}
            elif kind == "enrich":
                from bench.transform import check_enriched as enriched_check
                kw = {"sink": ENRICH, "more_columns": ENRICHED_COLUMNS,
                      "check": enriched_check}
            load = os.getloadavg()[0]
            pg = postgres_cpu()
            cpu = TreeCpu()
            seconds, rss, timings = run_pipeline("json", topic, n, i, env, root=Path(root),
                                                 tag=f"_{kind}_{label.lower()}",
                                                 spark=os.environ.get("BENCH_SPARK", ""),
                                                 **kw)
            pg = postgres_cpu() - pg
            print(f"{kind} round {i} {label}: {seconds:.1f} s, {cpu.done():.1f} CPU-s,"
                  f" Postgres {pg:.1f} CPU-s,"
                  f" {rss:.0f} MB, read_and_stage {timings.get('read_and_stage', 0):.1f} s,"
                  f" spark_start {timings.get('spark_start', 0):.2f} s, outside the run"
                  f" {seconds - timings.get('total', 0):.2f} s,"
                  f" load {load:.1f}; " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.kinds.items())
                  + "; peak MB " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.rss.items())
                  + f"; tree RSS {cpu.tree_rss:.0f} PSS {cpu.tree_pss:.0f} MB (PSS "
                  + ", ".join(f"{k} {v:.0f}" for k, v in cpu.pss.items()) + ")",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
