"""The driver JVM's class-data-sharing archive (AppCDS: a dynamic archive, Java 17+): the
classes of Spark's driver mapped from a file that an earlier run wrote, instead of read
from jars, parsed, verified and linked anew by every run (docs/benchmarks.md, "Transform
path: a class-data-sharing archive for the driver JVM": 1.3-4.5 JVM CPU-s less a run).

The JVM accepts an archive only for the JVM build and the classpath that wrote it and
otherwise starts without it (silently, with QUIET). The file is keyed by both (and by
Spark's version, the JVM flags and whether the run uses Spark SQL), so an upgrade writes a
new archive instead of ignoring the old one forever.

A run that finds none runs without one and, as it exits, starts a detached process
(``spawn_dump``) that waits for the run's process to be gone, then starts a driver JVM of
the same kind, runs a small job of the run's kind and lets it exit: that JVM writes the
archive, to a name of its own, and the process renames it into place once the JVM exited
cleanly (a rename is atomic; one run at a time claims the dump). Writing an archive costs
~20-25 CPU-s and up to minutes: never a run's, nor its exit's (a fresh machine or
container only pays it after its first run, in the background, at low priority). The JVM
crashes (SIGBUS) on a truncated archive, and its checksum check (VerifySharedSpaces) only
catches corruption of the right size: the final name carries the size the JVM wrote, and a
file of another size is never used."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Silence the JVM's CDS messages: a dump warns for each class it skips (signed jars,
# generated classes), and an archive it refuses would warn at every start.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
KEEP = 4  # archives kept in the cache directory (old keys: another JDK, Spark, classpath)
# A dump costs its run ~20-25 CPU-s (docs/benchmarks.md): one run per key claims it, and
# after a dump that failed or was not renamed in time the next try is this much later.
STALE_SECONDS = 3600
DUMP_WAIT_SECONDS = 300.0  # how long the dumping process waits for its JVM to write it
PARENT_WAIT_SECONDS = 600.0  # how long it waits for the run's process to exit first
DUMP_FAULT = "class_archive_dump"  # a pipeline/faults.py point: the dump process, before its JVM
_NAME = re.compile(r"^(?P<key>[0-9a-f]{20})-(?P<size>[0-9]+)\.jsa$")


@dataclass(frozen=True)
class ArchivePlan:
    """The driver JVM's extra options (mapping an archive), or, with ``dump`` set, where a
    dumping process's JVM writes a new archive at its exit (``spawn_dump``; then
    ``finish_dump`` renames it into ``directory``)."""
    options: str
    directory: Path
    key: str
    dump: Path | None = None


def cache_dir(environ: dict[str, str]) -> Path:
    """PIPELINE_CLASS_ARCHIVE_DIR, else the user's cache directory (XDG_CACHE_HOME or
    ~/.cache), never the installed package."""
    if environ.get("PIPELINE_CLASS_ARCHIVE_DIR"):
        return Path(environ["PIPELINE_CLASS_ARCHIVE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kafka-pg-pipeline" / "jvm-class-archives"


def java_home(environ: dict[str, str]) -> Path | None:
    """The JDK spark-submit starts (JAVA_HOME's java, else the one on PATH), resolved."""
    if environ.get("JAVA_HOME"):
        java = os.path.join(environ["JAVA_HOME"], "bin", "java")
    else:
        java = shutil.which("java", path=environ.get("PATH"))
    if not java or not os.path.exists(java):
        return None
    return Path(os.path.realpath(java)).parent.parent


def java_feature(release: str) -> int:
    """The feature version from a JDK's ``release`` file (JAVA_VERSION="17.0.15" -> 17,
    "1.8.0_402" -> 8); 0 when it does not say."""
    m = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', release, re.M)
    if not m:
        return 0
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def archive_key(parts: list[str]) -> str:
    """20 hex digits naming what an archive is valid for."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def stamp(path: Path) -> str:
    """A file as the JVM checks it on the classpath: its path, size and modification time."""
    try:
        st = path.stat()
    except OSError:
        return f"{path}:-"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def key_parts(jdk: Path, spark_home: Path, spark_version: str, flags: str, sql: bool,
              extra_classpath: str) -> list[str]:
    """What the JVM requires to be the same as when the archive was written: its build
    (release file, libjvm), the classpath (Spark's jars, any extra class path), plus the
    flags and the kind of run (the classes a SQL run loads are many more)."""
    release = jdk / "release"
    jars = sorted((spark_home / "jars").glob("*.jar"))
    return [release.read_text() if release.exists() else "", stamp(release),
            stamp(jdk / "lib" / "server" / "libjvm.so"), str(spark_home), spark_version,
            flags, "sql" if sql else "context", extra_classpath,
            *(stamp(j) for j in jars)]


def archive_name(key: str, size: int) -> str:
    return f"{key}-{size}.jsa"


def usable_archive(directory: Path, key: str) -> Path | None:
    """A complete archive for ``key``: its size is the one in its name."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return None
    for path in entries:
        m = _NAME.match(path.name)
        if m and m["key"] == key:
            try:
                if path.stat().st_size == int(m["size"]):
                    return path
            except OSError:
                continue
    return None


def jvm_options(use: Path | None, dump: Path | None) -> str:
    """The JVM options that map ``use``, or write ``dump`` at exit."""
    if use is not None:
        return f"-XX:SharedArchiveFile={use} -XX:+VerifySharedSpaces {QUIET}"
    return f"-XX:ArchiveClassesAtExit={dump} {QUIET}"


def plan(environ: dict[str, str], flags: str, sql: bool, extra_classpath: str = "",
         now: float | None = None) -> ArchivePlan | None:
    """The archive for a driver JVM about to start with ``flags``: the one to use, or where
    to write one; None where no archive applies (no JDK 17+ found, no writable cache)."""
    import pyspark

    jdk = java_home(environ)
    if jdk is None or not (jdk / "release").exists():
        return None
    if java_feature((jdk / "release").read_text()) < 17:
        return None
    from pyspark.find_spark_home import _find_spark_home

    spark_home = Path(_find_spark_home())  # what pyspark's launcher runs (SPARK_HOME wins)
    key = archive_key(key_parts(jdk, spark_home, pyspark.__version__, flags, sql,
                                extra_classpath))
    directory = cache_dir(environ)
    if re.search(r"[\s'\"\\]", str(directory)):
        return None  # Spark splits spark.driver.extraJavaOptions at blanks, honouring quotes
    found = usable_archive(directory, key)
    if found is not None:
        return ArchivePlan(jvm_options(found, None), directory, key)
    now = now if now is not None else time.time()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        prune(directory, now)
        if not claim(directory / f"{key}.dumping", now):
            return None  # another run is writing it, or a try failed within the hour
    except OSError:
        return None
    dump = directory / f"{key}.{os.getpid()}.tmp"
    return ArchivePlan(jvm_options(None, dump), directory, key, dump)


def claim(marker: Path, now: float) -> bool:
    """Whether this run writes the archive: it created ``marker``, or the marker is older
    than STALE_SECONDS (its run died, or its dump failed). A run whose dump succeeded
    removes it."""
    for _ in range(2):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            try:
                if now - marker.stat().st_mtime <= STALE_SECONDS:
                    return False
                marker.unlink()
            except FileNotFoundError:
                continue
    return False


def finish_dump(archive: ArchivePlan, proc, timeout: float = DUMP_WAIT_SECONDS) -> Path | None:
    """After the run: let the driver JVM exit (its stdin closed: pyspark's gateway exits on
    EOF), wait for it to write the archive, and rename it into place if it exited cleanly;
    else drop it. Never raises: the run is done."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        code = proc.wait(timeout=timeout)
        dump = archive.dump
        if code != 0 or dump is None or not dump.exists() or dump.stat().st_size == 0:
            if dump is not None:
                dump.unlink(missing_ok=True)
            return None
        final = archive.directory / archive_name(archive.key, dump.stat().st_size)
        os.replace(dump, final)
        (archive.directory / f"{archive.key}.dumping").unlink(missing_ok=True)
        return final
    except Exception:  # noqa: BLE001 - a missing archive only costs the next run time
        return None


def prune(directory: Path, now: float) -> None:
    """Drop temporary dumps of JVMs that died writing them (and their claims), and all but
    the KEEP newest
    archives (each is 60-150 MB; an upgrade leaves the old ones unused)."""
    archives = []
    for path in directory.iterdir():
        try:
            if (path.suffix in (".tmp", ".dumping")
                    and now - path.stat().st_mtime > STALE_SECONDS):
                path.unlink(missing_ok=True)
            elif _NAME.match(path.name):
                archives.append((path.stat().st_mtime, path))
        except OSError:
            continue
    for _, path in sorted(archives, reverse=True)[KEEP:]:
        path.unlink(missing_ok=True)


def spawn_dump(archive: ArchivePlan, master: str, conf: dict[str, str], jvm: str,
               sql: bool) -> subprocess.Popen | None:
    """Start the detached process that writes ``archive`` (``dump_main``) and return at
    once: nothing of it is tied to this process (its own session, no inherited pipes), so
    the caller's exit never waits for it. Never raises: without it the next run only
    starts without an archive."""
    spec = {"master": master, "conf": conf, "jvm": jvm, "sql": sql, "parent": os.getpid(),
            "directory": str(archive.directory), "key": archive.key, "dump": str(archive.dump)}
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.spark.class_archive", json.dumps(spec)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
    except Exception:  # noqa: BLE001 - a missing archive only costs the next run time
        return None


def _nothing(batches):
    return iter(())


def _rows(rows):
    return rows


def warm_up(sc, sql: bool) -> None:
    """A small job of a run's kind, so that the dumping JVM loads the classes such a run
    loads: Python tasks over an RDD (the built-in sinks), or a mapInArrow read, SQL over it
    (a filter, a broadcast join, an aggregate) and a second mapInArrow (a transform)."""
    if not sql:
        sc.parallelize(range(2), 2).mapPartitions(_rows).collect()
        return
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.getOrCreate()
    small = spark.sql("SELECT * FROM VALUES (0, 'a'), (1, 'b') AS t(id, name)")
    rows = (spark.range(0, 4, 1, 2).mapInArrow(_rows, "id long")
            .where(F.col("id") >= 0).join(F.broadcast(small), "id", "left")
            .withColumn("n", F.upper("name")))
    rows.groupBy("n").count().collect()
    rows.mapInArrow(_nothing, "id long").collect()


def dump_main(spec: dict) -> Path | None:
    """The dumping process: wait for the run that started it to exit, then a driver JVM of
    its kind with -XX:ArchiveClassesAtExit, a small job (``warm_up``), the JVM let go, and
    the archive renamed into place (``finish_dump``). On any failure the temporary file
    goes and the claim stays: the next try is STALE_SECONDS later."""
    archive = ArchivePlan(jvm_options(None, Path(spec["dump"])), Path(spec["directory"]),
                          spec["key"], Path(spec["dump"]))
    deadline = time.monotonic() + PARENT_WAIT_SECONDS
    while os.getppid() == spec["parent"] and time.monotonic() < deadline:
        time.sleep(0.1)  # the run is still exiting: its CPU and memory first
    try:
        from pipeline import faults
        from pipeline.spark.driver_jvm import release
        from pipeline.spark.session import JVM_FLAGS, get_context

        faults.inject(DUMP_FAULT)
        conf = {**spec["conf"], "spark.driver.extraJavaOptions":
                f"{JVM_FLAGS[spec['jvm']]} {archive.options}"}
        sc = get_context(spec["master"], conf, app_name="kafka-offset-pipeline-class-archive",
                         jvm=spec["jvm"])
        warm_up(sc, spec["sql"])
        gateway = sc._gateway
        proc = gateway.proc
        release(gateway, proc)
        return finish_dump(archive, proc)
    except Exception:  # noqa: BLE001 - a missing archive only costs the next run time
        if archive.dump is not None:
            archive.dump.unlink(missing_ok=True)
        return None


if __name__ == "__main__":
    try:
        os.nice(10)  # whatever runs next on this machine goes first
    except OSError:
        pass
    dump_main(json.loads(sys.argv[1]))
    # The JVM is gone; skip the interpreter's teardown (pyspark's threads may linger).
    os._exit(0)
