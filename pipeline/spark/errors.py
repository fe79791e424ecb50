"""A failed Spark job -> the run's one-line error: its class (exit code) and the fix.

Spark hands the driver one long text (a Py4JJavaError quoting the JVM's stack and the
failed task's Python traceback). An executor's own expected failure arrives typed
(errors.TaskError, decoded from that text: the executors' Kafka reads report
theirs so); everything else is recognised here by the root cause the text names: executors
without the job's Python or modules, a Python worker that died, Postgres unreachable. What
is not recognised is returned as it is (an internal error: exit 1).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.config import Settings, redact_url
from pipeline.errors import (
    ConfigError,
    DataError,
    Kind,
    PipelineError,
    TaskError,
    TransientError,
    decode,
)
from pipeline.plan.offsets import OffsetRange

# On executors: the job's Python or one of its modules is not there (a cluster whose workers
# were not sent the packed environment), or a Python worker died.
_NO_PYTHON = re.compile(r'Cannot run program "([^"]*)": error=2')
_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")
_WORKER_DIED = re.compile(r"Python worker exited unexpectedly \(crashed\)")
_FATAL_PYTHON = re.compile(r"Fatal Python error: ([^\n]*)")
SHIP_ENVIRONMENT = (
    "build the job's environment with 'scripts/package' and ship it: [spark.conf] "
    '"spark.archives" = "<repo>/dist/pipeline-env.tar.gz#job" and "spark.pyspark.python" = '
    '"./job/bin/python" (spark-submit: --archives dist/pipeline-env.tar.gz#job --conf '
    "spark.pyspark.python=./job/bin/python); see docs/cluster.md; nothing committed")
# Out of memory inside a task: Arrow Java's allocator (the JVM's direct memory: a batch to
# or from a Python worker), the JVM's heap, or a Python worker's MemoryError.
_OUT_OF_MEMORY = re.compile(
    r"(org\.apache\.arrow\.memory\.OutOfMemoryException|io\.netty\.util\.internal\."
    r"OutOfDirectMemoryError|java\.lang\.OutOfMemoryError|^MemoryError\b)[^\n]*", re.M)
_POSTGRES_UNREACHABLE = re.compile(r"psycopg\.(?:errors\.)?(?:OperationalError|AdminShutdown)"
                                   r": [^\n]*")
# What a TaskError's kind makes of the run: its class, so its exit code.
_TASK_ERROR_CLASS = {Kind.TRANSIENT: TransientError, Kind.PERMANENT: DataError,
                     Kind.CONFIG: ConfigError, Kind.RESIZE: TransientError}


def classify_spark_error(e: Exception, settings: Settings,
                         ranges: Sequence[OffsetRange] = ()) -> Exception:
    """The run's error for a failed Spark job ``e`` that read or staged ``ranges``."""
    if isinstance(e, PipelineError):
        return e
    if jvm_gone(e):
        read = ", ".join(str(r) for r in ranges) or "nothing"
        return TransientError(
            f"the driver's JVM died while the run read {read[:300]} (killed, e.g. by the "
            "kernel's OOM killer, or crashed); nothing committed - if it ran out of memory "
            "give the driver more (spark.driver.memory) or lower "
            "kafka.max_records_per_partition; then rerun")
    text = str(e)
    first = next((line for line in text.splitlines() if line.strip()), type(e).__name__)
    if (task := decode(text)) is not None:
        return task_error(task)
    if m := _NO_PYTHON.search(text):
        return ConfigError(f"Spark's executors cannot run the job's Python '{m.group(1)}' "
                           f"(not on the workers); {SHIP_ENVIRONMENT}")
    if m := _NO_MODULE.search(text):
        return ConfigError(f"Spark's executors lack the Python module '{m.group(1)}' the job "
                           f"needs; {SHIP_ENVIRONMENT}")
    if m := _OUT_OF_MEMORY.search(text):
        return out_of_memory(settings, ranges, m.group(0))
    if _WORKER_DIED.search(text):
        fatal = _FATAL_PYTHON.search(text)
        how = (f"crashed: Fatal Python error: {fatal.group(1).strip()[:200]}" if fatal else
               "killed, e.g. by the kernel's OOM killer, or crashed")
        read = ", ".join(str(r) for r in ranges) or "nothing"
        return PipelineError(
            f"a Spark Python worker died while the run read {read[:300]} ({how}); "
            "nothing committed - if the executors ran out of memory give them more "
            "(spark.executor.memory, spark.executor.memoryOverhead) or lower "
            "kafka.max_records_per_partition, then rerun; otherwise rerun with -v and report "
            "it")
    if m := _POSTGRES_UNREACHABLE.search(text):
        return TransientError(
            f"Postgres unreachable at {redact_url(settings.database_url)} while Spark staged "
            f"rows ({m.group(0)[:300]}); nothing committed - check the server, then retry")
    if any(s in text for s in ("TimeoutException", "Timed out waiting", "Connection refused",
                               "connection to server", "OperationalError",
                               "DisconnectException", "UNKNOWN_TOPIC")):
        return TransientError(
            f"the Spark read/stage failed on an unreachable service ({first[:300]}); nothing "
            f"committed - check Kafka at {settings.kafka.bootstrap_servers} and Postgres, "
            "then retry")
    if "InjectedFault" in text:
        return RuntimeError(f"injected fault in a Spark task: {first[:300]}")
    return e


def jvm_gone(e: BaseException) -> bool:
    """The driver's JVM is gone (killed or crashed): py4j lost its connection mid-call, or
    cannot connect again. Not a bug of the run, and nothing of it was committed."""
    from py4j.protocol import Py4JNetworkError

    if isinstance(e, Py4JNetworkError | ConnectionError):
        return True
    text = str(e)
    return ("Answer from Java side is empty" in text
            or "Error while sending or receiving" in text)


def out_of_memory(settings: Settings, ranges: Sequence[OffsetRange], seen: str
                  ) -> ConfigError:
    """A task ran out of memory (not the kernel's OOM killer: that is a dead worker): the
    run's memory settings are the operator's to change; retrying the same would fail the
    same way."""
    from pipeline.spark.arrow_settings import MAX_BYTES_PER_BATCH

    read = ", ".join(str(r) for r in ranges) or "nothing"
    arrow = (f"lower {MAX_BYTES_PER_BATCH} in [spark.conf] (e.g. \"16777216\"), "
             if settings.sink.transform else "")
    return ConfigError(
        f"a Spark task ran out of memory while the run read {read[:300]} ({seen[:200]}); "
        f"nothing committed - {arrow}give the driver and executors more memory "
        "(spark.driver.memory, spark.executor.memory, spark.executor.memoryOverhead) or "
        "lower kafka.max_records_per_partition, then rerun")


def task_error(task: TaskError) -> PipelineError:
    """An executor's typed failure as the run's error: its kind decides the exit code, its
    message (which names the range and the fix) is the run's."""
    return _TASK_ERROR_CLASS[task.kind](task.message[:600])
