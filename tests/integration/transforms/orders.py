"""A user transform for the tests: DataFrame in, DataFrame out."""


def double_amount(df):
    from pyspark.sql import functions as F

    return df.withColumn("amount", F.col("amount") * 2).where(F.col("order_id") % 10 != 0)
