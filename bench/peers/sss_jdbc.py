"""Spark Structured Streaming, Trigger.AvailableNow, foreachBatch -> Spark's JDBC writer
(batched inserts): what a Spark user would write instead of this pipeline."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

from bench.peers.common import create_table, main, spark_session, stream_orders

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def jdbc_url(db_url: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(db_url)
    user = f"&user={u.username}" if u.username else ""
    return (f"jdbc:postgresql://{u.host}:{u.port or 5432}/{u.database}"
            f"?reWriteBatchedInserts=true{user}")


def run(topic: str, table: str, db_url: str, bootstrap: str) -> int:
    create_table(db_url, table)
    jars = sorted(glob.glob(os.path.join(ROOT, ".jars", "bench", "*.jar")))
    spark = spark_session(jars)
    url = jdbc_url(db_url)
    counts = []

    def write(batch, batch_id):
        batch.persist()
        counts.append(batch.count())
        (batch.write.format("jdbc").option("url", url).option("dbtable", table)
         .option("driver", "org.postgresql.Driver").option("batchsize", 10000)
         .mode("append").save())
        batch.unpersist()

    checkpoint = tempfile.mkdtemp(prefix="sss-jdbc-")
    try:
        (stream_orders(spark, bootstrap, topic).writeStream.foreachBatch(write)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True)
         .start().awaitTermination())
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return sum(counts)


if __name__ == "__main__":
    main(run)
