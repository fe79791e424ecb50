"""The driver: one run's story (plan, stage on executors, publish in one transaction),
Kafka metadata, the database session, metrics.
"""
