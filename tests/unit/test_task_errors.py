"""An executor's failure crosses to the driver as a type: encoded in one tagged line of the
task's traceback text, decoded back on the driver with every field."""

from __future__ import annotations

import pickle

from pipeline.errors import TAG, Kind, TaskError, Where, decode
from pipeline.executor.consume import RangeReadError
from pipeline.plan.offsets import OffsetRange


def in_spark_text(error: BaseException) -> str:
    """What the driver gets: the task's traceback (last line: type and str) inside the
    Py4J error, quoted again under 'Driver stacktrace'."""
    traceback = ("org.apache.spark.api.python.PythonException: Traceback (most recent call "
                 "last):\n  File \"/x/pipeline/executor/stage.py\", line 300, in stage_ranges\n"
                 f"{type(error).__module__}.{type(error).__name__}: {error}\n")
    return ("An error occurred while calling o42.collect.\n: org.apache.spark.SparkException: "
            "Job aborted due to stage failure: Task 1 in stage 0.0 failed 4 times, most recent "
            f"failure: Lost task 1.3 in stage 0.0 (TID 7) (10.0.0.5 executor 1): {traceback}"
            "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator."
            f"handlePythonException(PythonRunner.scala:572)\nDriver stacktrace:\n{traceback}")


def test_every_kind_and_field_survives_the_round_trip_through_spark_text():
    for kind in Kind:
        error = TaskError(kind, "t[3] [10, 20): a message; nothing committed - retry",
                          Where("t", 3, 10, 20))
        assert decode(in_spark_text(error)) == error


def test_the_encoding_is_one_tagged_line_whatever_the_message_holds():
    error = TaskError(Kind.CONFIG, 'refused: "user"\nsecond line\ttab \\ ü', Where("t"))
    line = error.encode()
    assert line.startswith(f"{TAG} ") and "\n" not in line and str(error) == line
    decoded = decode(f"noise\n{line}\nmore noise")
    assert decoded.kind is Kind.CONFIG and decoded.message == error.message
    assert decoded.where == Where("t", None, None, None)


def test_a_range_read_error_names_its_range_and_decodes_as_a_task_error():
    r = OffsetRange("orders", 2, 100, 200)
    error = RangeReadError(Kind.PERMANENT, f"{r}: the partition now ends at offset 150", r)
    decoded = decode(in_spark_text(error))
    assert decoded.kind is Kind.PERMANENT and decoded.message == error.message
    assert decoded.where == Where("orders", 2, 100, 200)


def test_text_without_a_task_error_or_with_a_broken_one_decodes_to_none():
    assert decode("java.lang.OutOfMemoryError: Java heap space") is None
    assert decode(f"{TAG} {{\"kind\": \"transient\", \"mess") is None  # cut short
    assert decode(f'{TAG} {{"kind": "sideways", "message": "m"}}') is None  # no such kind
    assert decode(f'{TAG} {{"message": "m"}}') is None


def test_task_errors_pickle_with_their_fields():
    r = OffsetRange("t", 0, 0, 5)
    for error in (TaskError(Kind.TRANSIENT, "m", Where("t", 0)),
                  RangeReadError(Kind.CONFIG, "refused", r)):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and copy == error and str(copy) == str(error)
