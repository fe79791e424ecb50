"""Named fault-injection points, for the crash tests.

Off unless PIPELINE_FAULT is set (read once at import: no cost when off). Format:
``PIPELINE_FAULT=<point>:<action>`` with action ``kill`` (SIGKILL our whole process
group, like an OOM killer or a pulled plug), ``raise`` (an exception at that point),
``crash`` (SIGSEGV of this process alone: inside a Spark task, a Python worker that dies),
``sleep=<seconds>`` (to let a test send a signal at that moment), ``wait=<path>`` (block
until that file exists, at most WAIT_SECONDS: lets a test act at that moment however slow
the machine, and go on at once when it is done) or ``skip`` (inject() returns True: the
caller skips the work at that point, as a bug that lost it would).
"""

from __future__ import annotations

import os
import signal
import sys
import time

POINTS = (
    "after_plan",
    "during_read",  # inside a Spark task, while results are being staged
    "after_task_commit",  # a Spark task's first attempt, after its staging commit
    "after_stage",  # every task staged; the publishing transaction open, nothing committed
    "before_commit",  # inside the publishing transaction, before COMMIT
    "after_commit",  # committed, before the process exits
)
# A dead-letter replay's points (driver/replay.py; tests/integration/test_dead_letters.py):
# apart from POINTS, whose every point an ingest run passes (test_faults.py kills one at each).
REPLAY_POINTS = (
    "replay_before_commit",  # inside the replay's one transaction, before COMMIT
)
# Points whose work a test makes the code skip (action ``skip``): a loss no real failure
# produces, that the run must still notice.
LOSS_POINTS = (
    "writer_piece",  # a transform's writer: one piece of rows (a partition's read range)
)
# ``pipeline verify``'s points (driver/verify.py; tests/integration/test_verify_scope.py).
VERIFY_POINTS = (
    "verify_chunk",  # before a partition's (next) offsets are verified
    "verify_read",  # Kafka's offsets of the partition known, before its records are read
)
# [sink] transactions' point (driver/transaction_prefetch.py; tests/integration/
# test_debezium.py): in the thread that reads the transaction topic during the data's read,
# after its read, before it hands the ENDs over.
TRANSACTION_POINTS = (
    "transactions_read_ahead",
)
WAIT_SECONDS = 300

_SPEC = os.environ.get("PIPELINE_FAULT", "")
# Spark's Python daemon moves its workers into a process group of their own (setpgid), so
# a worker's own group is not the run's. The driver records its group here; the JVM and
# the workers inherit it through the environment.
_DRIVER_PGID = "PIPELINE_FAULT_DRIVER_PGID"
if _SPEC and "PYTHON_WORKER_FACTORY_SECRET" not in os.environ:  # not inside a Spark worker
    os.environ[_DRIVER_PGID] = str(os.getpgrp())


class InjectedFault(RuntimeError):
    pass


def inject(point: str) -> bool:
    """Act at ``point`` as PIPELINE_FAULT says; True when the action is ``skip``."""
    if not _SPEC:
        return False
    name, _, action = _SPEC.partition(":")
    if name != point:
        return False
    if action == "skip":
        return True
    if action == "kill":
        # The whole run: the driver's group (driver and JVM) and, inside a Spark task, the
        # workers' group too; our own group last, as it ends this process.
        own = os.getpgrp()
        for pgid in {int(os.environ.get(_DRIVER_PGID, own))} - {own}:
            os.killpg(pgid, signal.SIGKILL)
        os.killpg(own, signal.SIGKILL)
    elif action == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif action.startswith("sleep="):
        # Tests wait for this line to act at this moment.
        print(f"fault injection: sleeping at {point}", file=sys.stderr, flush=True)
        time.sleep(float(action.split("=", 1)[1]))
    elif action.startswith("wait="):
        path = action.split("=", 1)[1]
        print(f"fault injection: waiting at {point}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + WAIT_SECONDS
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        raise InjectedFault(f"injected fault at {point}")
    return False
