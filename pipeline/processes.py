"""Whether a process of this machine still runs: ``pipeline unlock`` asks it of a run that
holds a lock, spark/scratch.py of a run whose scratch is left. A leaf any layer may use."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True
