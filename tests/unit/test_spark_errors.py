"""A failed Spark job's error text -> the run's error: its class, its exit code, and a
message that names the fix. The texts are shaped as Spark 4 and Py4J hand them over."""

from __future__ import annotations

import pytest

from pipeline.config import parse_settings
from pipeline.errors import (
    EXIT_CONFIG,
    EXIT_DATA,
    EXIT_INTERNAL,
    EXIT_TRANSIENT,
    ConfigError,
    DataError,
    Kind,
    PipelineError,
    TransientError,
)
from pipeline.executor.consume import RangeReadError
from pipeline.plan.offsets import OffsetRange
from pipeline.spark.errors import SHIP_ENVIRONMENT, classify_spark_error

SETTINGS = parse_settings({
    "pipeline": {"name": "orders"},
    "kafka": {"bootstrap_servers": "kafka-1:9092", "topics": ["orders"],
              "consumer": {"security.protocol": "SASL_SSL"}},
    "database": {"url": "postgresql://job:s3cret@db.internal:5432/warehouse"},
    "sink": {"format": "raw", "table": "orders_raw"},
}, source="<test>", environ={})
RANGES = [OffsetRange("orders", 0, 100, 200), OffsetRange("orders", 1, 50, 80)]


class Py4JJavaError(Exception):
    """Stands in for py4j's: only its text reaches the classifier."""


def job_failed(cause: str, python_traceback: str | None = None) -> Py4JJavaError:
    """A failed Spark job as Py4J raises it: the JVM's stage failure naming the task's
    cause (a Java exception, or a Python worker's traceback), then the driver's stack."""
    if python_traceback is not None:
        cause = ("org.apache.spark.api.python.PythonException: Traceback (most recent call "
                 "last):\n  File \"/opt/job/pipeline/executor/stage.py\", line 301, in "
                 f"stage_ranges\n{python_traceback}\n")
    text = ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD."
            "collectAndServe.\n: org.apache.spark.SparkException: Job aborted due to stage "
            "failure: Task 0 in stage 3.0 failed 4 times, most recent failure: Lost task 0.3 "
            f"in stage 3.0 (TID 12) (10.1.2.3 executor 2): {cause}\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages("
            "DAGScheduler.scala:2935)\n\tat scala.collection.immutable.List.foreach(List.scala"
            ":334)\nDriver stacktrace:\n\tat org.apache.spark.rdd.RDD.collect(RDD.scala:1049)\n")
    return Py4JJavaError(text)


def classify(e: Exception) -> Exception:
    return classify_spark_error(e, SETTINGS, RANGES)


def exit_code(e: BaseException) -> int:
    return getattr(e, "exit_code", EXIT_INTERNAL)


@pytest.mark.parametrize("kind, cls, code", [
    (Kind.TRANSIENT, TransientError, EXIT_TRANSIENT),
    (Kind.PERMANENT, DataError, EXIT_DATA),
    (Kind.CONFIG, ConfigError, EXIT_CONFIG)])
def test_a_range_read_error_keeps_its_kind_and_message(kind, cls, code):
    r = RANGES[0]
    message = f"{r}: a failure of this kind; nothing committed - do what this says"
    error = RangeReadError(kind, message, r)
    got = classify(job_failed("", f"pipeline.executor.consume.RangeReadError: {error}"))
    assert type(got) is cls and exit_code(got) == code and got.message == message


def test_a_range_read_error_wins_over_the_words_its_message_quotes():
    error = RangeReadError(Kind.PERMANENT, "orders[0] [100, 200): the partition now ends at "
                           "offset 150 (TimeoutException seen before)", RANGES[0])
    got = classify(job_failed("", f"pipeline.executor.consume.RangeReadError: {error}"))
    assert type(got) is DataError and "ends at offset 150" in got.message


def test_executors_without_the_jobs_python_are_told_to_ship_the_environment():
    got = classify(job_failed(
        'java.io.IOException: Cannot run program "/opt/venv/bin/python3": error=2, No such '
        "file or directory\n\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder."
        "java:1170)"))
    assert type(got) is ConfigError and exit_code(got) == EXIT_CONFIG
    assert "cannot run the job's Python '/opt/venv/bin/python3'" in got.message
    assert got.message.endswith(SHIP_ENVIRONMENT) and "scripts/package" in got.message


def test_executors_without_a_module_are_told_to_ship_the_environment():
    got = classify(job_failed("", "  File \"<frozen importlib._bootstrap>\", line 1324, in "
                                  "_find_and_load\nModuleNotFoundError: No module named "
                                  "'psycopg'"))
    assert type(got) is ConfigError and exit_code(got) == EXIT_CONFIG
    assert "lack the Python module 'psycopg'" in got.message
    assert got.message.endswith(SHIP_ENVIRONMENT)


