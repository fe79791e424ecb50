"""A run: its id, kind and pipeline, and what derives from them - the lock it takes, its
staging table, whether it replaces what it re-reads.

Plain Python (no SQLAlchemy): the staging table's name is also what the cleanup and the
tests look for, and importing this costs nothing. The table's columns are
pipeline/store/tables.staging; ``Run.staging_copy`` reads them only when called (driver).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum

from psycopg import sql

from pipeline.store.copy_in import copy_statement
from pipeline.store.identifiers import identifiers


class Kind(StrEnum):
    """What a run does (pipeline_runs.kind)."""

    INGEST = "ingest"  # the scheduled run: moves the stored offsets
    BACKFILL = "backfill"  # re-reads explicit ranges; offsets stay; rows already there stay
    REPROCESS = "reprocess"  # a backfill that replaces what the ranges held
    OFFSETS = "offsets"  # an operator's change of the stored offsets (no read)
    REPLAY = "replay"  # dead letters re-decoded with the current [sink] (driver/replay.py)

    @property
    def family(self) -> str:
        """The family whose lock it is named by (its run row's lock key): a backfill or
        reprocess has its own, so that it runs beside the scheduled ingest; an 'offsets'
        change and a replay take both locks (see FAMILIES)."""
        return "backfill" if self in (Kind.BACKFILL, Kind.REPROCESS) else "ingest"

    @property
    def overwrite(self) -> bool:
        """Rows and dead letters already in the ranges are replaced, not kept."""
        return self is Kind.REPROCESS


# The run locks: two per pipeline. "ingest" serialises what moves the offsets (scheduled
# runs); a "backfill" or reprocess, which never moves them, takes its own, so a long backfill
# runs beside the scheduled ingest instead of making it exit 75 for hours. Both write
# results idempotently; two runs writing the same offsets at once are told apart by the
# results table's key (one waits, then conflicts and retries: see db_errors). 'offsets'
# changes take both. A dead-letter replay takes both too: it writes the results and
# dead-letter tables the scheduled run and a backfill write (the dead letters of the same old
# offsets, say), so they take turns (a busy one exits 75), and a replay killed mid-way is
# marked abandoned by the next run of either family, which knows its kind.
FAMILIES: dict[str, tuple[Kind, ...]] = {
    "ingest": (Kind.INGEST, Kind.REPLAY), "backfill": (Kind.BACKFILL, Kind.REPROCESS,
                                                       Kind.REPLAY),
    "offsets": (Kind.OFFSETS,)}


def kinds_of(family: str) -> tuple[Kind, ...]:
    """The kinds of run that may hold ``family``'s lock: its own, and an 'offsets' change
    (it takes both locks)."""
    return FAMILIES[family] + FAMILIES["offsets"]


def lock_key(pipeline: str, family: str) -> str:
    """What the advisory lock of a pipeline's ``family`` hashes (store.locks)."""
    return pipeline if family == "ingest" else f"{pipeline}:{family}"


# ---- staging table names -----------------------------------------------------------------
# Postgres truncates identifiers to 63 bytes: a longer staging name would be shared by two
# runs and missed by the cleanup. 7 + 24 + 1 + 8 + 2 + 19 (any bigint run id) = 61 bytes.
_NAME_CHARS = 24


def staging_table(pipeline: str, run_id: int) -> str:
    """The name of a run's staging table: the pipeline's name (cut short, for people) and a
    digest of the whole name (so that pipelines sharing a long prefix never share one)."""
    return f"{_staging_prefix(pipeline)}{run_id}"


def staging_pattern(pipeline: str) -> str:
    """A regular expression matching every staging table of this pipeline, including the
    names that versions before bounded names used (``_stage_<name>_r<id>_blobs``)."""
    return (rf"^{re.escape(_staging_prefix(pipeline))}\d+$"
            rf"|^_stage_{re.escape(pipeline)}_r\d+_(rows|dead|blobs)$")


def _staging_prefix(pipeline: str) -> str:
    digest = hashlib.sha256(pipeline.encode()).hexdigest()[:8]
    return f"_stage_{pipeline[:_NAME_CHARS]}_{digest}_r"


@dataclass(frozen=True)
class Run:
    """One row of pipeline_runs, as the code that runs it sees it (store.runs.start)."""

    id: int
    kind: Kind
    pipeline: str
    schema: str  # database.schema: where its staging table lives

    @property
    def family(self) -> str:
        return self.kind.family

    @property
    def lock_key(self) -> str:
        return lock_key(self.pipeline, self.family)

    @property
    def overwrite(self) -> bool:
        return self.kind.overwrite

    @property
    def staging_name(self) -> str:
        return staging_table(self.pipeline, self.id)

    @property
    def staging(self) -> sql.Identifier:
        """The staging table, schema-qualified."""
        return sql.Identifier(self.schema, self.staging_name)

    def staging_copy(self) -> tuple[str, list[str]]:
        """What an executor needs to stage its blobs (it imports no SQLAlchemy): the binary
        COPY into this run's staging table, and its column types as psycopg names them."""
        from pipeline.store import tables  # SQLAlchemy: the driver's side only

        columns = tables.staging(self.staging_name).columns
        statement = copy_statement(self.staging, identifiers(c.name for c in columns),
                                   binary=True)
        return statement.as_string(None), [tables.ddl_type(c.type) for c in columns]
