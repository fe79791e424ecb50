"""How a psycopg error becomes the pipeline's error (store/database.sort_error): what a
retry fixes is transient (exit 75), what it cannot fix is not."""

from __future__ import annotations

import psycopg

from pipeline.errors import EXIT_TRANSIENT
from pipeline.store.database import sort_error

URL = "postgresql://pipeline:secret@db.example:5432/pipeline"


def test_a_lost_connection_is_transient_naming_the_server_without_the_password():
    e = sort_error(URL, psycopg.OperationalError(
        "connection failed: connection to server at \"10.0.0.5\", port 5432 failed: "
        "Connection refused"))
    assert e is not None and e.exit_code == EXIT_TRANSIENT
    assert "Postgres unreachable at" in str(e) and "secret" not in str(e)


def test_a_statement_libpq_refused_to_send_is_a_bug_not_an_unreachable_server():
    # What a statement with one parameter per source transaction raised once a run read
    # more than 65,535 of them: before, 'Postgres unreachable' (exit 75), retried for ever.
    e = psycopg.OperationalError(
        "sending query and params failed: number of parameters must be between 0 and 65535")
    assert sort_error(URL, e) is None  # left as it is: an internal error, exit 1
