"""The driver JVM's class-data-sharing archive (AppCDS: a dynamic archive, Java 17+): the
classes of Spark's driver mapped from a file that an earlier run wrote, instead of read
from jars, parsed, verified and linked anew by every run (docs/benchmarks.md, "Transform
path: a class-data-sharing archive for the driver JVM": 1.3-4.5 JVM CPU-s less a run).

The JVM accepts an archive only for the JVM build and the classpath that wrote it and
otherwise starts without it (silently, with QUIET). The file is keyed by both (and by
Spark's version, the JVM flags and whether the run uses Spark SQL), so an upgrade writes a
new archive instead of ignoring the old one forever. A run that finds none has its JVM
write one when it exits, to a name of its own; once that JVM has exited cleanly the run
renames it into place (a rename is atomic; one run at a time claims the dump). The JVM
crashes (SIGBUS) on a truncated archive, and its checksum check (VerifySharedSpaces) only
catches corruption of the right size: the final name carries the size the JVM wrote, and a
file of another size is never used."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
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
DUMP_WAIT_SECONDS = 300.0  # how long a run waits at exit for its JVM to write the archive
_NAME = re.compile(r"^(?P<key>[0-9a-f]{20})-(?P<size>[0-9]+)\.jsa$")


@dataclass(frozen=True)
class ArchivePlan:
    """The driver JVM's extra options; ``dump``: where its JVM writes a new archive at exit
    (then ``finish_dump`` renames it into ``directory``), else None."""
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
