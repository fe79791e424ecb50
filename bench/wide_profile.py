"""Where a wide topic's run spends its time, piece by piece (issue 29's profile):

    .venv/bin/python -m bench.wide_profile [BASELINE_CHECKOUT]

On one topic of 200 partitions x 100 JSON records: a range read the way the reader did
before (consume(10_000, timeout=1.0) per range, its own consumer), a range read with its
own consumer but the new stopping rule, all 200 read by one consumer; a Postgres connection;
200 Spark tasks against 2 (Python tasks that do nothing). Needs the stack (scripts/stack up)
and PIPELINE_TEST_BOOTSTRAP_SERVERS / PIPELINE_TEST_DATABASE_URL as scripts/bench sets them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import BOOTSTRAP, DB, STAMP  # noqa: E402
from bench.wide import produce_wide  # noqa: E402
from pipeline.executor.consume import read_range, read_ranges, reader_config  # noqa: E402
from pipeline.plan.offsets import OffsetRange  # noqa: E402

PARTITIONS, PER = 200, 100
SAMPLE = 10  # ranges timed one by one (each old-style read waits ~1 s)


def clock(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def drain(reader, *args) -> int:
    return sum(len(records) for records in reader(*args))


def main(argv: list[str]) -> int:
    topic = f"bench_wide_profile_{STAMP}"
    produce_wide(topic, PARTITIONS, PER)
    ranges = [OffsetRange(topic, p, 0, PER) for p in range(PARTITIONS)]
    config = reader_config({"bootstrap.servers": BOOTSTRAP}, "read_committed", "profile")
    out: dict[str, float] = {}
    if argv:  # the reader as the given checkout has it
        spec = importlib.util.spec_from_file_location(
            "old_consume",
            Path(argv[0]) / "pipeline/executor/consume.py")
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        out["old reader, own consumer, per range"] = sum(
            clock(lambda r=r: drain(old.read_range, config, r, 30)) for r in ranges[:SAMPLE]
        ) / SAMPLE
    out["new stopping rule, own consumer, per range"] = sum(
        clock(lambda r=r: drain(read_range, config, r, 30)) for r in ranges[:SAMPLE]) / SAMPLE
    got = []
    out["one consumer for all 200 ranges, per range"] = clock(lambda: got.append(sum(
        len(records) for _, records in read_ranges(config, ranges, 30)))) / PARTITIONS
    assert got == [PARTITIONS * PER], got

    import psycopg

    out["Postgres connection, per task"] = sum(
        clock(lambda: psycopg.connect(DB).close()) for _ in range(SAMPLE)) / SAMPLE

    from pipeline.spark.session import get_context

    sc = get_context("local[2]")
    sc.parallelize([0], 1).mapPartitions(lambda it: [sum(1 for _ in it)]).collect()  # warm
    for tasks in (PARTITIONS, 2):
        out[f"Spark: 200 items in {tasks} Python tasks, whole job"] = clock(
            lambda tasks=tasks: sc.parallelize(range(PARTITIONS), tasks).mapPartitions(
                lambda it: [sum(1 for _ in it)]).collect())
    sc.stop()
    for what, seconds in out.items():
        print(f"| {what} | {seconds * 1000:,.1f} ms |")
    print(f"load average: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
