"""Log records as text or JSON lines, and the driver's stderr under spark-submit (real
file descriptors and processes: pipes, files, sockets)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from pipeline import logs
from pipeline.errors import ConfigError
from tests.helpers import ROOT


@pytest.fixture
def logger():
    """A logger of our own namespace, restored afterwards (setup() configures the root)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield logging.getLogger("pipeline.test_logs")
    root.handlers[:] = handlers
    root.setLevel(level)
    logs.bind(pipeline=None, run_id=None)


def test_json_lines_carry_time_level_logger_the_bound_run_and_the_records_fields(logger):
    out = io.StringIO()
    logs.setup("json", stream=out)
    logs.bind(pipeline="demo", run_id=42)

    logger.info("plan: %s", "t[0] [0, 5)", extra={"event": "plan", "topic": "t",
                                                  "partition": 0, "from": 0, "until": 5})
    logger.warning("no event of its own")

    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first.pop("time"))
    assert first == {"level": "INFO", "logger": "pipeline.test_logs", "pipeline": "demo",
                     "run_id": 42, "event": "plan", "message": "plan: t[0] [0, 5)",
                     "topic": "t", "partition": 0, "from": 0, "until": 5}
    assert second["event"] == "log" and second["level"] == "WARNING"
    assert second["run_id"] == 42


def test_a_json_line_holds_the_traceback_and_values_json_cannot_encode(logger):
    out = io.StringIO()
    logs.setup("json", stream=out)
    try:
        raise ValueError("boom")
    except ValueError:
        logger.error("failed", exc_info=True, extra={"event": "x", "when": object})

    [line] = out.getvalue().splitlines()  # one line, the traceback inside it
    doc = json.loads(line)
    assert "ValueError: boom" in doc["exception"] and doc["when"] == str(object)


def test_text_reads_as_before_and_unbinding_removes_the_run(logger):
    out = io.StringIO()
    logs.setup("text", stream=out)
    logs.bind(pipeline="demo", run_id=7)
    logs.bind(run_id=None)

    logger.info("run %s: nothing new to read", 7, extra={"event": "run.noop"})
    logger.debug("not at INFO")

    [line] = out.getvalue().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO pipeline\.test_logs: "
                        r"run 7: nothing new to read", line)
    record = logging.LogRecord("x", logging.INFO, "", 0, "m", (), None)
    logs._Context().filter(record)
    assert record.pipeline == "demo" and not hasattr(record, "run_id")


def test_setup_again_replaces_its_handler_instead_of_adding_one(logger):
    first, second = io.StringIO(), io.StringIO()
    logs.setup("text", stream=first)
    logs.setup("json", stream=second)

    logger.info("once")

    assert first.getvalue() == "" and json.loads(second.getvalue())["message"] == "once"


def test_the_format_comes_from_the_option_else_the_environment_else_text():
    assert logs.resolve_format(None, {}) == "text"
    assert logs.resolve_format(None, {"PIPELINE_LOG_FORMAT": "json"}) == "json"
    assert logs.resolve_format("text", {"PIPELINE_LOG_FORMAT": "json"}) == "text"
    with pytest.raises(ConfigError, match="PIPELINE_LOG_FORMAT = 'xml': must be one of text, json"):
        logs.resolve_format(None, {"PIPELINE_LOG_FORMAT": "xml"})


# ---- spark-submit's stderr -----------------------------------------------------------------

def test_which_stderr_of_spark_submit_can_be_shared(tmp_path):
    me = os.getpid()
    read_end, write_end = os.pipe()
    plain = os.open(tmp_path / "plain", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    appending = os.open(tmp_path / "appending", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    same_file = os.open(tmp_path / "plain", os.O_WRONLY)
    sock_a, sock_b = socket.socketpair()
    try:
        assert logs.shareable_stream(me, write_end) == ("open", f"/proc/{me}/fd/{write_end}")
        assert logs.shareable_stream(me, appending)[0] == "open"
        how, why = logs.shareable_stream(me, plain)
        assert how == "no" and "without append" in why
        assert logs.shareable_stream(me, plain, out_fd=same_file)[0] == "merged"
        assert logs.shareable_stream(me, sock_a.fileno())[0] == "no"
        assert logs.shareable_stream(2 ** 22 + 1)[0] == "no"  # no such process
    finally:
        for fd in (read_end, write_end, plain, appending, same_file):
            os.close(fd)
        sock_a.close()
        sock_b.close()


DRIVER = textwrap.dedent("""
    import sys
    from pipeline.logs import route_stderr_past_spark_submit
    print(route_stderr_past_spark_submit(int(sys.argv[1])), flush=True)
    print("a log line", file=sys.stderr, flush=True)
    print('{"the": "document"}')
""")


def run_driver_beside(parent_stderr) -> tuple[str, subprocess.Popen]:
    """A stand-in for spark-submit (a process whose stderr is ``parent_stderr``) and a
    driver whose stderr is merged into its stdout, as Spark's PythonRunner starts it."""
    parent = subprocess.Popen(["sleep", "60"], stderr=parent_stderr)
    try:
        driver = subprocess.run([sys.executable, "-c", DRIVER, str(parent.pid)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    finally:
        parent.kill()
        parent.wait()
    assert driver.returncode == 0, driver.stdout
    return driver.stdout, parent


def test_the_drivers_stderr_goes_to_spark_submits_stderr_not_into_its_stdout():
    read_end, write_end = os.pipe()
    try:
        merged, _ = run_driver_beside(write_end)
        os.close(write_end)
        with os.fdopen(read_end) as parent_stderr:
            assert parent_stderr.read() == "a log line\n"
    finally:
        for fd in (read_end, write_end):
            try:
                os.close(fd)
            except OSError:
                pass
    where, document = merged.splitlines()
    assert where.startswith("/proc/") and json.loads(document) == {"the": "document"}


def test_a_stderr_that_cannot_be_shared_sends_the_logs_to_a_file_named_in_a_notice(tmp_path):
    with open(tmp_path / "err", "w") as truncating:  # "2> err": written at the JVM's offset
        merged, _ = run_driver_beside(truncating)

    notice, where, document = merged.splitlines()
    assert notice == (f"pipeline: logs and errors of this driver go to {where}: spark-submit's "
                      "stderr cannot be shared (it is a file opened without append (2> file; "
                      "write 2>> file))")
    try:
        with open(where) as log_file:
            assert log_file.read() == "a log line\n"
    finally:
        os.unlink(where)
    assert json.loads(document) == {"the": "document"}
    assert (tmp_path / "err").read_text() == ""


def test_logs_follow_stderr_when_it_is_replaced_after_setup(monkeypatch):
    """The CLI run in-process, then stderr swapped (pytest's capture, an embedding
    scheduler): our handler must not keep writing to the closed stream it started with."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.setup("text")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("pipeline.test").info("after the swap")
    lines = second.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("after the swap"), lines
