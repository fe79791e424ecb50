"""A user transform for the tests: DataFrame in, DataFrame out."""


def double_amount(df):
    from pyspark.sql import functions as F

    return df.withColumn("amount", F.col("amount") * 2).where(F.col("order_id") % 10 != 0)


def identity(df):
    """Changes nothing: a run with it takes the transform path (Spark's Kafka source and
    Spark SQL parsing), so the tests can hold both paths to the same outcomes."""
    return df
