"""Where the transform path's time goes, step by step, in one SparkSession (issue 25):

    .venv/bin/python -m bench.transform_profile TOPIC [STEP ...]

TOPIC: a topic of JSON orders (bench.harness.produce), read whole. Each step runs twice
(cold, then warm) and prints its wall seconds and the CPU-seconds of this process tree (the
driver, its JVM, Spark's Python workers; Kafka and Postgres are not counted). Steps:

    source         Spark's Kafka source over the ranges, every column, the Arrow hop
                   into Python (drained): the floor of a variant that keeps the source
    source_slim    the same without the headers column (what a decode needs)
    source_decode  source_slim + the Encoder's decode and typed rows in that mapInArrow (that
                   variant's input for the transform, drained)
    feed           the transform's input as runs make it (executor/feed.py: the read
                   tasks as a DataFrame, read + encode + typed rows), drained, no staging
    builtin        the built-in path's read alone (consume.read_ranges per task, counted)
    encode         the built-in path's read + encode (no staging)

Needs the stack and KAFKA_BOOTSTRAP_SERVERS as scripts/bench sets them.
"""

from __future__ import annotations

import os
import sys
import time

from bench.harness import BOOTSTRAP, DB, descendants, processes

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU-seconds of ``root`` and its live descendants, with their reaped children."""
    procs = processes()
    return sum(sum(int(x) for x in procs[p][1][11:15]) / TICK
               for p in [root, *descendants(procs, root)] if p in procs)


def process_kind(cmd: str) -> str:
    """A process's kind by its command line. The JVM is tested first: its command line
    may name the Python daemon module too (a spark.python.daemon.module conf)."""
    return ("jvm" if "java" in cmd
            else "python workers" if "pyspark.daemon" in cmd or "pyspark.worker" in cmd
            else "driver python" if "python" in cmd else "other")


def tree_cpu_by_kind(root: int) -> dict[str, float]:
    """CPU-seconds of ``root``'s live descendants (not itself), by kind of process."""
    procs = processes(with_cmdline=True)
    out: dict[str, float] = {}
    for pid in descendants(procs, root):
        _, fields, cmd = procs[pid]
        kind = process_kind(cmd)
        # its own CPU, not its children's
        out[kind] = out.get(kind, 0.0) + sum(int(x) for x in fields[11:13]) / TICK
    return out


def tree_rss_by_kind(root: int) -> dict[str, float]:
    """RSS (MB) of ``root``'s live descendants, by kind of process."""
    procs = processes(with_cmdline=True)
    page = os.sysconf("SC_PAGE_SIZE")
    out: dict[str, float] = {}
    for pid in descendants(procs, root):
        _, fields, cmd = procs[pid]
        kind = process_kind(cmd)
        out[kind] = out.get(kind, 0.0) + int(fields[21]) * page / 2**20
    return out


