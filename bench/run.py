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
    scripts/bench --wide             # only wide topics: 256 x 100 and 64 x 1,000 records
                                     # against the peers, 200 x 100 against 4 x 5,000
                                     # (bench/wide.py); BENCH_BASELINE=<checkout> adds it;
                                     # --from-log FILE reports the printed runs of one

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
generator. Its table (with each run's phases and the machine's load before it) goes between
the bench-modes markers of docs/benchmarks.md. ``python -m bench.merge_profile`` times the
statements of the upsert and aggregate merges alone.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peers.verify import checksum  # noqa: E402
from pipeline.sample import order  # noqa: E402

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
DB = os.environ.get("PIPELINE_TEST_DATABASE_URL",
                    "postgresql://postgres@127.0.0.1:5433/pipeline_test")
PARTITIONS = 4
REPEAT = int(os.environ.get("BENCH_REPEAT", "2"))
# BENCH_ONLY=pipeline_json,sss_arrow: a quick look at some contenders; docs are not written.
ONLY = [n for n in os.environ.get("BENCH_ONLY", "").split(",") if n]
# BENCH_TOPIC=<existing topic of N records>[,...]: reuse them instead of producing again
# (a topic is used for the size its name ends with, e.g. bench_..._2000000).
TOPICS = [t for t in os.environ.get("BENCH_TOPIC", "").split(",") if t]
STAMP = datetime.now(UTC).strftime("%m%d%H%M%S")
PY = sys.executable

# name -> (label, command builder); {topic} {table} {config} are filled in per run.
PEERS = {
    "single_process": "one Python process: confluent-kafka consume(num_messages) + orjson + "
                      "binary COPY, offsets in the same transaction",
    "sss_jdbc": "Spark Structured Streaming AvailableNow, from_json, foreachBatch -> JDBC",
    "sss_arrow": "Spark Structured Streaming AvailableNow, from_json, foreachBatch -> "
                 "mapInArrow + CSV COPY",
    "textbook": "the textbook loop: poll one, json.loads, executemany per 1,000, "
                "DB commit then Kafka commit",
}
PIPELINE_JSON = "**this pipeline, json sink** (`pipeline run`)"
PIPELINE_RAW = "this pipeline, raw sink (`pipeline run`)"
BIG_ONLY = ("pipeline_json", "sss_jdbc", "sss_arrow")  # what runs at sizes >= 10M


@dataclass
class Result:
    name: str
    size: int
    seconds: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)


