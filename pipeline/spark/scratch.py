"""Where the driver's Spark keeps its scratch on this machine, and what killed runs left.

Spark removes its temporary directories (``blockmgr-*``, ``spark-*``, ``faulthandler-*``)
and the native libraries it unpacks (``liblz4-java-*.so``) when its JVM exits normally; a
run that is SIGKILLed (a scheduler's timeout, the OOM killer, ``kill -9``) leaves them in
/tmp for ever: four entries and a few hundred KB a run, more with shuffle files. So the
driver JVM a run starts keeps them in a directory of the run's own,
``$TMPDIR/kafka-offset-pipeline-spark-<uid>/<host>-<pid>-<start>`` (java.io.tmpdir, and
spark.local.dir where the master is local), and each start of Spark first removes the
directories of runs whose process is gone: a killed run's, and a finished run's (empty by
then: Spark emptied it). Nothing waits for that at exit, while the JVM removes its files.

A run is gone when no process has its pid, or one has with another start time (the pid
reused), and no JVM started with its directory is left; the host in the name keeps a /tmp
shared between containers from judging another's processes by its own. Anything that is
not a directory of ours is left alone, and so are the settings a user made
(spark.local.dir, SPARK_LOCAL_DIRS, or java.io.tmpdir in spark.driver.extraJavaOptions:
theirs comes later and wins). Under spark-submit the JVM is up before us: its scratch is
spark-submit's to place.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from pipeline.processes import process_alive

log = logging.getLogger(__name__)

ROOT_PREFIX = "kafka-offset-pipeline-spark-"
# Spark splits spark.driver.extraJavaOptions at blanks (honouring quotes) and
# spark.local.dir at commas: a path holding one is not handed to it.
_UNSAFE = re.compile(r"[\s,'\"\\]")
_TMPDIR_OPTION = b"-Djava.io.tmpdir="


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks after boot, from /proc), "0" where
    there is no /proc but the process exists, None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except (OSError, IndexError):
        return None
    # No /proc (macOS): whether the pid exists, not which process has it.
    return "0" if process_alive(pid) else None


def root(tmp: str | None = None) -> Path | None:
    """This user's directory of run scratch under ``tmp`` (tempfile's: TMPDIR, else /tmp),
    made if missing; None where it cannot be had safely (another user's, a symlink, a path
    Spark would split, no permission)."""
    base = Path(tmp or tempfile.gettempdir())
    path = base / f"{ROOT_PREFIX}{os.getuid()}"
    if _UNSAFE.search(str(path)):
        return None
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    return path


def _name(host: str, pid: int, start: str) -> str:
    return f"{host}-{pid}-{start}"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def in_use() -> set[str]:
    """The directories a live JVM was started with as its java.io.tmpdir (from /proc): a
    run's JVM goes on removing its files for a moment after the run's own process exited,
    which a sweep must not race (Spark would log an error deleting them)."""
    used = set()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return used
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        used.update(os.path.realpath(a[len(_TMPDIR_OPTION):].decode(errors="replace"))
                    for a in args if a.startswith(_TMPDIR_OPTION))
    return used


def sweep(directory: Path, host: str | None = None) -> list[str]:
    """Remove the run directories in ``directory`` whose process (on this host) is gone,
    and no JVM still uses (in_use); the names of those that held anything. A finished
    run's is empty (Spark emptied it): rmdir takes it, /proc is only read for the rest."""
    host = host or _host()
    left, used = [], None
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return left
    for entry in entries:
        owner, _, start = entry.name.rpartition("-")  # <host>-<pid>-<start>
        owner, _, pid = owner.rpartition("-")
        if owner != host or not pid.isdigit() or not start.isdigit():
            continue
        if not entry.is_dir(follow_symlinks=False) or process_start(int(pid)) == start:
            continue  # not ours, or its run is still going
        try:
            os.rmdir(entry.path)  # empty: a finished run's
            continue
        except FileNotFoundError:
            continue  # another run's sweep was first
        except OSError:
            pass  # it holds something
        used = in_use() if used is None else used
        if os.path.realpath(entry.path) in used:  # however TMPDIR was spelled
            continue  # its run is gone, its JVM not yet
        shutil.rmtree(entry.path, ignore_errors=True)
        left.append(entry.name)
    return left


def run_scratch(tmp: str | None = None) -> Path | None:
    """This process's scratch directory (made now), after removing those of runs that are
    gone; None where there is no safe place (Spark then keeps its defaults)."""
    directory = root(tmp)
    if directory is None:
        return None
    left = sweep(directory)
    if left:
        log.info("removed the Spark scratch %d killed run(s) left in %s: %s", len(left),
                 directory, ", ".join(sorted(left)[:5]),
                 extra={"event": "spark.scratch_removed", "runs": left})
    pid = os.getpid()
    mine = directory / _name(_host(), pid, process_start(pid) or "0")
    try:
        mine.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return mine


def spark_settings(conf: dict[str, str], java_options: str, scratch: Path | None,
                   local: bool = True) -> tuple[dict[str, str], str]:
    """(Spark settings to add where unset, the driver JVM's options) that put the driver's
    scratch in ``scratch``: java.io.tmpdir before the JVM options (a user's own
    -Djava.io.tmpdir after it wins), and on one machine (``local``: the driver is the
    executor) spark.local.dir unless [spark.conf] sets one (SPARK_LOCAL_DIRS wins over it
    in Spark itself); a cluster's executors keep their workers' directories. Pure."""
    if scratch is None:
        return {}, java_options
    mine = local and "spark.local.dir" not in conf
    defaults = {"spark.local.dir": str(scratch)} if mine else {}
    return defaults, f"{_TMPDIR_OPTION.decode()}{scratch} {java_options}".strip()
