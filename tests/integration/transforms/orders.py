"""A user transform for the tests: DataFrame in, DataFrame out."""


def double_amount(df):
    from pyspark.sql import functions as F

    return df.withColumn("amount", F.col("amount") * 2).where(F.col("order_id") % 10 != 0)


def identity(df):
    """Changes nothing: a run with it takes the transform path (Spark's Kafka source and
    Spark SQL parsing), so the tests can hold both paths to the same outcomes."""
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
