"""How every contender is run and measured: the stack's addresses, the topics of N
records (produced from pipeline.sample.order), a process timed with the peak RSS of its
whole tree, and the page cache and WAL state every contender starts from."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import psycopg

from pipeline.sample import order

ROOT = Path(__file__).resolve().parent.parent
# The benchmark's broker, named as the test suite names it (scripts/bench sets it);
# KAFKA_BOOTSTRAP_SERVERS, which shells export for the same, only as a fallback.
BOOTSTRAP = (os.environ.get("PIPELINE_TEST_BOOTSTRAP_SERVERS")
             or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or "127.0.0.1:9092")
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


@dataclass
class Result:
    name: str
    size: int
    seconds: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)


def produce(topic: str, n: int, value: Callable[[int], bytes] = order) -> None:
    """n records keyed order-<i>, record i with ``value(i)`` (the JSON order unless told),
    round-robin over the partitions."""
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
                p.produce(topic, key=f"order-{i}".encode(), value=value(i),
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


def processes(with_cmdline: bool = False) -> dict[int, tuple[int, list[str], str]]:
    """Every live process, from /proc: pid -> (parent pid, the stat fields after the
    command name, the command line if asked)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cmd = ""
            if with_cmdline:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
            out[int(entry)] = (int(fields[1]), fields, cmd)
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(procs: dict[int, tuple], root: int) -> list[int]:
    """The pids below ``root`` (not itself) in ``processes()``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and all its descendants, from /proc."""
    procs = processes()
    page = os.sysconf("SC_PAGE_SIZE")
    return sum(int(procs[p][1][21]) * page for p in [pid, *descendants(procs, pid)]
               if p in procs) / 2**20


# CPU seconds of the last timed() command's process tree (user + system, each process as
# last sampled): less sensitive to other load on the machine than its wall time.
last_tree_cpu = 0.0


def tree_cpu(pid: int, seen: dict[int, float]) -> None:
    """Record in ``seen`` the CPU seconds so far of a process and its descendants."""
    procs = processes()
    tick = os.sysconf("SC_CLK_TCK")
    for p in [pid, *descendants(procs, pid)]:
        if p in procs:
            fields = procs[p][1]
            seen[p] = max(seen.get(p, 0.0), (int(fields[11]) + int(fields[12])) / tick)


def timed(cmd: list[str], env: dict, cwd: Path = ROOT) -> tuple[float, float, str]:
    """(seconds, peak RSS MB of the process tree, stdout); its CPU in ``last_tree_cpu``."""
    global last_tree_cpu
    peak = 0.0
    cpu: dict[int, float] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.25):
            peak = max(peak, tree_rss_mb(proc.pid))
            tree_cpu(proc.pid, cpu)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    last_tree_cpu = sum(cpu.values())
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return seconds, peak, out


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


def in_turns(what: str, n: int, names: list[str], topic_of: Callable[[str], str],
             run_one: Callable[[str, int], tuple[float, float, dict]]
             ) -> list[tuple[Result, list]]:
    """A scenario's contenders in turns (A, B, C, ...; BENCH_REPEAT rounds), each from a
    warm topic (``topic_of(name)``) and a checkpointed server, the machine's load sampled
    before it. ``run_one(name, run)``: (seconds, peak RSS MB, phases). Returns (result, load
    samples) per contender."""
    results = {name: (Result(name, n), []) for name in names}
    for run in range(REPEAT):
        for name, (result, loads) in results.items():
            warm(topic_of(name))
            checkpoint()
            load = machine_load()
            seconds, rss, phases = run_one(name, run)
            result.seconds.append(seconds)
            result.rss_mb.append(rss)
            result.phases.append(phases)
            loads.append(load)
            print(f"bench: {what} {n:,} {name} run {run + 1}: {seconds:.1f} s, peak RSS "
                  f"{rss:,.0f} MB, phases {phases}, load before {load[0]:.2f} ({load[1]} "
                  "other pipeline processes)", flush=True)
    return list(results.values())
