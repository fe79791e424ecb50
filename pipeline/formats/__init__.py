"""Record formats: a Kafka record's bytes -> typed values -> Postgres COPY lines, and the
dead-letter reason when that fails. Runs on the executors; pure, unit-tested without Spark.
"""
