"""``pipeline unlock``: who holds a pipeline's run lock; end that session only when the run
behind it is really gone.

The lock is a session advisory lock (store/locks.py, Locks.try_lock): it lasts as long as the
connection of the run that took it. A driver that crashes closes that connection and
frees the lock at once. A driver host that vanishes (power, network) leaves it open until
the server's keepalives give up (about 90 s with our settings; hours with the kernel's
defaults on a connection opened by something else), and every run meanwhile exits 75.
"""

from __future__ import annotations

import argparse
import socket
import sys
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from pipeline.commands.args import add_command
from pipeline.commands.output import print_json
from pipeline.config import Settings
from pipeline.errors import EXIT_OK, ConfigError, ConflictError
from pipeline.processes import process_alive


@dataclass
class LockHolder:
    """The Postgres session holding the lock and, if it is a run's, that run's row."""

    session_pid: int
    application: str
    client: str  # address:port, or "local socket"
    session_started: datetime
    state: str
    state_since: datetime | None
    family: str = "ingest"  # which of the pipeline's locks (store/run.py, FAMILIES)
    run_id: int | None = None
    kind: str | None = None
    host: str | None = None
    pid: int | None = None
    run_started: datetime | None = None

    def describe(self) -> str:
        run = (f"run {self.run_id} ({self.kind}, {self.host} pid {self.pid}, started "
               f"{self.run_started:%Y-%m-%d %H:%M:%S})" if self.run_id is not None
               else "no running run recorded")
        since = f" since {self.state_since:%Y-%m-%d %H:%M:%S}" if self.state_since else ""
        return (f"Postgres session {self.session_pid} ({self.application or 'unnamed'} from "
                f"{self.client}, {self.state}{since}): {run}")


def lock_holders(store) -> list[LockHolder]:
    """The sessions holding the pipeline's locks (ingest, backfill), with their runs."""
    holders = []
    for family in ("ingest", "backfill"):
        session = store.locks.lock_session(family)
        if session is None or any(h.session_pid == session["session_pid"] for h in holders):
            continue  # an 'offsets' change holds both: one holder
        run = store.locks.running_run(family) or {}
        holders.append(LockHolder(**session, family=family, run_id=run.get("run_id"),
                                  kind=run.get("kind"), host=run.get("host"),
                                  pid=run.get("pid"), run_started=run.get("started_at")))
    return holders


def verdict(holder: LockHolder, this_host: str, force: bool) -> tuple[bool, str]:
    """(may end the session, why). Only a run on this host can be checked for being gone;
    anything else needs a person's word (--force)."""
    if holder.run_id is None:
        if force:
            return True, "--force given"
        return False, ("no running run is recorded for it (a run still planning, an "
                       "'offsets' command, or another tool): if its process is gone, rerun "
                       "with --force")
    if holder.host != this_host:
        if force:
            return True, "--force given"
        return False, (f"its run is on host {holder.host}, which cannot be checked from "
                       f"here: if pid {holder.pid} is gone there, rerun with --force (the "
                       "server also ends the session itself once its keepalives fail)")
    if process_alive(holder.pid):
        return False, (f"pid {holder.pid} is still alive on this host: let the run finish, "
                       f"or stop it with 'kill -TERM {holder.pid}' (it rolls back)")
    return True, f"pid {holder.pid} no longer exists on this host"


def cmd_unlock(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks import for_tables
    from pipeline.store import Store

    with Store(settings) as store:
        store.schema.check(for_tables(settings, settings.kafka.topics))
        holders = lock_holders(store)
        if not holders:
            return _report(args, {"pipeline": settings.name, "locked": False, "ended": []},
                           f"pipeline '{settings.name}' is not locked")
        refused, ended, abandoned = [], [], []
        for holder in holders:
            ok, why = verdict(holder, socket.gethostname(), args.force)
            print(f"{holder.family} lock of pipeline '{settings.name}' held by "
                  f"{holder.describe()}", file=_out(args))
            if not ok:
                refused.append(f"its {holder.family} lock stays: {why}")
                continue
            try:
                done = store.locks.end_session(holder.session_pid)
            except Exception as e:  # noqa: BLE001 - a privilege is the usual cause
                raise ConfigError(f"could not end Postgres session {holder.session_pid} "
                                  f"({str(e).strip().splitlines()[0]}): connect as its owner, "
                                  "a superuser or a member of pg_signal_backend") from None
            if done:
                ended.append({**asdict(holder), "why": why})
                # The lock is ours to take now: mark the dead run abandoned, drop its staging.
                if store.locks.try_lock(holder.family):
                    abandoned += store.runs.abandon_stale((holder.family,))
        if refused:
            raise ConflictError(f"pipeline '{settings.name}': " + "; ".join(refused))
        return _report(args, {"pipeline": settings.name, "locked": True, "ended": ended,
                              "abandoned": abandoned},
                       "; ".join(f"ended session {e['session_pid']} ({e['why']})"
                                 for e in ended) + f"; runs marked abandoned: "
                       f"{abandoned or 'none'}; the next run can start")


def _out(args):
    return sys.stderr if args.json else sys.stdout


def _report(args, doc: dict[str, Any], text: str) -> int:
    if args.json:
        print_json(doc)
    else:
        print(text)
    return EXIT_OK


UNLOCK_HELP = """\
Show who holds the pipeline's run lock and, when the run behind it is really gone, end
its Postgres session so the next run can start. A run on this host is checked (its pid no
longer exists); a run on another host, or a holder with no running run, is ended only
with --force, after you have checked yourself. A live run is never ended here: stop it
with SIGTERM (it rolls back). Ending the session rolls back whatever it had not committed;
its run is marked abandoned and its staging table dropped. Usually not needed: a crashed
driver frees the lock at once, and a vanished host's session is ended by the server's
keepalives within about 90 s."""

UNLOCK_EXAMPLES = """\
examples:
  pipeline unlock --config conf/local.toml            # who holds it; end it if dead
  pipeline unlock --config conf/local.toml --force    # the holder's host is gone for good
"""


def register(sub) -> None:
    p = add_command(sub, "unlock", "Show who holds the pipeline's run lock; end that session "
                    "if its run is gone.", UNLOCK_HELP, UNLOCK_EXAMPLES)
    p.add_argument("--force", action="store_true",
                   help="end the session even when its run cannot be checked from here")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(handler=cmd_unlock)
