"""Where the job's log records go and how they read: text for people (the default), or one
JSON object per line for log shippers, always on stderr, so stdout holds only the output a
command was asked for (a table, or the ``--json`` document).

The job passes its facts as fields (``extra={"event": "plan", ...}``): in JSON they are
keys of the line; in text the message says the same in words. ``bind`` adds the pipeline
and the run ID to every record of the run, whichever module logs it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import tempfile
import time
from typing import Any, TextIO

from pipeline.config import mask
from pipeline.errors import ConfigError

FORMATS = ("text", "json")
ENV_LOG_FORMAT = "PIPELINE_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# What every record of this process's run carries (one run per process; a module-level
# dict rather than a contextvar because Spark's job thread logs too).
_context: dict[str, Any] = {}
# The attributes every LogRecord has: anything else on a record came from extra=.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def bind(**fields: Any) -> None:
    """Put ``fields`` on every following record (None removes a field)."""
    for key, value in fields.items():
        if value is None:
            _context.pop(key, None)
        else:
            _context[key] = value


def resolve_format(option: str | None, environ: dict[str, str] | None = None) -> str:
    """The command line's --log-format, else PIPELINE_LOG_FORMAT, else text."""
    env = os.environ if environ is None else environ
    if option:
        value, source = option, "--log-format"
    else:
        value, source = env.get(ENV_LOG_FORMAT) or "text", ENV_LOG_FORMAT
    if value not in FORMATS:
        raise ConfigError(f"{source} = {value!r}: must be one of {', '.join(FORMATS)}")
    return value


class _Context(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, pipeline, run_id,
    event, message, then the record's own fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "pipeline": getattr(record, "pipeline", None),
            "run_id": getattr(record, "run_id", None),
            # Records of libraries (and our plain ones) have no event of their own.
            "event": getattr(record, "event", "log"),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        # Fields (an error, a URL) may carry a secret the message filter never sees.
        return mask(json.dumps(doc, default=str, ensure_ascii=False))


_HANDLER_MARK = "_pipeline_handler"


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the one at setup:
    a program that runs the CLI in-process and swaps stderr afterwards (pytest's capture,
    an embedding scheduler) would otherwise leave us writing to a closed stream."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def setup(fmt: str = "text", verbose: bool = False, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) in ``fmt``; called once per command (again: replaces ours,
    keeps any other handler, e.g. a test runner's)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream) if stream is not None else _CurrentStderr()
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_Context())
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# ---- spark-submit's merged output -------------------------------------------------------
# spark-submit runs the Python driver with its stderr merged into its stdout (Spark's
# PythonRunner: redirectErrorStream) and copies both to its own stdout: logs, the error line
# and the --json document would all arrive there. The driver's parent is spark-submit's JVM,
# so the driver points its own stderr (fd 2: Python's, librdkafka's, a fatal error's) at the
# JVM's stderr, opened again through /proc.


def shareable_stream(pid: int, fd: int = 2, out_fd: int = 1) -> tuple[str, str]:
    """How to write to file descriptor ``fd`` of process ``pid``: ("open", path) when
    opening it again writes where that process writes (a terminal, a pipe, /dev/null, a
    file opened for appending); ("merged", why) when that file is also its ``out_fd``
    (``> out 2>&1``: the merged output lands there anyway); ("no", why) otherwise."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        st = os.stat(path)
    except OSError as e:
        return "no", f"{path} cannot be read ({e.strerror})"
    if stat.S_ISSOCK(st.st_mode):
        return "no", "it is a socket (e.g. the journal)"
    if stat.S_ISREG(st.st_mode):
        try:
            out = os.stat(f"/proc/{pid}/fd/{out_fd}")
        except OSError:
            out = None
        if out is not None and (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino):
            return "merged", "spark-submit's stdout and stderr are one file"
        # A file opened without O_APPEND ("2> file") is written at the JVM's own offset,
        # which would overwrite what we append: only share a file opened with ">>".
        if not _flags(pid, fd) & os.O_APPEND:
            return "no", "it is a file opened without append (2> file; write 2>> file)"
    return "open", path


def _flags(pid: int, fd: int) -> int:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as info:
            for line in info:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0


def route_stderr_past_spark_submit(pid: int | None = None) -> str:
    """Point fd 2 at spark-submit's (``pid``, default our parent) stderr; where that is
    impossible, at a log file named in a one-line notice on the merged output. Returns
    where the driver's stderr goes now."""
    pid = os.getppid() if pid is None else pid
    how, where = shareable_stream(pid)
    if how == "merged":
        return "merged"
    fd = None
    if how == "open":
        flags = os.O_WRONLY | os.O_NOCTTY | (_flags(pid, 2) & os.O_APPEND)
        try:
            fd = os.open(where, flags)
        except OSError as e:
            how, where = "no", f"{where} cannot be opened ({e.strerror})"
    if fd is None:
        log_file = os.path.join(tempfile.gettempdir(),
                                f"pipeline-driver-{time.strftime('%Y%m%dT%H%M%S')}-"
                                f"{os.getpid()}.log")
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        sys.stderr.write(f"pipeline: logs and errors of this driver go to {log_file}: "
                         f"spark-submit's stderr cannot be shared ({where})\n")
        where = log_file
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    return where
