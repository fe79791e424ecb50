"""Stopping a run: SIGTERM/SIGINT (or spark-submit dying) cancel the Spark jobs and unwind,
but never inside the publishing transaction, a COPY or a py4j call."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.errors import PipelineError, SparkStartError, Terminated

log = logging.getLogger("pipeline")


class StopSignals:
    """SIGTERM/SIGINT: cancel Spark jobs and unwind (everything uncommitted rolls back),
    except inside the publishing transaction, where the COMMIT or ROLLBACK finishes first."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.critical = False
        self.deferred = False  # record only; the main loop calls check() (see overlapped)
        self.sc = None
        self.parent_pid: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        self.parent_pid = os.getppid()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. inside a test runner thread)
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum
        name = signal.Signals(signum).name
        if self.critical:
            log.warning("%s received during the publishing transaction: letting it finish", name,
                        extra={"event": "signal", "signal": name, "publishing": True})
            return
        log.warning("%s received: cancelling Spark jobs and rolling back", name,
                    extra={"event": "signal", "signal": name, "publishing": False})
        if self.sc is not None:
            # From another thread: this handler usually interrupts the main thread inside a
            # py4j call, and re-entering that thread's py4j connection fails.
            threading.Thread(target=self._cancel_spark, args=(self.sc,),
                             name="cancel-spark-jobs", daemon=True).start()
        if not self.deferred:
            self.check()

    def check(self) -> None:
        if self.received is not None:
            raise Terminated(f"stopped by {signal.Signals(self.received).name}; nothing "
                             "committed by this run, safe to rerun")

    def cancel_spark(self) -> None:
        """Cancel this run's Spark jobs (from the thread that calls it)."""
        self._cancel_spark(self.sc)

    @staticmethod
    def _cancel_spark(sc) -> None:
        try:
            sc.cancelAllJobs()
        except Exception:  # noqa: BLE001 - we are stopping anyway
            log.debug("could not cancel the Spark jobs", exc_info=True)

    def stop_error(self, e: BaseException) -> BaseException:
        """The handler's Terminated, raised inside a py4j call, surfaces as a Py4JError (or
        as the error of the job it cancelled): after a stop signal that is still a stop."""
        # Whatever the error says (a classified Spark failure included), once spark-submit
        # is gone it is the stop, not the cause.
        if self.received is None and self._orphaned(e):
            return Terminated("spark-submit (this driver's parent) died; nothing committed "
                              "by this run, safe to rerun")
        # A stop that lands while Spark starts breaks the start-up: the handler's Terminated
        # inside py4j's wait for the JVM becomes a Py4JError, and that a start error. The
        # stop is the cause, not a configuration to fix.
        if self.received is None or (isinstance(e, PipelineError)
                                     and not isinstance(e, SparkStartError)):
            return e
        return Terminated(f"stopped by {signal.Signals(self.received).name}; nothing "
                          "committed by this run, safe to rerun")

    def _orphaned(self, e: BaseException) -> bool:
        """Under spark-submit the JVM is our parent: when it is killed, the gateway's
        socket closes a moment before the kernel re-parents us, and the failed py4j call
        may surface first, even as a classified Spark error: a new parent within a second
        means the run was stopped, not that it broke."""
        from pipeline.spark.session import submitted

        if self.parent_pid is None or not submitted():
            return False
        for _ in range(20):
            if os.getppid() != self.parent_pid:
                return True
            time.sleep(0.05)
        return False

    @contextmanager
    def held(self) -> Iterator[None]:
        """Stop signals are only recorded meanwhile: while a failed run is recorded, a stop
        (e.g. spark-submit's death, seen by submit.stop_when_orphaned a moment after the
        failure it caused) must not cut short its run row or the drop of its staging."""
        deferred, self.deferred = self.deferred, True
        try:
            yield
        finally:
            self.deferred = deferred

    @contextmanager
    def shielded(self) -> Iterator[None]:
        self.critical = True
        try:
            yield
        finally:
            self.critical = False
        if self.received is not None:
            name = signal.Signals(self.received).name
            raise Terminated(f"stopped by {name} after the publishing transaction finished")


def overlapped(job, take, signals: StopSignals, every: float = 0.25) -> None:
    """Run the Spark ``job`` in a thread while this (main) thread publishes what its tasks
    have committed so far (``take``). Signals are only recorded meanwhile and acted on
    here, between two takes: never inside a COPY or a py4j call."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            failure.append(e)

    worker = threading.Thread(target=run, name="spark-job", daemon=True)
    signals.deferred = True
    try:
        worker.start()
        while worker.is_alive():
            signals.check()
            take()
            worker.join(every)
        signals.check()
        if failure:
            raise failure[0]
        take()  # what the last tasks committed
    except BaseException:
        # Stopping: the signal handler (or this) cancels the Spark jobs; wait for the thread
        # so that a cancelled job is not left running beside the next run in this process.
        if worker.is_alive() and signals.sc is not None:
            signals.cancel_spark()
            worker.join(60)
        raise
    finally:
        signals.deferred = False
