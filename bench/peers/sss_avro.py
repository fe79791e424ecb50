"""Spark Structured Streaming, Trigger.AvailableNow, on the Avro topic: the 5-byte
Confluent header stripped, the body decoded with spark-avro's from_avro (the pinned jar of
.jars/spark-<line>/bench-avro) against the writer schema read once from the registry, then
foreachBatch -> mapInArrow + CSV COPY as sss_arrow: what a Spark user writes for a
Confluent Avro topic without Databricks' registry-aware from_avro."""

from __future__ import annotations

import glob

from bench.avro_orders import writer_schema
from bench.peers.common import (
    COLUMNS,
    create_table,
    jar_dir,
    kafka_stream,
    main,
    spark_session,
    stream_once,
)
from bench.peers.sss_arrow import arrow_copy


def avro_jars() -> list[str]:
    jars = sorted(glob.glob(str(jar_dir() / "bench-avro" / "*.jar")))
    if not jars:
        raise SystemExit("sss_avro: no spark-avro jar in .jars/spark-<line>/bench-avro: run "
                         "scripts/stack install")
    return jars


def avro_orders(schema: str):
    """The stream's source: the Avro orders decoded, with their Kafka coordinates."""
    def source(spark, bootstrap: str, topic: str):
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        body = F.expr("substring(value, 6, length(value) - 5)")  # after magic byte + id
        return (kafka_stream(spark, bootstrap, topic)
                .select("topic", "partition", "offset",
                        F.col("timestamp").alias("kafka_timestamp"),
                        from_avro(body, schema).alias("v"))
                .select("topic", "partition", "offset", "kafka_timestamp", "v.*")
                .select(*COLUMNS))

    return source


def run(topic: str, table: str, db_url: str, bootstrap: str) -> int:
    create_table(db_url, table)
    return stream_once(spark_session(avro_jars()), bootstrap, topic,
                       arrow_copy(db_url, table), "sss-avro", avro_orders(writer_schema(topic)))


if __name__ == "__main__":
    main(run)
