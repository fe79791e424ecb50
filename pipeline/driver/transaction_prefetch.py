"""The transaction topic read while Spark reads the data ([sink] transactions).

A run's cut needs every END event from the stored offset of the transaction topic to its
latest (driver/transaction_topic.py): two of them per source transaction, read and parsed
on the driver, seconds for a backlog of 50,000 transactions. Read after the data, they add
those seconds to the run; nothing about them depends on the data's read. So the main
thread fixes where the read starts and ends before the Spark job (the stored offset, the
topic's position: ``planned_read``), and a daemon thread reads those ENDs while the job
runs. The cut's own read (read_transaction_ends, ``earlier``) then keeps them and reads
only what came after, when it starts where this one did; anything else (the read failed
or was not done, a start that moved, a topic's end that went back) is the full read, as
if nothing had been read ahead: the same ENDs, checks and errors.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from pipeline import faults
from pipeline.config import Settings
from pipeline.driver.transaction_topic import (
    PARTITION,
    TransactionTopicRead,
    planned_read,
    read_planned,
)
from pipeline.plan.offsets import TopicPartition

log = logging.getLogger("pipeline")


class TransactionPrefetch:
    """``TransactionPrefetch.start(...)`` before the data's read, ``result()`` when the
    cut needs it (the ENDs read, or None: the cut reads them all), ``close()`` when the run
    goes on without it (stops the read between two batches)."""

    def __init__(self, settings: Settings, planned: TransactionTopicRead):
        self.planned = planned
        self._stop = threading.Event()
        self._out: list[TransactionTopicRead] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._read, args=(settings,),
                                        name="transaction-topic", daemon=True)

    @classmethod
    def start(cls, settings: Settings, meta,
              stored: Callable[[], Mapping[TopicPartition, int]]) -> TransactionPrefetch | None:
        """The read of ``[sink] transactions`` from its offset ``stored()`` returns
        (store.offsets.load of the topic) to its latest offset now, started in a thread;
        None when even that cannot be had (the cut's read then says why, in its turn)."""
        try:
            planned = planned_read(settings, meta, stored())
        except Exception as e:  # noqa: BLE001 - the cut's read raises it again, in order
            log.debug("transaction topic not read ahead: %s", e)
            return None
        prefetch = cls(settings, planned)
        prefetch._thread.start()
        return prefetch

    def _read(self, settings: Settings) -> None:
        try:
            done = read_planned(settings, self.planned, self._stop.is_set)
            faults.inject("transactions_read_ahead")
            self._out.append(done)
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self._error.append(e)

    def result(self) -> TransactionTopicRead | None:
        """The ENDs read ahead, once the thread is done; None when it failed (logged)."""
        self._thread.join()
        if self._error or not self._out:
            e = self._error[0] if self._error else None
            p = self.planned
            log.info("the read ahead of %s[%d] [%d, %d) failed (%s): reading it all now",
                     p.topic, PARTITION, p.start, p.latest,
                     f"{type(e).__name__}: {e}" if e is not None else "no result",
                     extra={"event": "transactions.read_ahead_failed",
                            "error": f"{type(e).__name__}: {e}"})
            return None
        return self._out[0]

    def close(self) -> None:
        """The run goes on without the result (it failed before its cut)."""
        self._stop.set()
