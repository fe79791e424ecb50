"""Spark Structured Streaming, Trigger.AvailableNow, foreachBatch -> mapInArrow on the
executors: each Arrow batch as CSV (pyarrow) into COPY ... (FORMAT csv)."""

from __future__ import annotations

from bench.peers.common import COLUMNS, create_table, main, spark_session, stream_once


def copy_writer(db_url: str, table: str, columns: list[str] = COLUMNS):
    def write(batches):
        import io

        import psycopg
        import pyarrow as pa
        import pyarrow.csv as pacsv

        n = 0
        cols = ", ".join(f'"{c}"' for c in columns)
        with psycopg.connect(db_url, options="-c TimeZone=UTC") as conn:
            with conn.cursor() as cur, cur.copy(
                    f"COPY {table} ({cols}) FROM STDIN (FORMAT csv)") as copy:
                for batch in batches:
                    buf = io.BytesIO()
                    pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
                    copy.write(buf.getvalue())
                    n += len(batch)
            conn.commit()
        yield pa.RecordBatch.from_pydict({"n": [n]})

    return write


def arrow_copy(db_url: str, table: str):
    """foreachBatch's writer: the batch's order columns through mapInArrow + CSV COPY;
    returns the rows written."""
    def write(batch) -> int:
        result = batch.select(*COLUMNS).mapInArrow(copy_writer(db_url, table), "n long")
        return sum(r.n for r in result.collect())

    return write


def run(topic: str, table: str, db_url: str, bootstrap: str) -> int:
    create_table(db_url, table)
    return stream_once(spark_session(), bootstrap, topic, arrow_copy(db_url, table),
                       "sss-arrow")


if __name__ == "__main__":
    main(run)