def test_a_killed_python_worker_names_the_ranges_and_the_memory_settings():
    got = classify(job_failed("org.apache.spark.SparkException: Python worker exited "
                              "unexpectedly (crashed)\n\tat org.apache.spark.api.python."
                              "BasePythonRunner$ReaderIterator$$anonfun$1.applyOrElse"
                              "(PythonRunner.scala:621)\nCaused by: java.io.EOFException"))
    assert type(got) is PipelineError and exit_code(got) == EXIT_INTERNAL
    assert "died while the run read orders[0] [100, 200), orders[1] [50, 80)" in got.message
    assert "killed, e.g. by the kernel's OOM killer" in got.message
    assert "spark.executor.memory" in got.message and "max_records_per_partition" in got.message


def test_a_fatal_python_error_is_named_when_the_worker_crashed():
    got = classify(job_failed("org.apache.spark.SparkException: Python worker exited "
                              "unexpectedly (crashed): Fatal Python error: Segmentation fault"
                              "\n\nCurrent thread 0x00007f (most recent call first):\n  File "
                              "\"/opt/job/pipeline/formats/encode.py\", line 88 in encode"))
    assert type(got) is PipelineError
    assert "crashed: Fatal Python error: Segmentation fault" in got.message


def test_unreachable_postgres_is_transient_and_its_password_is_not_shown():
    got = classify(job_failed("", "psycopg.OperationalError: connection failed: connection "
                                  "to server at \"10.0.0.9\", port 5432 failed: Connection "
                                  "refused\n\tIs the server running on that host?"))
    assert type(got) is TransientError and exit_code(got) == EXIT_TRANSIENT
    assert "Postgres unreachable at postgresql://job:***@db.internal:5432/warehouse" \
        in got.message
    assert "s3cret" not in got.message and "check the server, then retry" in got.message


def test_another_unreachable_service_is_transient():
    got = classify(job_failed("java.net.ConnectException: Connection refused"))
    assert type(got) is TransientError and exit_code(got) == EXIT_TRANSIENT
    assert "check Kafka at kafka-1:9092 and Postgres, then retry" in got.message


def test_an_unknown_failure_stays_itself_an_internal_error():
    e = job_failed("java.lang.IllegalStateException: something new")
    got = classify(e)
    assert got is e and exit_code(got) == EXIT_INTERNAL


def test_a_pipeline_error_passes_unchanged():
    e = ConfigError("already classified")
    assert classify(e) is e


TRANSFORM_SETTINGS = parse_settings({
    "pipeline": {"name": "orders"},
    "kafka": {"bootstrap_servers": "kafka-1:9092", "topics": ["orders"]},
    "database": {"url": "postgresql://job@db.internal:5432/warehouse"},
    "sink": {"format": "raw", "table": "orders_raw", "transform": "mine:transform"},
}, source="<test>", environ={})


@pytest.mark.parametrize("cause", [
    # Arrow Java's allocator, the JVM's side of a batch to or from a Python worker
    "org.apache.arrow.memory.OutOfMemoryException: Failure allocating buffer.\n\tat org."
    "apache.arrow.memory.netty.NettyAllocationManager.<init>(NettyAllocationManager.java:74)"
    "\nCaused by: io.netty.util.internal.OutOfDirectMemoryError: failed to allocate "
    "1073741824 byte(s) of direct memory (used: 634395848, max: 1037959168)",
    "java.lang.OutOfMemoryError: Java heap space",
])
def test_a_task_out_of_memory_names_the_settings_to_change_not_an_internal_error(cause):
    got = classify_spark_error(job_failed(cause), TRANSFORM_SETTINGS, RANGES)
    assert type(got) is ConfigError and exit_code(got) == EXIT_CONFIG
    assert "ran out of memory while the run read orders[0] [100, 200)" in got.message
    assert "spark.sql.execution.arrow.maxBytesPerBatch" in got.message
    assert "spark.executor.memory" in got.message and "\n" not in got.message


def test_a_python_workers_memory_error_names_the_settings_to_change():
    got = classify(job_failed("", "  File \"/opt/job/pipeline/executor/transform/feed.py\", "
                                  "line 99, in _read_task\nMemoryError"))
    assert type(got) is ConfigError and exit_code(got) == EXIT_CONFIG
    assert "ran out of memory" in got.message and "MemoryError" in got.message
    assert "spark.executor.memory" in got.message
    assert "maxBytesPerBatch" not in got.message  # no transform: no Arrow batches


@pytest.mark.parametrize("error", [
    "py4j.protocol.Py4JNetworkError('Answer from Java side is empty')",
    "py4j.protocol.Py4JNetworkError('Error while sending or receiving')",
    "ConnectionRefusedError(111, 'Connection refused')",
])
def test_a_driver_jvm_that_died_is_transient_names_the_ranges_and_the_memory_setting(error):
    import py4j.protocol  # noqa: F401 - eval'd below

    e = classify_spark_error(eval(error), SETTINGS, RANGES)

    assert type(e) is TransientError and e.exit_code == EXIT_TRANSIENT
    assert str(e).startswith("the driver's JVM died while the run read orders[0] [100, 200)")
    assert "spark.driver.memory" in str(e) and "nothing committed" in str(e)
