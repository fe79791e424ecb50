"""The Spark path: session launch, Spark's Kafka source with explicit ranges, rows in Spark SQL
(the user transform hook).
"""
