"""A reused Python worker gives its task's freed memory back before its next task.

Spark reuses its Python workers (spark.python.worker.reuse), and a transform run's
workers take turns: a worker that read Kafka for one task writes COPY blobs for the next,
and the other way round (8 tasks on 2 slots, a reader and a writer each). What a task
freed stayed in the worker's C heap (librdkafka's buffers, Arrow's batches through the
system allocator, the fragments between them), so a worker that had been both peaked at
105-114 MB where a fresh one peaks at 92-97, and the run's summed RSS with it
(docs/benchmarks.md, "round four"). A garbage collection and glibc's ``malloc_trim(0)``
(which hands free pages of every arena back, not only the heap's top) at the end of each
task cost no CPU that shows at 2M records (16 calls a run).
"""

from __future__ import annotations

import ctypes
import gc


def release_memory() -> bool:
    """Collect garbage and return the C heap's free pages to the system; whether the C
    library could (glibc has ``malloc_trim``; musl, macOS do not: collected only)."""
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim  # this process's C library
    except (OSError, AttributeError):
        return False
    trim(0)
    return True
