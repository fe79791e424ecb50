"""The Store's way to Postgres: its SQLAlchemy engine, and how a database failure becomes
one of the pipeline's errors (exit code and one-line message).

The driver's side only (the Store, and the publisher's reader of staged blobs); the
executors connect with plain psycopg (pipeline/executor/stage.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError

from pipeline.config import redact_url
from pipeline.errors import ConfigError, ConflictError, PipelineError, TransientError

APPLICATION = "kafka-offset-pipeline"  # pg_stat_activity.application_name of the driver

# The driver's connections live as long as a run, idle while Spark reads, and one holds
# the run lock: keepalives on both ends. The client's keep a NAT or firewall from dropping
# an idle connection; the server's (and tcp_user_timeout) end the session of a driver
# host that vanished within about a minute and a half, instead of the kernel's two hours
# during which every run of the pipeline would exit 75 on its lock.
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
               "keepalives_count": 5}
_SESSION = ("-c TimeZone=UTC -c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 "
            "-c tcp_keepalives_count=5 -c tcp_user_timeout=60000")


def engine(url: str) -> Engine:
    """One per Store. Its pool is small: the Store's session (held from open to close: it
    holds the run lock) and the publisher's reader of staged blobs."""
    return create_engine(
        make_url(url).set(drivername="postgresql+psycopg"),
        connect_args={"connect_timeout": 10, "options": _SESSION,
                      "application_name": APPLICATION, **_KEEPALIVES},
        pool_size=2, max_overflow=1, pool_pre_ping=True,
        hide_parameters=True)  # row values stay out of error messages and run rows


# Connection failures that no retry fixes: the server refused our role or password, or the
# TLS settings on either side do not fit (libpq's and the server's own words).
_REFUSED = re.compile(
    r"password authentication failed|authentication failed for user|pg_hba\.conf|"
    r"password is required|no password supplied|role \"[^\"]*\" does not exist|"
    r"certificate verify failed|root certificate file|certificate .* does not match host|"
    r"server does not support SSL|invalid sslmode", re.I)


# libpq refused a statement before sending it (e.g. more than 65,535 parameters): a bug of
# ours, not an absent server, and no retry fixes it - exit 1, not 75 retried for ever.
_NOT_SENT = re.compile(r"number of parameters must be between", re.I)


def refused(url: str, e: BaseException) -> ConfigError | None:
    """Postgres refused the login or the TLS handshake: permanent until someone fixes the
    password, the trusted CA or pg_hba.conf (exit 2, not retried); None if not that."""
    if not (_REFUSED.search(str(e)) or (getattr(e, "sqlstate", None) or "").startswith("28")):
        return None
    user = make_url(url).username or "the default user"
    detail = " ".join(str(e).split())
    detail = detail[detail.find("FATAL:"):] if "FATAL:" in detail else detail
    text = str(e).lower()
    fix = ("point sslrootcert in database.url at the CA that signed the server's "
           "certificate (verify-full also checks its host name)"
           if "certificate" in text or "ssl" in text and "pg_hba" not in text else
           "connect as the server's pg_hba.conf allows this role (e.g. sslmode=verify-full"
           " for a hostssl-only role) or change pg_hba.conf" if "pg_hba" in text else
           f"fix the password of '{user}' in database.url / PIPELINE__DATABASE__URL (or "
           "ALTER ROLE ... PASSWORD on the server)")
    return ConfigError(f"Postgres at {redact_url(url)} refused role '{user}': "
                       f"{detail[:300]}; {fix}; not retried")


def unreachable(url: str, e: BaseException | str) -> TransientError:
    return TransientError(f"Postgres unreachable at {redact_url(url)} ({_first_line(e)}); "
                          "check the server and database.url / PIPELINE__DATABASE__URL, then retry")


def _first_line(e: BaseException | str) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def sort_error(url: str, e: BaseException) -> PipelineError | None:
    """The pipeline's error for a psycopg error, or None (a bug: left as it is)."""
    if isinstance(e, psycopg.errors.DeadlockDetected):
        # Not a conflict over offsets: two transactions waited for each other's locks and
        # Postgres ended this one (SQLSTATE 40P01).
        return TransientError(
            f"Postgres at {redact_url(url)} ended the run's transaction to break a deadlock "
            f"with another session ({_first_line(e)}); rolled back, nothing committed - "
            "retry (a deadlock is a bug of lock order: report it with the server log's "
            "detail of both sessions)")
    if isinstance(e, psycopg.errors.UniqueViolation):
        return ConflictError(
            f"another run (a backfill beside the ingest) published rows of the same offsets "
            f"first ({_first_line(e)}); rolled back, nothing written twice - rerun: it keeps "
            "those rows and adds the rest")
    # Before OperationalError: both are operator-intervention errors, a subclass of it.
    if isinstance(e, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled):
        return TransientError(
            f"Postgres at {redact_url(url)} cancelled the run's statement ({_first_line(e)}): "
            "a lock held by another session past database.lock_timeout_seconds, a statement "
            "longer than database.statement_timeout_seconds, or an operator; nothing "
            "committed - retry (see pg_locks / pg_stat_activity), or raise the timeout")
    if isinstance(e, psycopg.OperationalError | psycopg.errors.AdminShutdown):
        if _NOT_SENT.search(str(e)):
            return None
        return refused(url, e) or unreachable(url, e)
    return None


@contextmanager
def db_errors(url: str) -> Iterator[None]:
    """Sorts database failures: a lost connection is transient, anything else a bug.
    SQLAlchemy wraps the driver's errors (DBAPIError): the driver's own is sorted."""
    try:
        yield
    except PipelineError:
        raise
    except (DBAPIError, psycopg.Error) as e:
        driver_error = e.orig if isinstance(e, DBAPIError) and e.orig is not None else e
        sorted_error = sort_error(url, driver_error)
        if sorted_error is None:
            raise
        raise sorted_error from None
