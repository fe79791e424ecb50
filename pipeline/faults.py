"""Named fault-injection points, for the crash tests.

Off unless PIPELINE_FAULT is set (read once at import: no cost when off). Format:
``PIPELINE_FAULT=<point>:<action>`` with action ``kill`` (SIGKILL our whole process
group, like an OOM killer or a pulled plug), ``raise`` (an exception at that point) or
``sleep=<seconds>`` (to let a test send a signal at that moment).
"""

from __future__ import annotations

import os
import signal
import time

POINTS = (
    "after_plan",
    "during_read",  # inside a Spark task, while results are being staged
    "after_stage",  # results staged, publishing transaction not yet begun
    "before_commit",  # inside the publishing transaction, before COMMIT
    "after_commit",  # committed, before the process exits
)

_SPEC = os.environ.get("PIPELINE_FAULT", "")


class InjectedFault(RuntimeError):
    pass


def inject(point: str) -> None:
    if not _SPEC:
        return
    name, _, action = _SPEC.partition(":")
    if name != point:
        return
    if action == "kill":
        # The whole process group: the driver, its JVM and Python workers die at once.
        os.killpg(os.getpgrp(), signal.SIGKILL)
    elif action.startswith("sleep="):
        time.sleep(float(action.split("=", 1)[1]))
    else:
        raise InjectedFault(f"injected fault at {point}")
