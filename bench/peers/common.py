"""What every peer shares: its command line, the results table, the end offsets."""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]

TABLE_DDL = ('CREATE TABLE {table} (topic text NOT NULL, "partition" integer NOT NULL, '
             '"offset" bigint NOT NULL, kafka_timestamp timestamptz, order_id bigint NOT NULL, '
             "customer text NOT NULL, amount numeric(12,2), placed_at timestamptz, "
             'PRIMARY KEY (topic, "partition", "offset"))')
COLUMNS = ["topic", "partition", "offset", "kafka_timestamp", "order_id", "customer", "amount",
           "placed_at"]
SCHEMA = "order_id bigint, customer string, amount decimal(12,2), placed_at timestamp"


def create_table(db_url: str, table: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(TABLE_DDL.format(table=table))


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """High watermark per partition, captured at the start: where a peer stops."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        md = c.list_topics(topic, timeout=10)
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in md.topics[topic].partitions}
    finally:
        c.close()


def main(run) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--topic", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--bootstrap", default=os.environ.get("PIPELINE_TEST_BOOTSTRAP_SERVERS",
                                                         "127.0.0.1:9092"))
    p.add_argument("--db", default=os.environ.get(
        "PIPELINE_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5433/pipeline_test"))
    a = p.parse_args()
    t0 = time.perf_counter()
    rows = run(a.topic, a.table, a.db, a.bootstrap)
    print(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - t0, 3)}))


# The Structured Streaming peers' driver JVM: Spark SQL per record (the Kafka source,
# from_json), so the parallel collector and JIT of Spark's huge generated methods.
SQL_JVM_FLAGS = "-XX:+UseParallelGC -XX:-DontCompileHugeMethods"


def jar_dir() -> Path:
    """Where scripts/stack fetches the jars of the running pyspark's line (.jars/spark-4.0;
    PIPELINE_JARS_DIR overrides): Spark's Kafka connector, which only these peers use."""
    import pyspark

    line = ".".join(pyspark.__version__.split(".")[:2])
    return Path(os.environ.get("PIPELINE_JARS_DIR") or ROOT / ".jars" / f"spark-{line}")


def connector_jars() -> list[str]:
    """Spark's Kafka connector and its dependencies, built for exactly this pyspark."""
    import pyspark

    scala = "2.13" if int(pyspark.__version__.split(".")[0]) >= 4 else "2.12"
    want = f"spark-sql-kafka-0-10_{scala}-{pyspark.__version__}.jar"
    jars = sorted(glob.glob(str(jar_dir() / "*.jar")))
    if want not in {os.path.basename(j) for j in jars}:
        raise SystemExit(f"bench peer: no {want} in {jar_dir()}: run scripts/stack install")
    return jars


def spark_session(extra_jars: list[str] | None = None):
    """A local[2] session with the connector jars, built as the pipeline builds its Spark
    (spark/session.py) but for Spark SQL per record (SQL_JVM_FLAGS)."""
    from pyspark.sql import SparkSession

    from pipeline.spark.session import get_context

    get_context("local[2]", {"spark.jars": ",".join(connector_jars() + (extra_jars or [])),
                             "spark.sql.shuffle.partitions": "4",
                             "spark.driver.extraJavaOptions": SQL_JVM_FLAGS},
                app_name="bench-peer")
    return SparkSession.builder.getOrCreate()


def kafka_stream(spark, bootstrap: str, topic: str):
    """readStream over the whole topic, the records as Spark's Kafka source gives them."""
    return (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load())


def stream_orders(spark, bootstrap: str, topic: str):
    """readStream over the whole topic, parsed with from_json: what a Spark user writes."""
    from pyspark.sql import functions as F

    return (kafka_stream(spark, bootstrap, topic)
            .select("topic", "partition", "offset", F.col("timestamp").alias("kafka_timestamp"),
                    F.from_json(F.col("value").cast("string"), SCHEMA).alias("v"))
            .select("topic", "partition", "offset", "kafka_timestamp", "v.*"))


def stream_once(spark, bootstrap: str, topic: str, write_batch: Callable[[object], int],
                name: str, source: Callable = stream_orders) -> int:
    """The Structured Streaming harness the streaming peers share: the whole topic once
    (Trigger.AvailableNow) through foreachBatch, with a throwaway checkpoint.
    ``write_batch`` writes one micro-batch and returns its row count; returns their sum.
    ``source(spark, bootstrap, topic)``: the parsed stream (the JSON orders unless told)."""
    counts: list[int] = []

    def write(batch, batch_id):
        counts.append(write_batch(batch))

    checkpoint = tempfile.mkdtemp(prefix=f"{name}-")
    try:
        (source(spark, bootstrap, topic).writeStream.foreachBatch(write)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True)
         .start().awaitTermination())
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return sum(counts)
