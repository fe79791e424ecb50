"""A range's records read on the driver, a batch at a time, with progress lines: what
``pipeline verify`` re-reads. The reading itself is the executors' (executor/consume.py);
this turns its task errors into the driver's error classes (exit codes)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from pipeline.errors import ConfigError, DataError, PipelineError, TransientError
from pipeline.plan.offsets import OffsetRange

log = logging.getLogger(__name__)

PROGRESS_EVERY = 1_000_000  # records between progress lines inside one range


def batches(reader: dict, r: OffsetRange, timeout: float, what: str = "verify"
            ) -> Iterator[list]:
    """The records Kafka returns for ``r`` (Messages), a batch at a time, with progress;
    ``what`` reads them (it starts the log lines and errors)."""
    from pipeline.errors import Kind, TaskError
    from pipeline.executor.consume import read_range

    seen = 0
    try:
        for batch in read_range(reader, r, timeout):
            yield batch
            before, seen = seen, seen + len(batch)
            if seen // PROGRESS_EVERY > before // PROGRESS_EVERY:
                log.info("%s %s: %d records read", what, r, seen)
    except TaskError as e:
        error: type[PipelineError] = {Kind.CONFIG: ConfigError, Kind.PERMANENT: DataError
                                      }.get(e.kind, TransientError)
        raise error(f"{what}: {e.message}") from None
