"""Wide topics: many partitions, a few records each (``scripts/bench --wide``).

The scheduled run of a real topic is mostly this shape: 32 to 256 partitions and a trickle
of traffic, so a run's fixed cost per partition decides whether a 5-minute schedule keeps
up. Scenarios (partitions x records per partition, JSON orders):

    256 x 100, 64 x 1,000   this pipeline vs Structured Streaming AvailableNow (foreachBatch
                            -> mapInArrow + COPY) vs the single Python process
    200 x 100, 4 x 5,000    the same 20,000 records on a wide and a narrow topic: this
                            pipeline only (the target: the wide run within 2x of the narrow);
                            on 200 x 100 also the transform path (an identity transform over
                            the built-in path's own read tasks, executor/transform/feed.py)

All contenders of all shapes run in turns (A, B, C, A, B, C: BENCH_REPEAT rounds), so a
change in the load of this shared machine falls on all of them; the 1-minute load average
and the other pipeline processes are sampled before each run. BENCH_BASELINE=<checkout>
adds the pipeline as that checkout has it (e.g. the main branch before this change), run
through the same CLI with PYTHONPATH pointing there (on 200 x 100 and 4 x 5,000). Every
run is verified like the main table (count, sums, distinct coordinates). The table goes
between the bench-wide markers of docs/benchmarks.md, the plot to docs/benchmarks_wide.png.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.contenders import run_peer, run_pipeline
from bench.harness import BOOTSTRAP, REPEAT, ROOT, STAMP, Result, checkpoint, machine_load, warm
from bench.report import write_between
from pipeline.sample import order

SCENARIOS = [(256, 100), (64, 1_000), (200, 100), (4, 5_000)]
# BENCH_WIDE=256x100,200x100: only these shapes (a machine too busy for all of them);
# BENCH_TOPIC_200x100=<topic> reuses a topic of that shape; BENCH_WIDE_TRANSFORM=0 leaves
# the transform path out.
SCENARIOS = [s for s in SCENARIOS if not os.environ.get("BENCH_WIDE")
             or f"{s[0]}x{s[1]}" in os.environ["BENCH_WIDE"].split(",")]
PEERS_FOR = {(256, 100): ("sss_arrow", "single_process"),
             (64, 1_000): ("sss_arrow", "single_process")}
BASELINE = os.environ.get("BENCH_BASELINE", "")
# The baseline pays ~1 s per partition: only on the issue's own pair of shapes.
BASELINE_FOR = {(200, 100), (4, 5_000)}
# The transform path (fed by the built-in path's read tasks: small ranges packed, as the
# json sink's) with a transform that changes nothing.
TRANSFORM_FOR = {(200, 100)} if os.environ.get("BENCH_WIDE_TRANSFORM", "1") != "0" else set()
IDENTITY = 'transform = "tests.integration.transforms.orders:identity"\n'
LABEL = {"pipeline_json": "this pipeline, json sink (`pipeline run`)",
         "baseline": "this pipeline before issue 29 (one task, consumer and 1 s wait per "
                     "partition)",
         "transform": "this pipeline, transform path (its own read tasks, identity transform)",
         "baseline_transform": "the transform path before issue 29 (a task per partition)",
         "sss_arrow": "Spark Structured Streaming AvailableNow, foreachBatch -> mapInArrow + "
                      "COPY",
         "single_process": "one Python process: confluent-kafka + orjson + binary COPY"}


def produce_wide(topic: str, partitions: int, per_partition: int) -> None:
    """``partitions * per_partition`` orders, order i in partition i % partitions."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    time.sleep(1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 50})
    for i in range(partitions * per_partition):
        while True:
            try:
                p.produce(topic, key=f"order-{i}".encode(), value=order(i),
                          partition=i % partitions)
                break
            except BufferError:
                p.poll(0.1)
    assert p.flush(120) == 0


def bench_wide(env: dict) -> list[tuple[tuple[int, int], Result, list]]:
    """Every topic produced first; then BENCH_REPEAT rounds, each running every contender of
    every shape once (200 x 100 and 4 x 5,000 side by side too, not minutes apart)."""
    topics, plans = {}, {}
    for partitions, per in SCENARIOS:
        n = partitions * per
        topics[(partitions, per)] = topic = (
            os.environ.get(f"BENCH_TOPIC_{partitions}x{per}")
            or f"bench_wide_{STAMP}_{partitions}x{per}")
        if not os.environ.get(f"BENCH_TOPIC_{partitions}x{per}"):
            print(f"bench: producing {n:,} records to {topic} ({partitions} partitions)",
                  flush=True)
            produce_wide(topic, partitions, per)
        names = ["pipeline_json",
                 *(["baseline"] if BASELINE and (partitions, per) in BASELINE_FOR else []),
                 *(["transform"] if (partitions, per) in TRANSFORM_FOR else []),
                 *(["baseline_transform"] if BASELINE and (partitions, per) in TRANSFORM_FOR
                   else []),
                 *PEERS_FOR.get((partitions, per), ())]
        plans[(partitions, per)] = {name: (Result(name, n), []) for name in names}
    for run in range(REPEAT):
        for (partitions, per), results in plans.items():
            n, topic = partitions * per, topics[(partitions, per)]
            for name, (result, loads) in results.items():
                warm(topic)
                checkpoint()
                load = machine_load()
                if name == "pipeline_json":
                    seconds, rss, phases = run_pipeline("json", topic, n, run, env,
                                                        tag=f"w{partitions}")
                elif name in ("baseline", "transform", "baseline_transform"):
                    root = Path(BASELINE) if name.startswith("baseline") else ROOT
                    seconds, rss, phases = run_pipeline(
                        "json", topic, n, run, {**env, "PYTHONPATH": str(root)},
                        tag=f"{name[:6]}{name[-2:]}{partitions}", root=root,
                        sink=IDENTITY if name.endswith("transform") else "")
                else:
                    seconds, rss = run_peer(name, topic, n, run, env)
                    phases = {}
                result.seconds.append(seconds)
                result.rss_mb.append(rss)
                result.phases.append(phases)
                loads.append(load)
                print(f"bench: wide {partitions}x{per} {name} run {run + 1}: {seconds:.1f} s, "
                      f"phases {phases}, load before {load[0]:.2f} ({load[1]} other "
                      "pipeline processes)", flush=True)
    return [(shape, r, loads) for shape, results in plans.items()
            for r, loads in results.values()]


