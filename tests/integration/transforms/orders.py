"""A user transform for the tests: DataFrame in, DataFrame out."""


def double_amount(df):
    from pyspark.sql import functions as F

    return df.withColumn("amount", F.col("amount") * 2).where(F.col("order_id") % 10 != 0)


def amount_as_double(df):
    """A column of another type than declared (a double for a decimal): Postgres parses
    its text."""
    from pyspark.sql import functions as F

    return df.withColumn("amount", F.col("amount").cast("double"))


def identity(df):
    """Changes nothing: a run with it takes the transform path (the read tasks as a
    DataFrame, a second mapInArrow staging its rows), so the tests can hold both paths to
    the same outcomes."""
    return df


def order_7_twice(df):
    """A transform gone wrong (a join that matched twice): the record of order 7 comes out
    as two rows, in another Spark partition than the first (a union appends partitions)."""
    from pyspark.sql import functions as F

    return df.unionByName(df.where(F.col("order_id") == 7))


def every_order_twice(df):
    """Two rows per record, side by side in one Arrow batch (an explode)."""
    from pyspark.sql import functions as F

    return df.withColumn("_copy", F.explode(F.array(F.lit(1), F.lit(2)))).drop("_copy")


def label_status(df):
    """A derived column (declared in [sink.columns], absent from the JSON): the status in
    capitals."""
    from pyspark.sql import functions as F

    return df.withColumn("label", F.upper(F.col("status")))


def skip_every_third_order(df):
    """A filter: orders whose id is a multiple of 3 are left out."""
    from pyspark.sql import functions as F

    return df.where(F.col("order_id") % 3 != 0)


def drop_order_id(df):
    """A transform gone wrong: it drops the upsert sink's key."""
    return df.drop("order_id")


def order_7_without_id(df):
    """A transform gone wrong: the record of order 7 comes out with a null key."""
    from pyspark.sql import functions as F

    return df.withColumn("order_id", F.when(F.col("order_id") != 7, F.col("order_id")))


def select_a_column_that_is_not_there(df):
    """A transform gone wrong: Spark refuses its plan (AnalysisException) when it is built."""
    return df.select("order_id", "no_such_column")


def first_ten(df):
    """A transform gone wrong: it limits its input, so the read stops before its end."""
    return df.limit(10)


def evens_then_odds(df):
    """Reads its input twice (a union of two filters): each read task runs twice, and each
    record is still one row."""
    from pyspark.sql import functions as F

    return df.where(F.col("order_id") % 2 == 0).unionByName(
        df.where(F.col("order_id") % 2 == 1))


def shuffled(df):
    """A shuffle: each output partition mixes records of every read task."""
    return df.repartition(3)


# What arrow_probe saw, run by run (in-process runs); a CLI run writes it to the file named
# by TEST_ARROW_PROBE.
ARROW_SEEN: list[dict] = []


def arrow_probe(df):
    """Changes nothing; records the Arrow settings the transform's job runs with: the
    session's byte cap per batch and the driver JVM's Arrow checks (system properties)."""
    import json
    import os

    spark = df.sparkSession
    system = spark.sparkContext._jvm.java.lang.System
    seen = {"maxBytesPerBatch": spark.conf.get("spark.sql.execution.arrow.maxBytesPerBatch"),
            **{p: system.getProperty(p) for p in ("arrow.enable_unsafe_memory_access",
                                                  "arrow.enable_null_check_for_get")}}
    ARROW_SEEN.append(seen)
    if os.environ.get("TEST_ARROW_PROBE"):
        with open(os.environ["TEST_ARROW_PROBE"], "w") as f:
            json.dump(seen, f)
    return df
