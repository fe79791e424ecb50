"""The experiments: every contender at each size (bench_size), the same json run on a
standalone cluster of 1, then 2 workers (scaling), and the sink modes on one topic
(bench_modes). Each returns its Results; bench/report.py turns them into tables."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg

from bench.contenders import BIG_ONLY, PEERS, init_db, pipeline_config, run_peer, run_pipeline
from bench.harness import (
    DB,
    ONLY,
    PY,
    REPEAT,
    ROOT,
    STAMP,
    Result,
    bench_topic,
    checkpoint,
    drop,
    expected,
    machine_load,
    timed,
    warm,
)
from bench.peers.verify import checksum


def bench_size(n: int, env: dict) -> list[Result]:
    topic = bench_topic(n)
    big = n >= 10_000_000
    repeat = 1 if big else REPEAT
    names = ["pipeline_json", "pipeline_raw", *PEERS]
    results = {name: Result(name, n) for name in names
               if (not big or name in BIG_ONLY) and (not ONLY or name in ONLY)}
    for run in range(repeat):
        for name, result in results.items():
            warm(topic)
            checkpoint()
            if name.startswith("pipeline_"):
                seconds, rss, phases = run_pipeline(name.split("_")[1], topic, n, run, env)
                result.phases.append(phases)
                print(f"bench: {n:,} {name} run {run + 1}: {seconds:.1f} s, peak RSS "
                      f"{rss:,.0f} MB, phases {phases}", flush=True)
            else:
                seconds, rss = run_peer(name, topic, n, run, env)
                print(f"bench: {n:,} {name} run {run + 1}: {seconds:.1f} s, peak RSS "
                      f"{rss:,.0f} MB", flush=True)
            result.seconds.append(seconds)
            result.rss_mb.append(rss)
    return list(results.values())


# ---- scaling: the same json run on a standalone cluster of 1, then 2 workers -------------
# Its own cluster (scripts/cluster) on ports of its own, so a test cluster on 7077 or
# someone's demo cluster is never touched; stopped at the end.
SCALING_PORTS = {"SPARK_MASTER_PORT": os.environ.get("BENCH_SPARK_MASTER_PORT", "7177"),
                 "SPARK_MASTER_WEBUI_PORT": os.environ.get("BENCH_SPARK_MASTER_WEBUI_PORT",
                                                           "8180"),
                 "SPARK_WORKER_WEBUI_PORT": os.environ.get("BENCH_SPARK_WORKER_WEBUI_PORT",
                                                           "8181")}
SCALING_WORKERS = (1, 2)
ARCHIVE = ROOT / "dist" / "pipeline-env.tar.gz"


def cluster(command: str, workers: int) -> None:
    env = {**os.environ, **SCALING_PORTS, "SPARK_WORKER_INSTANCES": str(workers),
           "SPARK_WORKER_CORES": "1"}
    done = subprocess.run([str(ROOT / "scripts" / "cluster"), command], env=env, text=True,
                          capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"bench: scripts/cluster {command} failed:\n{done.stderr}")


def cluster_spark(workers: int) -> str:
    """[spark] of a run on the bench cluster: the packed environment shipped to the
    executors (docs/cluster.md); every executor registered before the first task, so that
    the 2-worker runs use both from the start."""
    conf = {"spark.archives": f"{ARCHIVE}#job", "spark.pyspark.python": "./job/bin/python",
            "spark.driver.host": "127.0.0.1", "spark.cores.max": str(workers),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.executor.memory": "1g"}
    return (f'[spark]\nmaster = "spark://127.0.0.1:{SCALING_PORTS["SPARK_MASTER_PORT"]}"\n'
            "[spark.conf]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in conf.items()))


def scaling(sizes: list[int], env: dict) -> list[tuple[int, str, Result]]:
    """(size, setting, result) for local[2] and each cluster size, on the same topic."""
    done = subprocess.run([str(ROOT / "scripts" / "package")], text=True, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"bench: scripts/package failed:\n{done.stderr}")
    out = []
    for n in sizes:
        topic = bench_topic(n)
        settings = [("local[2]", "", None)] + [
            (f"{w} worker{'s' * (w > 1)}", cluster_spark(w), w) for w in SCALING_WORKERS]
        for label, spark, workers in settings:
            result = Result("pipeline_json", n)
            if workers:
                cluster("down", max(SCALING_WORKERS))  # any size left over from before
                cluster("up", workers)
            try:
                for run in range(REPEAT):
                    warm(topic)
                    checkpoint()
                    seconds, rss, phases = run_pipeline(
                        "json", topic, n, run, env, spark=spark,
                        tag=f"_w{workers}" if workers else "_local")
                    print(f"bench: scaling {n:,} {label} run {run + 1}: {seconds:.1f} s "
                          f"(driver's tree RSS {rss:,.0f} MB), phases {phases}", flush=True)
                    result.seconds.append(seconds)
                    result.rss_mb.append(rss)
                    result.phases.append(phases)
            finally:
                if workers:
                    cluster("down", max(SCALING_WORKERS))
            out.append((n, label, result))
    return out


# ---- sink modes: append, upsert, an upsert replay, aggregate on the same topic ----------
MODES = {
    "append": ("append (`pipeline run`, the json sink above)", "", ""),
    "upsert": ('upsert, `key = ["order_id"]` (`pipeline run`, every key new)',
               'mode = "upsert"\nkey = ["order_id"]\n', ""),
    "replay": ("upsert replay: `pipeline backfill` of the whole topic on the upsert table "
               "(every record already there: 0 rows change)", None, None),
    "aggregate": ('aggregate, `group_by = ["customer"]`: count(*), sum(amount), '
                  "min(placed_at), max(amount) (`pipeline run`)",
                  'mode = "aggregate"\ngroup_by = ["customer"]\n',
                  '[sink.aggregates]\norders = "count(*)"\ntotal = "sum(amount)"\n'
                  'first_placed = "min(placed_at)"\nbiggest = "max(amount)"\n'),
}
GROUPS = 97  # order(i): customer c{i % 97}
# The whole topic, whatever its records' timestamps: from before the first to after the last.
WHOLE_TOPIC = ["--from-time", "2000-01-01T00:00:00Z", "--to-time", "2100-01-01T00:00:00Z"]


def expected_groups(n: int) -> dict[str, tuple]:
    """customer -> (orders, total, first_placed, biggest), from the generator itself
    (pipeline.sample.order): what the aggregate table must hold after one run."""
    out: dict[str, list] = {}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(n):
        amount = Decimal(str(round(i * 1.25, 2)))
        g = out.get(f"c{i % GROUPS}")
        if g is None:
            out[f"c{i % GROUPS}"] = [1, amount, start + timedelta(minutes=i), amount]
        else:
            g[0] += 1
            g[1] += amount
            g[3] = max(g[3], amount)
    return {k: tuple(v) for k, v in out.items()}


def mode_cli(config: Path, topic: str, mode: str) -> list[str]:
    cli = [PY, "-m", "pipeline"]
    if mode == "replay":
        return [*cli, "backfill", "--config", str(config), "--topic", topic, *WHOLE_TOPIC,
                "--json"]
    return [*cli, "run", "--config", str(config), "--json"]


def verify_mode(mode: str, name: str, n: int, summary: dict, groups: dict) -> None:
    """The table each mode must leave, or the bench fails."""
    assert summary["records_read"] == n and summary["dead_letters"] == 0, (mode, summary)
    if mode in ("append", "upsert", "replay"):
        got = checksum(DB, name)
        assert tuple(got[:3]) == expected(n) and got[4] == n, (mode, name, got, expected(n))
        want_written = 0 if mode == "replay" else n
        assert summary["rows_written"] == want_written and summary["rows_deleted"] == 0, \
            (mode, summary)
    if mode == "replay":  # not one row rewritten: every row still the first run's
        with psycopg.connect(DB) as conn:
            runs = conn.execute(f"SELECT count(DISTINCT run_id) FROM {name}").fetchone()[0]
        assert runs == 1, (name, runs)
    if mode == "aggregate":
        with psycopg.connect(DB) as conn:
            rows = conn.execute(f"SELECT customer, orders, total, first_placed, biggest "
                                f"FROM {name}").fetchall()
        got = {r[0]: tuple(r[1:]) for r in rows}
        assert len(got) == GROUPS and got == groups, (name, len(got), {
            k: (got.get(k), v) for k, v in groups.items() if got.get(k) != v})
        assert summary["rows_written"] == GROUPS, summary


def bench_modes(sizes: list[int], env: dict) -> list[tuple[Result, list]]:
    """Per size, each mode BENCH_REPEAT times, each into a fresh table; the replay runs on
    the table its upsert run just wrote. Returns (result, load samples) per size and mode."""
    out = []
    for n in sizes:
        topic = bench_topic(n)
        groups = expected_groups(n)
        results = {m: (Result(m, n), []) for m in MODES}
        for run in range(REPEAT):
            upsert_table = ""
            for mode, (_, sink_mode, sink_tables) in MODES.items():
                with tempfile.TemporaryDirectory() as tmp:
                    config = Path(tmp) / "bench.toml"
                    if mode == "replay":
                        name = upsert_table
                        _, sink_mode, sink_tables = MODES["upsert"]
                    else:
                        name = f"b_m{mode}_{STAMP}_{n}_{run}"
                    pipeline_config(config, name, topic, "json", mode=sink_mode,
                                    tables=sink_tables)
                    if mode != "replay":
                        init_db(config, env)
                    warm(topic)
                    checkpoint()
                    load = machine_load()
                    seconds, rss, out_text = timed(mode_cli(config, topic, mode), env)
                summary = json.loads(out_text)
                verify_mode(mode, name, n, summary, groups)
                if mode == "upsert":
                    upsert_table = name  # the replay's table; dropped after it
                else:
                    drop(name)
                    if mode == "replay":
                        drop(f"{name}_deleted")
                result, loads = results[mode]
                result.seconds.append(seconds)
                result.rss_mb.append(rss)
                result.phases.append(summary["timings"])
                loads.append(load)
                print(f"bench: modes {n:,} {mode} run {run + 1}: {seconds:.1f} s, rows "
                      f"written {summary['rows_written']:,}, phases {summary['timings']}, "
                      f"load before {load[0]:.2f} ({load[1]} other pipeline processes)",
                      flush=True)
        out += list(results.values())
    return out