def wide_report(rows: list[tuple[tuple[int, int], Result, list]]) -> str:
    lines = ["| partitions x records | contender | runs | seconds (min-max) | speed of this "
             "pipeline relative to it (best runs) | spark_start | read_and_stage | publish |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    best = {(shape, r.name): min(r.seconds) for shape, r, _ in rows}
    for shape, r, _ in rows:
        ours = best[(shape, "pipeline_json")]
        phase = {k: min((p.get(k, 0) for p in r.phases if p), default=None)
                 for k in ("spark_start", "read_and_stage", "publish")}
        cells = " | ".join("-" if v is None else f"{v:.2f}" for v in phase.values())
        lines.append(f"| {shape[0]} x {shape[1]:,} | {LABEL[r.name]} | {len(r.seconds)} | "
                     f"{min(r.seconds):.1f}-{max(r.seconds):.1f} | "
                     f"{min(r.seconds) / ours:.2f} | {cells} |")
    wide = best.get(((200, 100), "pipeline_json"))
    narrow = best.get(((4, 5_000), "pipeline_json"))
    if wide and narrow:
        lines += ["", f"20,000 records on 200 partitions against the same on 4: "
                  f"{wide:.1f} s / {narrow:.1f} s = **{wide / narrow:.2f}x** (target: within 2x)."]
    sss = best.get(((256, 100), "sss_arrow"))
    if sss:
        ours = best[((256, 100), "pipeline_json")]
        lines.append(f"256 x 100: Structured Streaming {sss:.1f} s / this pipeline {ours:.1f} s "
                     f"= **{sss / ours:.2f}x** (target: at least 2x).")
    return "\n".join(lines)


def wide_plot(rows: list[tuple[tuple[int, int], Result, list]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(shape for shape, _, _ in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        group = [r for s, r, _ in rows if s == shape]
        names = [{"pipeline_json": "this pipeline", "baseline": "before #29",
                  "transform": "transform path", "baseline_transform": "transform, before",
                  "sss_arrow": "Spark SS", "single_process": "single process"}[r.name]
                 for r in group]
        seconds = [min(r.seconds) for r in group]
        colors = ["#aa3377" if r.name == "pipeline_json" else "#4477aa" for r in group]
        ax.barh(names[::-1], seconds[::-1], color=colors[::-1])
        ax.set_xlabel("seconds, best run (lower is better)")
        ax.set_title(f"{shape[0]} partitions x {shape[1]:,}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def rows_from_log(text: str) -> list[tuple[tuple[int, int], Result, list]]:
    """The rows of the 'bench: wide ...' lines a run printed: a report of the runs that
    finished when a busy machine did not leave time for all of them."""
    import ast
    import re

    rows: dict[tuple, tuple] = {}
    for m in re.finditer(r"^bench: wide (\d+)x(\d+) (\w+) run \d+: ([\d.]+) s, phases "
                         r"(\{.*?\}), load before ([\d.]+) \((\d+) other", text, re.M):
        shape = (int(m[1]), int(m[2]))
        result, loads = rows.setdefault((shape, m[3]), (Result(m[3], shape[0] * shape[1]), []))
        result.seconds.append(float(m[4]))
        result.phases.append(ast.literal_eval(m[5]))
        loads.append((float(m[6]), int(m[7])))
    return [(shape, r, loads) for (shape, _), (r, loads) in rows.items()]


def main(env: dict, log: str = "") -> int:
    """``log``: report from a run's printed lines instead of running (--from-log FILE)."""
    rows = rows_from_log(Path(log).read_text()) if log else bench_wide(env)
    table = wide_report(rows)
    print(table)
    loads = [load for _, _, samples in rows for load, _ in samples]
    header = (f"Measured by `scripts/bench --wide` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: "
              f"{os.cpu_count()} cores, `local[2]`, Python {platform.python_version()}, the "
              "local stack on the same machine, shared with other work: 1-minute load "
              f"average before the runs {min(loads):.2f}-{max(loads):.2f}. Contenders ran "
              "in turns (A, B, C, A, B, C), each into a fresh table, each run verified.\n\n")
    write_between(("<!-- bench-wide:start -->", "<!-- bench-wide:end -->"), header + table)
    wide_plot(rows, ROOT / "docs" / "benchmarks_wide.png")
    print("bench: wrote the wide-topic table in docs/benchmarks.md, docs/benchmarks_wide.png")
    return 0