def produce(topic: str, n: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    time.sleep(1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 50, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 2_000_000})
    for i in range(n):
        while True:
            try:
                p.produce(topic, key=f"order-{i}".encode(), value=order(i),
                          partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.1)
        if i % 50_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def expected(n: int) -> tuple:
    """What every contender's table must hold, computed from the generator itself."""
    amounts = sum(Decimal(str(round(i * 1.25, 2))) for i in range(n))
    return (n, n * (n - 1) // 2, amounts)


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and all its descendants, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(rss.get(p, 0) for p in tree) / 2**20


def timed(cmd: list[str], env: dict, cwd: Path = ROOT) -> tuple[float, float, str]:
    """(seconds, peak RSS MB of the process tree, stdout)."""
    peak = 0.0
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.25):
            peak = max(peak, tree_rss_mb(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return seconds, peak, out


def pipeline_config(path: Path, name: str, topic: str, fmt: str, spark: str = "",
                    mode: str = "", tables: str = "") -> None:
    """``spark``: a [spark] section (e.g. a cluster master); none = the default local[2].
    ``mode``: more [sink] keys (a sink mode and its key), ``tables``: sub-tables of [sink]
    after the columns (e.g. [sink.aggregates])."""
    columns = ('[sink.columns]\norder_id = "long not null"\ncustomer = "string not null"\n'
               'amount = "decimal(12,2)"\nplaced_at = "timestamp"\n') if fmt == "json" else ""
    path.write_text(
        f'[pipeline]\nname = "{name}"\n[kafka]\nbootstrap_servers = "{BOOTSTRAP}"\n'
        f'topics = ["{topic}"]\nmax_records_per_partition = 0\nmax_records_per_run = 0\n'
        f'[database]\nurl = "{DB}"\n[sink]\nformat = "{fmt}"\ntable = "{name}"\n'
        f'max_bad_records = 0\n{mode}{columns}{tables}{spark}')


def run_pipeline(fmt: str, topic: str, n: int, run: int, env: dict, *, spark: str = "",
                 tag: str = "", root: Path = ROOT, sink: str = "") -> tuple[float, float, dict]:
    """``root``: the checkout whose pipeline runs (its own package first on the path);
    ``sink``: more [sink] keys (e.g. a transform)."""
    name = f"b_{fmt}{tag}_{STAMP}_{n}_{run}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.toml"
        pipeline_config(config, name, topic, fmt, spark, mode=sink)
        cli = [PY, "-m", "pipeline"]
        subprocess.run([*cli, "init-db", "--config", str(config)], env=env, check=True,
                       capture_output=True, cwd=root)
        seconds, rss, out = timed([*cli, "run", "--config", str(config), "--json"], env,
                                  cwd=root)
    summary = json.loads(out)
    assert summary["records_read"] == n, summary
    if fmt == "json":
        got = checksum(DB, name)
        assert tuple(got[:3]) == expected(n) and got[4] == n, (name, got, expected(n))
    else:
        with psycopg.connect(DB) as conn:
            count, distinct = conn.execute(
                f'SELECT count(*), count(DISTINCT ("partition", "offset")) FROM {name}'
            ).fetchone()
        assert count == n and distinct == n, (name, count, distinct)
    drop(name)
    return seconds, rss, summary["timings"]


def run_peer(peer: str, topic: str, n: int, run: int, env: dict) -> tuple[float, float]:
    table = f"b_{peer}_{STAMP}_{n}_{run}"
    seconds, rss, out = timed([PY, "-m", f"bench.peers.{peer}", "--topic", topic,
                               "--table", table], env)
    reported = json.loads(out.strip().splitlines()[-1])
    got = checksum(DB, table)
    assert reported["rows"] == n and tuple(got[:3]) == expected(n) and got[4] == n, \
        (peer, reported, got, expected(n))
    drop(table)
    return seconds, rss


def warm(topic: str) -> None:
    """Read the whole topic once before each contender, so that every contender finds the
    broker's log in the page cache. This machine's memory manager evicts pages that were
    not used for a while (buff/cache stayed ~2 GB with 21 GB free): without this, the first
    contender after a pause read a 20M topic partly from disk (a pipeline run of 94-104 s
    took 114-172 s), and whoever ran next found it cached."""
    import pyspark
    from confluent_kafka import Consumer, TopicPartition

    # Spark's and the connector's jars likewise: the first JVM after a pause otherwise
    # starts in ~5 s instead of ~3.
    for jar in [*Path(pyspark.__file__).parent.glob("jars/*.jar"),
                *(ROOT / ".jars").glob("*/*.jar")]:
        jar.read_bytes()
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "bench-warm",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.queue.backoff.ms": 10})
    try:
        md = c.list_topics(topic, timeout=10)
        c.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
        at_end: set[int] = set()
        while len(at_end) < len(md.topics[topic].partitions):
            for m in c.consume(num_messages=100_000, timeout=1.0):
                if m.error() is not None and m.error().code() == m.error()._PARTITION_EOF:
                    at_end.add(m.partition())
    finally:
        c.close()


def checkpoint() -> None:
    """Every contender starts from a checkpointed server: otherwise the WAL written by the
    one before (~5 GB per 20M rows) triggers a checkpoint, and its full-page writes, in the
    middle of whoever runs next."""
    with psycopg.connect(DB, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def drop(table: str) -> None:
    with psycopg.connect(DB, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_offsets")


def bench_topic(n: int) -> str:
    """A topic of n records: one of BENCH_TOPIC, or a new one."""
    matching = [t for t in TOPICS if t.endswith(f"_{n}")] or TOPICS[:1] * (len(TOPICS) == 1)
    topic = matching[0] if matching else f"bench_{STAMP}_{n}"
    if not matching:
        print(f"bench: producing {n:,} records to {topic} ({PARTITIONS} partitions)",
              flush=True)
        produce(topic, n)
    return topic


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


def empty_run(env: dict) -> float:
    """A run with nothing new: no Spark. Timed through the CLI, as a scheduler starts it."""
    topic = f"bench_{STAMP}_empty"
    produce(topic, 1000)
    name = f"b_empty_{STAMP}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.toml"
        pipeline_config(config, name, topic, "json")
        cli = [PY, "-m", "pipeline"]
        subprocess.run([*cli, "init-db", "--config", str(config)], env=env, check=True,
                       capture_output=True, cwd=ROOT)
        timed([*cli, "run", "--config", str(config)], env)
        seconds, _, _ = timed([*cli, "run", "--config", str(config), "--json"], env)
    drop(name)
    return seconds


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


def scaling_report(rows: list[tuple[int, str, Result]]) -> str:
    lines = ["| records | where the executors run | runs | seconds (min-max) | rows/s (best) | "
             "spark_start | read_and_stage | publish | time relative to 1 worker |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({r[0] for r in rows}):
        group = [(label, r) for size, label, r in rows if size == n]
        one = min(next(r for label, r in group if label == "1 worker").seconds)
        for label, r in group:
            best = min(r.seconds)
            phase = {k: min(p.get(k, 0) for p in r.phases)
                     for k in ("spark_start", "read_and_stage", "publish")}
            where = ("`local[2]`: driver and executor in one JVM" if label == "local[2]"
                     else f"standalone cluster, {label} of 1 core")
            lines.append(
                f"| {n:,} | {where} | {len(r.seconds)} | {best:.1f}-{max(r.seconds):.1f} | "
                f"{n / best / 1000:,.1f}k | {phase['spark_start']:.2f} | "
                f"{phase['read_and_stage']:.2f} | {phase['publish']:.2f} | "
                f"{best / one:.2f} |")
    return "\n".join(lines)


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


def machine_load() -> tuple[float, int]:
    """(1-minute load average, other processes running a pipeline command or the soak):
    sampled before each timed run, so the table says how quiet the machine was."""
    others = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        line = " ".join(args)
        if ("pipeline" in line and any(a in ("run", "backfill") for a in args)) \
                or "scripts/soak" in line:
            others += 1
    return os.getloadavg()[0], others


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


def init_db(config: Path, env: dict) -> None:
    """``pipeline init-db``; retried when it exits 75 (transient: e.g. a lock timeout while
    another pipeline on this database holds its tables), else its stderr is shown."""
    for attempt in range(3):
        done = subprocess.run([PY, "-m", "pipeline", "init-db", "--config", str(config)],
                              env=env, capture_output=True, text=True, cwd=ROOT)
        if done.returncode == 0:
            return
        print(f"bench: init-db exited {done.returncode}: {done.stderr.strip()[-500:]}",
              flush=True)
        if done.returncode != 75 or attempt == 2:
            raise SystemExit(f"bench: init-db failed ({done.returncode})")
        time.sleep(5)


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


def modes_report(rows: list[tuple[Result, list]]) -> str:
    lines = ["| records | sink mode | runs | seconds (min-max) | rows/s (best) | time "
             "relative to append | spark_start | read_and_stage | publish | publish "
             "beyond append's |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in sorted({r.size for r, _ in rows}):
        group = [r for r, _ in rows if r.size == n]
        base = next(r for r in group if r.name == "append")
        base_s = min(base.seconds)
        base_pub = max(min(p.get("publish", 0) for p in base.phases), 0.001)
        for r in group:
            best = min(r.seconds)
            phase = {k: min(p.get(k, 0) for p in r.phases)
                     for k in ("spark_start", "read_and_stage", "publish")}
            lines.append(
                f"| {n:,} | {MODES[r.name][0]} | {len(r.seconds)} | "
                f"{best:.1f}-{max(r.seconds):.1f} | {n / best / 1000:,.1f}k | "
                f"{best / base_s:.2f} | {phase['spark_start']:.2f} | "
                f"{phase['read_and_stage']:.2f} | {phase['publish']:.2f} | "
                f"+{phase['publish'] - base_pub:.2f} s ({phase['publish'] / base_pub:.0f}x) |")
    lines += ["", "Every run (seconds; `timings` of the run's --json output; the 1-minute "
              "load average and the other pipeline processes when it started):", "",
              "| records | sink mode | run | seconds | spark_start | read_and_stage | publish "
              "| load before | other pipeline processes |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r, loads in rows:
        for i, (s, p, (load, others)) in enumerate(zip(r.seconds, r.phases, loads,
                                                       strict=True)):
            lines.append(f"| {r.size:,} | {r.name} | {i + 1} | {s:.1f} | "
                         f"{p.get('spark_start', 0):.2f} | {p.get('read_and_stage', 0):.2f} | "
                         f"{p.get('publish', 0):.2f} | {load:.2f} | {others} |")
    return "\n".join(lines)


def write_between(markers: tuple[str, str], text: str) -> None:
    """Replace what docs/benchmarks.md holds between two markers; the analysis around them
    is written by people."""
    docs = ROOT / "docs" / "benchmarks.md"
    page = docs.read_text()
    start, end = markers
    head, rest = page.split(start, 1)
    tail = rest.split(end, 1)[1]
    docs.write_text(f"{head}{start}\n{text}\n{end}{tail}")


LABELS = {"pipeline_json": PIPELINE_JSON, "pipeline_raw": PIPELINE_RAW, **PEERS}
SHORT = {"pipeline_json": "this pipeline, json", "pipeline_raw": "this pipeline, raw",
         "single_process": "single Python process", "sss_jdbc": "Spark SS + JDBC",
         "sss_arrow": "Spark SS + Arrow/COPY", "textbook": "textbook loop"}


def report(all_results: list[Result], empty: float) -> str:
    lines = [
        "| records | contender | runs | seconds (min-max) | rows/s (min-max) | "
        "speed of this pipeline (json) relative to it | peak RSS MB |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in sorted({r.size for r in all_results}):
        group = [r for r in all_results if r.size == n]
        ours = min(next(r for r in group if r.name == "pipeline_json").seconds)
        for r in sorted(group, key=lambda r: min(r.seconds)):
            lo, hi = min(r.seconds), max(r.seconds)
            lines.append(
                f"| {n:,} | {LABELS[r.name]} | {len(r.seconds)} | {lo:.1f}-{hi:.1f} | "
                f"{n / hi / 1000:,.1f}k-{n / lo / 1000:,.1f}k | {lo / ours:.2f} | "
                f"{max(r.rss_mb):,.0f} |")
    lines.append("")
    lines.append(f"Empty run (nothing new to read, no Spark), through the CLI: {empty:.2f} s.")
    lines.append("")
    lines.append("Phases of this pipeline's runs (seconds, from the run's `timings`):")
    lines.append("")
    lines.append("| records | sink | plan | spark_start | read_and_stage | publish | total |")
    lines.append("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in all_results:
        if r.name.startswith("pipeline_"):
            for p in r.phases:
                lines.append(f"| {r.size:,} | {r.name.split('_')[1]} | " + " | ".join(
                    f"{p.get(k, 0):.2f}" for k in ("plan", "spark_start", "read_and_stage",
                                                   "publish", "total")) + " |")
    return "\n".join(lines)


def plot(all_results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.size for r in all_results})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 3.6), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        group = sorted((r for r in all_results if r.size == n), key=lambda r: min(r.seconds))
        labels = [SHORT[r.name] for r in group]
        rates = [n / min(r.seconds) for r in group]
        colors = ["#aa3377" if r.name.startswith("pipeline") else "#4477aa" for r in group]
        ax.barh(labels[::-1], rates[::-1], color=colors[::-1])
        ax.set_xlabel("rows per second, best run (higher is better)")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:.0f}k")
        ax.set_title(f"{n:,} JSON records, 4 partitions, 2 cores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str]) -> int:
    scale, modes = "--scaling" in argv, "--modes" in argv
    sizes = [int(a) for a in argv if a.isdigit()] or [2_000_000]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1",
           "KAFKA_BOOTSTRAP_SERVERS": BOOTSTRAP, "PIPELINE_TEST_DATABASE_URL": DB}
    env.pop("PIPELINE_DATABASE_URL", None)
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
