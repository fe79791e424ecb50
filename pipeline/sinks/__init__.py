"""Sink modes (append, upsert, aggregate): how staged rows become the results table."""
