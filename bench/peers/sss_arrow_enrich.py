"""Spark Structured Streaming, Trigger.AvailableNow, with the realistic transform of
conf/examples/transform.toml (order_enrichment.enrich: a filter, a broadcast join with
customers.csv, a derived column) inside foreachBatch, then mapInArrow + CSV COPY as
sss_arrow: what a Spark user would write for the same logic. The transform's folder must
be on PYTHONPATH, as for the pipeline (bench/transform.py sets it)."""

from __future__ import annotations

import psycopg

from bench.peers.common import COLUMNS, TABLE_DDL, main, spark_session, stream_once
from bench.peers.sss_arrow import copy_writer

ENRICHED = ["region", "segment", "amount_band"]


def create_table(db_url: str, table: str) -> None:
    ddl = TABLE_DDL.format(table=table).replace(
        ", PRIMARY KEY", ", region text, segment text, amount_band text, PRIMARY KEY")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(ddl)


def run(topic: str, table: str, db_url: str, bootstrap: str) -> int:
    from order_enrichment import enrich

    create_table(db_url, table)
    columns = COLUMNS + ENRICHED

    def write(batch) -> int:
        result = enrich(batch).select(*columns).mapInArrow(
            copy_writer(db_url, table, columns), "n long")
        return sum(r.n for r in result.collect())

    return stream_once(spark_session(), bootstrap, topic, write, "sss-arrow-enrich")


if __name__ == "__main__":
    main(run)
