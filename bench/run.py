"""This pipeline against what a user would write instead, on the same topic, same run.

    scripts/bench                    # 2,000,000 records, every contender twice
    scripts/bench 200000             # any sizes; BENCH_REPEAT=3 for more runs
    scripts/bench 2000000 20000000   # at 20M only this pipeline and Spark Structured
                                     # Streaming run (once each), plus peak RSS
    scripts/bench --scaling 2000000  # only the scaling line: the same json run on a Spark
                                     # standalone cluster of 1, then 2 one-core workers
                                     # (scripts/cluster on its own ports), local[2] beside
    scripts/bench --modes 2000000    # only the sink modes: append, upsert, an upsert replay
                                     # (backfill), aggregate; each BENCH_REPEAT times
    scripts/bench --transform [N ...]  # only user transforms (2,000,000): the built-in
                                     # path, + identity transform, + the realistic one of
                                     # conf/examples/transform.toml, against Structured
                                     # Streaming with and without it (bench/transform.py)
    scripts/bench --avro [N ...]     # only Avro (2,000,000): the same orders as Confluent
                                     # wire-format Avro through the stack's Schema Registry
                                     # and as JSON; this pipeline's avro sink against its
                                     # json sink, Structured Streaming + from_avro and one
                                     # Python process with fastavro (bench/avro.py)
    scripts/bench --cdc [N]          # only whole-database CDC: the sample shop's workload of N
                                     # source transactions (10,000) through Debezium, then
                                     # this pipeline against Debezium's JDBC sink on the same
                                     # topics: events/s, torn transactions a reader saw, the
                                     # replicas against the source (bench/cdc.py)
    scripts/bench --wide             # only wide topics: 256 x 100 and 64 x 1,000 records
                                     # against the peers, 200 x 100 against 4 x 5,000
                                     # (bench/wide.py); BENCH_BASELINE=<checkout> adds it;
                                     # --from-log FILE reports the printed runs of one
    scripts/bench --paired CHECKOUT [N]  # this checkout against another (e.g. a worktree
                                     # of an older commit) on json, identity transform and
                                     # avro, in turns (bench/paired.py)

Each size is produced once (JSON orders, 4 partitions). Every contender runs as its own
process, as a user would start it (the pipeline through its CLI, so each run pays its own
JVM start), reads the whole topic into a fresh table keyed by (topic, partition, offset),
and is checked afterwards: row count and checksums of the typed columns must equal what
was produced, or the bench fails. The peak RSS of each contender's whole process tree
(driver, JVM, Python workers) is sampled from /proc. Results: docs/benchmarks.md and
docs/benchmarks.png; the pipeline's phase split is printed for every run. ``--scaling``
writes its own table (between the bench-scaling markers of docs/benchmarks.md) and leaves
the main one alone.

``--modes`` runs the json sink in each ``[sink] mode`` on one topic, each into a fresh table
through the CLI: append; upsert with ``key = ["order_id"]`` (every key new); the upsert
replay, ``pipeline backfill`` of the whole topic on the table the upsert run just wrote
(every record older than or equal to the stored one: ``rows_written`` must be 0 and no row
may change); aggregate with ``group_by = ["customer"]`` (count, sum, min, max). The append
and upsert tables are checked like the main table, the aggregate's 97 groups against the
generator. Its table (the best phases; the machine's load before the runs) goes between
the bench-modes markers of docs/benchmarks.md.
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.contenders import class_archives, empty_run  # noqa: E402
from bench.experiments import bench_modes, bench_size, scaling  # noqa: E402
from bench.harness import BOOTSTRAP, DB, ONLY, Result  # noqa: E402
from bench.report import modes_report, plot, report, scaling_report, write_between  # noqa: E402


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):  # before anything runs: a benchmark takes minutes
        print(__doc__)
        return 0
    scale, modes = "--scaling" in argv, "--modes" in argv
    sizes = [int(a) for a in argv if a.isdigit()] or [2_000_000]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1",
           "PIPELINE_TEST_BOOTSTRAP_SERVERS": BOOTSTRAP, "PIPELINE_TEST_DATABASE_URL": DB}
    for name in [n for n in env if n.startswith("PIPELINE__")] + ["PIPELINE_DATABASE_URL",
                                                                    "KAFKA_BOOTSTRAP_SERVERS"]:
        env.pop(name, None)  # the configs the benchmark writes say where everything is
    if not scale:  # a cluster's driver maps no archive (spark/class_archive.py)
        class_archives(env)
    if "--transform" in argv:
        from bench import transform

        return transform.main(sizes, env)
    if "--avro" in argv:
        from bench import avro

        return avro.main(sizes, env)
    if "--cdc" in argv:
        from bench import cdc

        return cdc.main(sizes if any(a.isdigit() for a in argv) else [], env)
    if "--paired" in argv:
        from bench import paired

        return paired.main(sizes, env, argv[argv.index("--paired") + 1])
    if "--wide" in argv:
        from bench import wide

        log = argv[argv.index("--from-log") + 1] if "--from-log" in argv else ""
        return wide.main(env, log)
    if scale:
        table = scaling_report(scaling(sizes, env))
        print(table)
        header = (f"Measured by `scripts/bench --scaling {' '.join(map(str, sizes))}` on "
                  f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} cores, Python "
                  f"{platform.python_version()}; Kafka, Postgres, the driver and every "
                  "worker on this one machine. The same json run, from the start of the "
                  "same topic into a fresh table each time, verified like the main table; "
                  "phases are the best of the runs.\n\n")
        write_between(("<!-- bench-scaling:start -->", "<!-- bench-scaling:end -->"),
                      header + table)
        print("bench: wrote the scaling table in docs/benchmarks.md")
        return 0
    if modes:
        rows = bench_modes(sizes, env)
        table = modes_report(rows)
        print(table)
        loads = [load for _, samples in rows for load, _ in samples]
        others = max(o for _, samples in rows for _, o in samples)
        busy = (f"at most {others} other pipeline process{'es' if others > 1 else ''} running"
                 if others else "no other pipeline process running")
        header = (f"Measured by `scripts/bench --modes {' '.join(map(str, sizes))}` on "
                  f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} cores, "
                  f"`local[2]`, Python {platform.python_version()}, the local stack on the "
                  f"same machine; 1-minute load average before the runs {min(loads):.2f}-"
                  f"{max(loads):.2f}, {busy}. "
                  "Every run reads the same topic from the start into a fresh table (the "
                  "replay: into its upsert run's table) and is verified; phases are the "
                  "best of the runs.\n\n")
        write_between(("<!-- bench-modes:start -->", "<!-- bench-modes:end -->"),
                      header + table)
        print("bench: wrote the sink modes table in docs/benchmarks.md")
        return 0
    all_results: list[Result] = []
    for n in sizes:
        all_results += bench_size(n, env)
    if ONLY:
        return 0
    empty = empty_run(env)
    table = report(all_results, empty)
    print(table)
    docs = ROOT / "docs"
    header = (f"Measured by `scripts/bench {' '.join(map(str, sizes))}` on "
              f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC: {os.cpu_count()} cores, "
              f"`local[2]`, Python {platform.python_version()}, the local stack "
              "(Kafka KRaft, PostgreSQL 15) on the same machine. Every contender reads the "
              "same topic from the start into its own fresh table keyed by (topic, partition, "
              "offset), as its own process; each table is verified (count, sums of the typed "
              "columns) against what was produced.\n\n")
    write_between(("<!-- bench:start -->", "<!-- bench:end -->"), header + table)
    plot(all_results, docs / "benchmarks.png")
    print("bench: wrote docs/benchmarks.md and docs/benchmarks.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
