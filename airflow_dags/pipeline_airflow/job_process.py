"""spark-submit as the task's child process: started in a session of its own, its stdout
and stderr streamed line by line into the task log as they come (the last lines kept for
the failure message), and stopped politely when Airflow stops the task."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
from contextlib import suppress
from typing import Any

# Airflow escalates to SIGKILL 5 s after SIGTERM; the driver unwinds on its own anyway.
KILL_GRACE_SECONDS = 4.0
TAIL_LINES = 500


def exit_code_of(returncode: int) -> int:
    """A process's exit code as a shell reports it: killed by signal N = 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class JobProcess:
    """One spark-submit of the job. ``driver`` is the job's entry point (pipeline/submit.py):
    the process on whose command line it appears is the Python driver, which spark-submit
    does not pass a signal on to."""

    def __init__(self, cmd: list[str], env: dict[str, str], driver: str, log: Any) -> None:
        self.cmd, self.env, self.driver, self.log = cmd, env, driver, log
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._process: subprocess.Popen | None = None
        self._readers: list[threading.Thread] = []

    def start(self) -> None:
        """OSError if it cannot be started. Its own session and process group: stop() can
        reach spark-submit, the driver and anything they started, and nothing of ours."""
        self._process = subprocess.Popen(
            self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True)
        for stream, name in ((self._process.stdout, "job-stdout"),
                             (self._process.stderr, "job-stderr")):
            reader = threading.Thread(target=self._stream, args=(stream,), name=name,
                                      daemon=True)
            reader.start()
            self._readers.append(reader)

    def wait(self) -> int:
        """Its exit code, as a shell reports it, once its output is read to the end."""
        try:
            returncode = self._process.wait()
        except BaseException:
            self.stop()  # a timeout or a signal interrupted the wait
            raise
        for reader in self._readers:
            reader.join(timeout=60)  # EOF once the job's processes are gone
        return exit_code_of(returncode)

    def _stream(self, stream: Any) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            self.log.info("%s", line)

    def stop(self) -> None:
        """First SIGTERM the job's Python driver: it cancels its Spark jobs, rolls back,
        records its run as failed and exits 143. Then, after a grace period, stop whatever
        is left of the process group, politely first."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        import psutil

        children = []
        with suppress(psutil.Error):
            children = psutil.Process(process.pid).children(recursive=True)
        for child in children:
            with suppress(psutil.Error):  # e.g. the launcher's zombie shell
                if self.driver in child.cmdline():
                    self.log.info("sending SIGTERM to the pipeline driver (pid %d)", child.pid)
                    child.terminate()
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILL_GRACE_SECONDS)
        # spark-submit returns once its driver has: if it still runs, the driver did not
        # unwind in time.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if process.poll() is not None:
                break
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)  # the group's id is spark-submit's pid
                self.log.info("sent %s to the spark-submit process group %d", sig.name,
                              process.pid)
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_GRACE_SECONDS)
