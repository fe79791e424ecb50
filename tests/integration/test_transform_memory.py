"""What keeps a transform run's processes small reaches them (docs/benchmarks.md, "Memory
of the transform path"): the allocator settings reach Spark's Python workers, and the
driver lets the workers keep pandas out only when the transform's plan runs no Python of
the user's (executor/transform/worker_imports.py)."""

from __future__ import annotations

from pyspark.sql import functions as F

from pipeline.executor.transform.worker_imports import runs_only_ours


def _report(batches):
    import os

    import pyarrow as pa

    for _ in batches:
        yield pa.RecordBatch.from_pydict({
            "pool": [pa.default_memory_pool().backend_name],
            "arenas": [os.environ.get("MALLOC_ARENA_MAX", "")]})


def test_the_allocator_settings_reach_the_python_workers(spark):
    rows = spark.range(0, 2, 1, 2).mapInArrow(_report, "pool string, arenas string").collect()
    assert {(r.pool, r.arenas) for r in rows} == {("system", "2")}


def _identity(batches):
    yield from batches


def test_only_a_transform_without_python_lets_the_workers_keep_pandas_out(spark):
    records = spark.range(0, 2, 1, 2).mapInArrow(_identity, "id long")  # the reader
    assert runs_only_ours(records.select((F.col("id") + 1).alias("next_id")).where("id > 0"))
    assert not runs_only_ours(records.select(F.udf(lambda x: x, "long")("id")))
    assert not runs_only_ours(records.mapInPandas(_identity, "id long"))
    assert not runs_only_ours(records.mapInArrow(_identity, "id long"))
    assert not runs_only_ours(records.unionByName(
        spark.createDataFrame(spark.sparkContext.parallelize([(1,)]), "id long")))


def test_the_example_transforms_dimension_table_is_a_local_relation_without_python(spark):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "conf/examples/transforms/order_enrichment.py"
    spec = importlib.util.spec_from_file_location("order_enrichment", path)
    enrichment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enrichment)

    customers = enrichment.customers(spark)
    assert customers._jdf.queryExecution().optimizedPlan().toString().startswith("LocalRelation")
    assert sorted(map(tuple, customers.collect())) == sorted(enrichment.customer_rows())
    orders = spark.range(0, 2, 1, 2).mapInArrow(_identity, "id long").select(
        F.col("id").cast("decimal(12,2)").alias("amount"), F.lit("c1").alias("customer"),
        F.lit(None).cast("string").alias("region"), F.lit(None).cast("string").alias("segment"))
    assert runs_only_ours(enrichment.enrich(orders))
