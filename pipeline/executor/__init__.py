"""Code that runs inside Spark tasks on the executors: read Kafka ranges, stage rows in
Postgres (staging.py: the staging table's contract the driver and store read by). A
transform's read and write tasks are in transform/. Imports nothing that needs the driver
(no SparkSession, no SQLAlchemy).
"""
