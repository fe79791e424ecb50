"""The pipeline's own Postgres state: schema, runs and locks, offsets, staging, archive."""
from pipeline.store.core import LOCK_CLASS, Store, migrations

__all__ = ["LOCK_CLASS", "Store", "migrations"]
