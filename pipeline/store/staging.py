"""A run's staging table (UNLOGGED, tables.staging): created before the executors write
their blobs into it (executor/stage.py), read by the publisher, dropped with the publish or
the failure, or by the next run's cleanup after a crash."""

from __future__ import annotations

import re
from collections.abc import Iterable

import psycopg
from psycopg import sql
from sqlalchemy import inspect
from sqlalchemy.schema import CreateTable, DropTable

from pipeline.store import tables
from pipeline.store.run import Run, staging_pattern, staging_table
from pipeline.store.session import Session


class Staging:
    """The staging tables of the Store's session (``store.staging``)."""

    def __init__(self, db: Session):
        self.db = db

    def create(self, run: Run) -> str:
        name = run.staging_name
        self.db.run(CreateTable(tables.staging(name)))
        # The blobs are compressed with LZ4 (Postgres >= 14 built with it): 5x smaller
        # staging for the same CPU (1M records: 22 MB instead of 105 MB, write 0.25-0.32 us
        # and read 0.14 us per record either way); without LZ4 they are stored uncompressed
        # (EXTERNAL), as pglz would cost CPU on blobs that are read once and dropped.
        try:
            self.db.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN blob SET COMPRESSION lz4")
                            .format(run.staging))
        except psycopg.Error:
            self.db.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN blob SET STORAGE EXTERNAL")
                            .format(run.staging))
        return name

    def drop(self, run: Run) -> None:
        self.db.run(DropTable(tables.staging(run.staging_name), if_exists=True))

    def drop_leftovers(self, in_use: Iterable[int]) -> int:
        """Drop this pipeline's staging tables but those of the runs ``in_use``; returns
        how many were dropped."""
        db = self.db
        keep = {staging_table(db.pipeline, r) for r in in_use}
        pattern = re.compile(staging_pattern(db.pipeline))
        with db.transaction():
            names = inspect(db.session).get_table_names(schema=db.settings.schema)
        leftovers = [n for n in names if pattern.search(n) and n not in keep]
        for name in leftovers:
            db.run(DropTable(tables.staging(name), if_exists=True))
        return len(leftovers)
