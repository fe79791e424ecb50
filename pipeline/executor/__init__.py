"""Code that runs inside Spark tasks on the executors: read Kafka ranges, stage rows in
Postgres. Imports nothing that needs the driver (no SparkSession, no SQLAlchemy).
"""
