"""The pipeline's own Postgres state: schema, runs and locks, offsets, staging, archive, dead
letters, ledger (core.py: the Store, its session and parts).

``Store`` is imported on first use, so that pipeline.store.run (the run and its staging
table's name: plain Python) can be imported without SQLAlchemy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.store.core import Store
    from pipeline.store.locks import LOCK_CLASS
    from pipeline.store.schema import migrations

__all__ = ["LOCK_CLASS", "Store", "migrations"]
_WHERE = {"Store": "pipeline.store.core", "LOCK_CLASS": "pipeline.store.locks",
          "migrations": "pipeline.store.schema"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'pipeline.store' has no attribute {name!r}")
