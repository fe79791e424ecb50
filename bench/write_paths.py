"""Where a run's time goes, and how the write path compares with the sink's own limit.

    scripts/bench            # 200,000 records (BENCH_RECORDS to change)

Everything is measured in the same process and the same minute, on the local stack, and
reported as a ratio to the baseline measured here: a direct binary COPY of the same rows,
already in Python memory, into a keyed table (what Postgres alone can take). Results go to
docs/benchmarks.md and docs/benchmarks.png. Read them as ratios: the machine is shared.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.config import parse_settings  # noqa: E402
from pipeline.job import run_ingest  # noqa: E402
from pipeline.offsets import OffsetRange  # noqa: E402
from pipeline.read import read_ranges  # noqa: E402
from pipeline.sample import order  # noqa: E402
from pipeline.spark import get_spark  # noqa: E402
from pipeline.store import Store  # noqa: E402

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
DB = os.environ.get("PIPELINE_TEST_DATABASE_URL",
                    "postgresql://postgres@127.0.0.1:5433/pipeline_test")
N = int(os.environ.get("BENCH_RECORDS", "200000"))
PARTITIONS = 4
STAMP = datetime.now(UTC).strftime("%Y%m%d%H%M%S")


def produce(topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})  # keep a reference until done
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    time.sleep(1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 50, "batch.size": 1_000_000})
    for i in range(N):
        p.produce(topic, key=f"order-{i}".encode(), value=order(i), partition=i % PARTITIONS)
        if i % 50_000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def settings(name: str, topic: str, fmt: str):
    cols = {"order_id": "long not null", "customer": "string not null",
            "amount": "decimal(12,2)", "placed_at": "timestamp"}
    return parse_settings({
        "pipeline": {"name": name},
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topics": [topic]},
        "database": {"url": DB},
        "sink": {"format": fmt, "table": name, **({"columns": cols} if fmt == "json" else {})},
    }, environ={})


def direct_copy_baseline(name: str) -> float:
    """The sink's limit: N raw-shaped rows from Python memory, binary COPY, keyed table."""
    now = datetime.now(UTC)
    rows = [("t", i % PARTITIONS, i // PARTITIONS, f"order-{i}".encode(), order(i), "[]", now)
            for i in range(N)]
    with psycopg.connect(DB) as conn:
        conn.execute(f"CREATE TABLE {name} (topic text, \"partition\" int, \"offset\" bigint, "
                     "key bytea, value bytea, headers jsonb, kafka_timestamp timestamptz, "
                     "PRIMARY KEY (topic, \"partition\", \"offset\"))")
        conn.commit()
        t0 = time.perf_counter()
        with conn.cursor().copy(f"COPY {name} FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["text", "int4", "int8", "bytea", "bytea", "jsonb", "timestamptz"])
            for r in rows:
                copy.write_row(r)
        conn.commit()
        elapsed = time.perf_counter() - t0
        conn.execute(f"DROP TABLE {name}")
        conn.commit()
    return elapsed


def spark_read_only(spark, s) -> float:
    ranges = [OffsetRange(s.kafka.topics[0], p, 0, N // PARTITIONS) for p in range(PARTITIONS)]
    t0 = time.perf_counter()
    count = read_ranges(spark, s.kafka, ranges).count()
    assert count == N, count
    return time.perf_counter() - t0


def pipeline_run(s) -> dict:
    store = Store(s)
    store.init_db()
    store.close()
    t0 = time.perf_counter()
    result = run_ingest(s)
    total = time.perf_counter() - t0
    assert result.records_read == N, result.records_read
    return {"total": total, **result.timings}


def main() -> int:
    topic = f"bench_{STAMP}"
    print(f"bench: producing {N} records to {topic} ({PARTITIONS} partitions)")
    produce(topic)
    spark = get_spark()
    spark.range(1000).count()  # JVM warm-up outside the measurements

    results: list[tuple[str, float, str]] = []
    base = direct_copy_baseline(f"bench_direct_{STAMP}")
    results.append(("direct binary COPY, rows in memory (baseline)", base, "sink limit"))
    read = spark_read_only(spark, settings(f"bench_read_{STAMP}", topic, "raw"))
    results.append(("Spark read of the ranges only (count)", read, "source"))
    raw = pipeline_run(settings(f"bench_raw_{STAMP}", topic, "raw"))
    results.append(("pipeline run, raw sink: read + stage", raw["read_and_stage"], "stage"))
    results.append(("pipeline run, raw sink: publish transaction", raw["publish"], "publish"))
    results.append(("pipeline run, raw sink: end to end", raw["total"], "total"))
    js = pipeline_run(settings(f"bench_json_{STAMP}", topic, "json"))
    results.append(("pipeline run, json sink: read + parse + stage", js["read_and_stage"],
                    "stage"))
    results.append(("pipeline run, json sink: publish transaction", js["publish"], "publish"))
    results.append(("pipeline run, json sink: end to end", js["total"], "total"))

    lines = [
        "# Benchmarks",
        "",
        f"Measured by `scripts/bench` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{N:,} records in {PARTITIONS} partitions, `local[2]`, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. Ratios are against the baseline measured in the "
        "same run (a direct binary COPY of the same number of rows from memory into a keyed "
        "table); a ratio of 0.5 means half the baseline's rows per second.",
        "",
        "| measurement | seconds | rows/s | ratio to baseline |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, seconds, _ in results:
        lines.append(f"| {label} | {seconds:.2f} | {N / seconds:,.0f} | {base / seconds:.2f} |")
        print(f"bench: {label}: {seconds:.2f} s, {N / seconds:,.0f} rows/s, "
              f"ratio {base / seconds:.2f}")
    lines += ["", "![rows per second](benchmarks.png)", ""]
    docs = ROOT / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "benchmarks.md").write_text("\n".join(lines) + NOTES)
    plot(results, docs / "benchmarks.png")
    print("bench: wrote docs/benchmarks.md and docs/benchmarks.png")
    return 0


NOTES = """
## Reading the numbers

- The end-to-end time includes the SparkSession's first Kafka job in the run (connector
  class loading, Python worker start), which does not grow with the data.
- Staging is a text COPY per Spark partition through psycopg's `write_row`: Python per-row
  cost dominates it. The publishing transaction is a set-based `INSERT ... SELECT ... ON
  CONFLICT DO NOTHING` inside Postgres, then the offsets compare-and-set.
- Alternatives worth measuring next (each keeps the one-transaction publish):
  `mapInArrow` + CSV COPY into staging (ENVIRONMENT.md saw ~1.7x over per-row COPY), binary
  COPY with explicit types, and a per-run staging table attached as a partition.
"""


def plot(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r[0] for r in results]
    rates = [N / r[1] for r in results]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = {"sink limit": "#555555", "source": "#4477aa", "stage": "#ee7733",
              "publish": "#228833", "total": "#aa3377"}
    ax.barh(labels[::-1], rates[::-1], color=[colors[r[2]] for r in results][::-1])
    ax.set_xlabel("rows per second (higher is better)")
    ax.set_title(f"{N:,} records, local[2], same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
