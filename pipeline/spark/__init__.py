"""Spark: session launch, a failed job's classification, the user transform hook
(transform.py), and Spark's Kafka source with explicit ranges (read.py: no run uses it;
the benchmark's peers and the stack test do).
"""
