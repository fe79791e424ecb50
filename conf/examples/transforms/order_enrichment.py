"""The transform of conf/examples/transform.toml: the sample orders (pipeline/sample.py)
enriched for reporting. DataFrame in (the parsed good records: topic, partition, offset,
kafka_timestamp and the declared columns), DataFrame out.

Importable as ``order_enrichment`` once this folder is on the path:
``PYTHONPATH=conf/examples/transforms pipeline run --config conf/examples/transform.toml``.
Only Spark SQL functions here (no Python UDF), so the executors need nothing of this file.

customers.csv must hold one row per customer: a duplicate is refused (ValueError naming the
customer and both lines, so the run exits 2 before reading a record) rather than one row
kept, because which one Spark would keep is arbitrary and a reprocess could then give an
order another region. Fix the extract, then rerun.
"""

from __future__ import annotations

import csv
from pathlib import Path

# The dimension table ships beside this module: a small extract, read on the driver and
# broadcast to every task (no shuffle).
CUSTOMERS = Path(__file__).with_name("customers.csv")
# amount_band: below SMALL is "small", below LARGE "medium", else "large".
SMALL, LARGE = 1000, 10000


def customer_rows(path: Path = CUSTOMERS) -> list[tuple[str, str, str]]:
    """(customer, region, segment) per line of the extract; raises ValueError on a
    customer that appears twice (a join would give its orders two rows, or a dedup an
    arbitrary one)."""
    rows, seen = [], {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for r in reader:
            line = seen.setdefault(r["customer"], reader.line_num)
            if line != reader.line_num:
                raise ValueError(f"{path.name}: customer {r['customer']!r} is on lines {line} "
                                 f"and {reader.line_num}; keep one row per customer")
            rows.append((r["customer"], r["region"], r["segment"]))
    return rows


def customers(spark):
    """The extract as an inline table (a local relation in the plan). Not
    ``spark.createDataFrame(rows)``: that makes a Python RDD, so the broadcast would run a
    Spark job of its own through Python workers before the run's (~2 s), and a plan with
    Python input keeps the run's workers from leaving pandas out (docs/benchmarks.md).
    The values are bound as parameters, never spliced into the SQL."""
    rows = customer_rows()
    values = ", ".join(f"(:c{i}, :r{i}, :s{i})" for i in range(len(rows)))
    args = {f"{key}{i}": value for i, row in enumerate(rows)
            for key, value in zip("crs", row, strict=True)}
    return spark.sql(f"SELECT * FROM VALUES {values} AS customers(customer, region, segment)",
                     args=args)


def enrich(orders):
    from pyspark.sql import functions as F

    amount = F.col("amount")
    return (
        # The declared columns the JSON lacks arrive as nulls: the join brings region and
        # segment (two columns of one name would be ambiguous).
        orders.drop("region", "segment")
        # Filter: a free order (a sample, amount 0) or one without a price is no revenue.
        .where(amount > 0)
        # Join: region and segment from the dimension table; a customer the extract does
        # not know yet keeps its order, in region "unknown".
        .join(F.broadcast(customers(orders.sparkSession)), "customer", "left")
        .withColumn("region", F.coalesce("region", F.lit("unknown")))
        # Derived column.
        .withColumn("amount_band", F.when(amount < SMALL, "small")
                    .when(amount < LARGE, "medium").otherwise("large"))
    )
