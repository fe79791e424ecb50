"""Where the transform path's time goes, step by step, in one SparkSession (issue 25):

    .venv/bin/python -m bench.transform_profile TOPIC [STEP ...]

TOPIC: a topic of JSON orders (bench.harness.produce), read whole. Each step runs twice
(cold, then warm) and prints its wall seconds and the CPU-seconds of this process tree (the
driver, its JVM, Spark's Python workers; Kafka and Postgres are not counted). Steps:

    source     Spark's Kafka source over the ranges, every column, into the noop sink
    mark       Spark's source + transform.mark (from_json, the checks), noop
    cache      Spark's source + mark persisted + count (the cache build)
    lines      the whole job but staging: cached mark, both branches, COPY lines, the
               Arrow hop into Python (drained), the records_read count
    builtin    the built-in path's read alone (consume.read_ranges per task, counted)
    encode     the built-in path's read + encode (no staging)

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


def _kind(cmd: str) -> str:
    return ("python workers" if "pyspark.daemon" in cmd or "pyspark.worker" in cmd
            else "jvm" if "java" in cmd else "driver python" if "python" in cmd
            else "other")


def tree_cpu_by_kind(root: int) -> dict[str, float]:
    """CPU-seconds of ``root``'s live descendants (not itself), by kind of process."""
    procs = processes(with_cmdline=True)
    out: dict[str, float] = {}
    for pid in descendants(procs, root):
        _, fields, cmd = procs[pid]
        kind = _kind(cmd)
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
        kind = _kind(cmd)
        out[kind] = out.get(kind, 0.0) + int(fields[21]) * page / 2**20
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
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.executor.stage import line_frame
    from pipeline.plan.offsets import OffsetRange
    from pipeline.plan.split import pack_ranges, split_ranges
    from pipeline.spark.launch import start_spark
    from pipeline.spark.read import read_ranges
    from pipeline.spark.transform import mark, split
    from pipeline.store import tables

    topic, steps = argv[0], argv[1:] or ["source", "mark", "lines", "builtin",
                                         "encode"]
    settings = settings_for(topic)
    ends = KafkaMeta(settings.kafka).topic_offsets([topic])
    ranges = [OffsetRange(k.topic, k.partition, k.earliest, k.latest) for k in ends]
    n = sum(r.count for r in ranges)
    me = os.getpid()
    t0, c0 = time.perf_counter(), tree_cpu(me)
    sc = start_spark(settings)
    spark = SparkSession.builder.getOrCreate()
    print(f"start: {time.perf_counter() - t0:.1f} s, {tree_cpu(me) - c0:.1f} CPU-s", flush=True)
    slots = sc.defaultParallelism
    tasks = pack_ranges(split_ranges(ranges, slots), slots)
    columns = tables.typed(tables.from_record(tables.record_rows(settings.sink)))
    dead_columns = tables.typed(tables.DEAD_LETTER_FIELDS)

    def source():
        return read_ranges(spark, settings.kafka, ranges).coalesce(len(tasks))

    def noop(df):
        df.write.format("noop").mode("overwrite").save()

    def drain(batches):
        import pyarrow as pa

        rows = sum(len(b) for b in batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    def lines(records):
        cached = mark(records, settings.sink).persist(StorageLevel.MEMORY_AND_DISK)
        results, dead = split(cached, settings.sink)
        good = results.select(*[F.col(f"`{c}`") for c, _ in columns],
                              F.lit(None).cast("string").alias("error_code"))
        frame = line_frame(good, columns, dead_columns, 1, F, dead=False).unionByName(
            line_frame(dead, columns, dead_columns, 1, F, rows=False))
        got = sum(r["rows"] for r in frame.mapInArrow(drain, "rows long").collect())
        read = sum(r["count"] for r in cached.groupBy("topic", "partition").count().collect())
        cached.unpersist()
        assert got == n == read, (got, n, read)

    def builtin(encode: bool):
        from pipeline.executor.consume import read_ranges as consume
        from pipeline.executor.consume import reader_config
        from pipeline.executor.task import EncoderSettings

        config = reader_config(settings.kafka.client_config(), "read_committed", "tprofile")
        enc = EncoderSettings.for_settings(settings, 1)

        def task(items):
            rs = [r for item in items for r in (item if isinstance(item, list) else [item])]
            encoder = enc.encoder() if encode else None
            count = 0
            for r, records in consume(config, rs, 30):
                if encoder is not None:
                    encoder.encode(r.topic, r.partition, records)
                count += len(records)
            yield count

        assert sum(sc.parallelize(tasks, len(tasks)).mapPartitions(task).collect()) == n

    run = {
        "source": lambda: noop(source()),
        "mark": lambda: noop(mark(source(), settings.sink)),
        "cache": lambda: mark(source(), settings.sink).persist().count(),
        "lines": lambda: lines(source()),
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
