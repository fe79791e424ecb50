"""Spark Structured Streaming, Trigger.AvailableNow, foreachBatch -> Spark's JDBC writer
(batched inserts): what a Spark user would write instead of this pipeline."""

from __future__ import annotations

import glob
import os

from bench.peers.common import create_table, main, spark_session, stream_once

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

    def write(batch) -> int:
        batch.persist()
        n = batch.count()
        (batch.write.format("jdbc").option("url", url).option("dbtable", table)
         .option("driver", "org.postgresql.Driver").option("batchsize", 10000)
         .mode("append").save())
        batch.unpersist()
        return n

    return stream_once(spark, bootstrap, topic, write, "sss-jdbc")


if __name__ == "__main__":
    main(run)