def tree_pss_by_kind(root: int) -> dict[str, float]:
    """PSS (MB) of ``root``'s live descendants by kind (/proc/<pid>/smaps_rollup: pages
    shared by forked workers counted once across them, not in each as RSS counts them)."""
    procs = processes(with_cmdline=True)
    out: dict[str, float] = {}
    for pid in descendants(procs, root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                kb = next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
        kind = process_kind(procs[pid][2])
        out[kind] = out.get(kind, 0.0) + kb / 1024
    return out


def settings_for(topic: str):
    from pipeline.config import parse_settings

    return parse_settings({
        "pipeline": {"name": "tprofile"},
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topics": [topic]},
        "database": {"url": DB},
        "sink": {"format": "json", "table": "tprofile",
                 "transform": "tests.integration.transforms.orders:identity",
                 "columns": {"order_id": "long not null", "customer": "string not null",
                             "amount": "decimal(12,2)", "placed_at": "timestamp"}},
        "spark": {"master": "local[2]"}})


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.executor.consume import read_ranges as consume
    from pipeline.executor.consume import reader_config
    from pipeline.executor.task import EncoderSettings
    from pipeline.plan.offsets import OffsetRange
    from pipeline.plan.split import pack_ranges, split_ranges
    from pipeline.spark.read import read_ranges
    from pipeline.spark.session import get_context

    topic, steps = argv[0], argv[1:] or ["source", "source_decode", "feed", "builtin",
                                         "encode"]
    settings = settings_for(topic)
    ends = KafkaMeta(settings.kafka).topic_offsets([topic])
    ranges = [OffsetRange(k.topic, k.partition, k.earliest, k.latest) for k in ends]
    n = sum(r.count for r in ranges)
    me = os.getpid()
    t0, c0 = time.perf_counter(), tree_cpu(me)
    # Spark's Kafka connector too: the source steps read through it.
    sc = get_context(settings.spark.master, settings.spark.conf, jvm="light",
                     kafka_source=True)
    spark = SparkSession.builder.getOrCreate()
    print(f"start: {time.perf_counter() - t0:.1f} s, {tree_cpu(me) - c0:.1f} CPU-s", flush=True)
    slots = sc.defaultParallelism
    tasks = [t if isinstance(t, list) else [t]
             for t in pack_ranges(split_ranges(ranges, slots), slots)]
    columns = tuple((c.name, c.type, c.required, c.source) for c in settings.sink.columns)
    enc = EncoderSettings("json", columns, 1)
    config = reader_config(settings.kafka.client_config(), "read_committed", "tprofile")

    def source():
        return read_ranges(spark, settings.kafka, ranges).coalesce(len(tasks))

    def drain(batches):
        import pyarrow as pa

        rows = sum(len(b) for b in batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    def drained(df) -> int:
        return sum(r["rows"] for r in df.mapInArrow(drain, "rows long").collect())

    def decode_source(batches):
        """Spark's source records -> the Encoder's typed rows (the variant that keeps
        Spark's source, its decode in a mapInArrow): read-back as executor/feed.py."""
        import pyarrow as pa

        from pipeline.formats import typed_rows

        class Rec:
            __slots__ = ("o", "k", "v", "ts")

            def __init__(self, o, k, v, ts):
                self.o, self.k, self.v, self.ts = o, k, v, ts

            def offset(self):
                return self.o

            def key(self):
                return self.k

            def value(self):
                return self.v

            def headers(self):
                return None

            def timestamp(self):
                return (0, self.ts)

        encoder = enc.encoder(text_rows=True)
        convert = typed_rows.converter("json", columns, pa)
        for b in batches:
            t, p = b.column("topic")[0].as_py(), b.column("partition")[0].as_py()
            micros = b.column("timestamp").cast(pa.int64()).to_pylist()
            records = [Rec(o, k, v, us // 1000) for o, k, v, us in zip(
                b.column("offset").to_pylist(), b.column("key").to_pylist(),
                b.column("value").to_pylist(), micros, strict=True)]
            yield convert(t, p, records, encoder.encode(t, p, records))[0]

    def feed(batches):
        """The new path's input without its staging: read, encode, typed rows."""
        import pyarrow as pa

        from pipeline.formats import typed_rows

        encoder = enc.encoder(text_rows=True)
        convert = typed_rows.converter("json", columns, pa)
        for b in batches:
            for i in b.column(0).to_pylist():
                for r, records in consume(config, tasks[i], 30):
                    yield convert(r.topic, r.partition, records,
                                  encoder.encode(r.topic, r.partition, records))[0]

    from pipeline.executor.feed import feed_schema

    schema = feed_schema("json", columns)

    def builtin(encode: bool):
        def task(items):
            rs = [r for item in items for r in (item if isinstance(item, list) else [item])]
            encoder = enc.encoder(text_rows=True) if encode else None
            count = 0
            for r, records in consume(config, rs, 30):
                if encoder is not None:
                    encoder.encode(r.topic, r.partition, records)
                count += len(records)
            yield count

        assert sum(sc.parallelize(tasks, len(tasks)).mapPartitions(task).collect()) == n

    def check(got: int) -> None:
        assert got == n, (got, n)

    run = {
        "source": lambda: check(drained(source())),
        "source_slim": lambda: check(drained(source().select(
            "topic", "partition", "offset", "key", "value", "timestamp"))),
        "source_decode": lambda: check(drained(source().select(
            "topic", "partition", "offset", "key", "value", "timestamp").mapInArrow(
                decode_source, schema))),
        "feed": lambda: check(drained(spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(
            feed, schema))),
        "builtin": lambda: builtin(False),
        "encode": lambda: builtin(True),
    }
    print(f"| step ({n:,} records) | cold s | cold CPU-s | warm s | warm CPU-s |")
    for step in steps:
        out = []
        for _ in range(2):
            t, c = time.perf_counter(), tree_cpu(me)
            run[step]()
            out += [time.perf_counter() - t, tree_cpu(me) - c]
        print(f"| {step} | " + " | ".join(f"{x:.1f}" for x in out) + " |", flush=True)
    print(f"load average: {os.getloadavg()}")
    sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
