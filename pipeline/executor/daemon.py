"""Spark's Python daemon for this job's workers (``spark.python.daemon.module``, set in
spark/session.py): import what every worker imports, once, then run pyspark's own daemon.

Spark forks each Python worker from its daemon, so a module the daemon has imported is in
every worker already, its pages shared until written: each worker no longer spends
~0.1-0.25 CPU-s importing pyarrow, confluent-kafka (its schema registry client alone
0.10-0.13 s), psycopg and our formats (measured: docs/benchmarks.md). But every page the
daemon holds at a fork counts again in each worker's RSS, and the first read task waits
for its imports, so it holds no more than the workers need: no pyarrow for a built-in
sink's run, no registry client for a run without one, no directory of spark-core's
jar, and pyspark compiled once (its installed .pyc) rather than from pyspark.zip.

Every step here is optional: a module missing from an environment (fastavro, the
registry client's httpx, an older pyarrow) leaves it to the worker that needs it, and a
step that fails (they touch CPython's zipimport caches and Spark's zips) leaves the daemon
as pyspark's own would be; pyspark's daemon itself is run as ``python -m pyspark.daemon``
runs it. pipeline.faults is NOT imported here: it reads PIPELINE_FAULT at import, which a
worker must do itself.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

# What the read/decode/COPY tasks import (executor/, formats/; a transform's read and write
# tasks: executor/transform/) and their dependencies. Module paths: a unit test holds each
# to a module that exists (a rename must not drop one silently).
PREIMPORTS = (
    "confluent_kafka",
    "psycopg",
    "orjson",
    "pipeline.executor.consume",
    "pipeline.executor.stage",
    "pipeline.executor.task",
    "pipeline.formats.encode",
    "pipeline.formats.registry",
)
# What only a transform's tasks import (its Arrow feed and writers): pyarrow alone is
# ~0.2 CPU-s, paid before the daemon forks its first worker, which the first read task
# waits for; a built-in run's workers never import it.
ARROW_PREIMPORTS = (
    "pyarrow",
    "pyarrow.compute",
    "pipeline.executor.transform.feed",
    "pipeline.executor.transform.writer",
    "pipeline.executor.transform.arrow_copy",
    "pipeline.executor.transform.arrow_binary",
    "pipeline.executor.transform.typed_rows",
    "pipeline.executor.transform.arrow_rows",
    "pipeline.executor.transform.arrow_columns",
)
# Set by the driver like REGISTRY_ENV: "0" when the run's workers read no Arrow (a built-in
# sink's run); unset (a session of someone else's making) or anything else: preimported.
ARROW_ENV = "PIPELINE_WORKERS_ARROW"


# Only a run with a [schema_registry] (avro, protobuf) reads writer schemas by id: its
# client (httpx, authlib, attrs, fastavro) is ~9 MB of the daemon's heap, and every page
# the daemon holds at a fork counts again in each worker's RSS (four workers in a 2-core
# transform run), so a run without a registry leaves it out (docs/benchmarks.md).
REGISTRY_PREIMPORTS = ("confluent_kafka.schema_registry",)
# Set by the driver before its JVM starts (spark/session.py), which passes its environment
# to the daemon: "1" when the run's records are read with a schema registry.
REGISTRY_ENV = "PIPELINE_WORKERS_SCHEMA_REGISTRY"


def preimports(env=os.environ) -> tuple[str, ...]:
    """What the daemon imports for this run: PREIMPORTS, pyarrow and the transform's
    modules unless the driver said the workers read no Arrow, and the registry client when
    it said the workers will need it."""
    return (PREIMPORTS + (ARROW_PREIMPORTS if env.get(ARROW_ENV) != "0" else ())
            + (REGISTRY_PREIMPORTS if env.get(REGISTRY_ENV) == "1" else ()))


def preimport(names: tuple[str, ...] | None = None) -> list[str]:
    """Import ``names`` (preimports() unless given), skipping any that fail; the ones
    imported."""
    done = []
    if names is None:
        names = preimports()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - optional: the worker imports it, or fails, itself
            continue
        done.append(name)
    return done


def drop_jars(path: list[str] | None = None, cache: dict | None = None) -> list[str]:
    """Take Java archives off this process's import path; the ones taken. Spark puts
    spark-core's jar on its workers' path (PythonUtils.sparkPythonPath); it holds no Python
    (pyspark.zip, first on the path, has all of pyspark), yet every import that misses
    pyspark.zip made a zipimporter read its directory: 5,261 entries, ~3 MB of the daemon's
    heap, copied into each forked worker (docs/benchmarks.md). The finder and the directory
    zipimport cached for it are dropped too (a private cache: if it is not there, or not a
    dict, only the path and the finders)."""
    path = sys.path if path is None else path
    cache = sys.path_importer_cache if cache is None else cache
    return _forget([p for p in path if p.endswith(".jar")], path, cache)


def _forget(entries: list[str], path: list[str], cache: dict) -> list[str]:
    """Take ``entries`` off the import ``path``, with their finders (``cache``) and the
    directories zipimport cached for them; ``entries``."""
    import zipimport

    path[:] = [p for p in path if p not in entries]
    directories = getattr(zipimport, "_zip_directory_cache", None)
    for entry in entries:
        cache.pop(entry, None)
        if isinstance(directories, dict):
            directories.pop(entry, None)
    return entries


# The packages Spark hands its workers as zips of their sources (pyspark.zip, py4j's zip).
ZIPPED = ("pyspark", "py4j")


def same_content(archive: str, name: str, installed: str) -> bool:
    """Every file of package ``name`` in zip ``archive`` is in the ``installed`` package
    folder with the same bytes (its size and CRC-32 against the zip's directory), except
    test packages (``tests`` folders: pip's wheels leave them out). A version string says
    nothing about a vendor's patched copy; the bytes do."""
    import zipfile
    import zlib

    prefix = f"{name}/"
    with zipfile.ZipFile(archive) as z:
        entries = [i for i in z.infolist()
                   if i.filename.startswith(prefix) and not i.is_dir()]
    if not any(i.filename == f"{prefix}__init__.py" for i in entries):
        return False
    for info in entries:
        relative = info.filename[len(prefix):]
        path = os.path.join(installed, *relative.split("/"))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if "tests" in relative.split("/")[:-1]:
                continue
            return False
        if len(data) != info.file_size or zlib.crc32(data) != info.CRC:
            return False
    return True


def prefer_installed(path: list[str] | None = None, cache: dict | None = None,
                     modules: dict | None = None) -> list[str]:
    """Take Spark's zips of pyspark and py4j off this process's import path when the very
    same files are installed further along it (this interpreter's site-packages, as pip
    installs pyspark: same_content); the zips taken. A zip holds sources only: imported
    from it, pyspark's worker is compiled in the daemon at every start, which left 11.5 MB
    more of its heap (56.7 against 45.3 MB anonymous, standalone) than the installed .pyc
    files, and each forked worker counts those pages again (docs/benchmarks.md). Any
    difference (another Spark's or a patched pyspark, none installed, pyspark imported
    already, anything unreadable): the zips stay, as Spark set them. Never raises."""
    from importlib.machinery import PathFinder

    path = sys.path if path is None else path
    cache = sys.path_importer_cache if cache is None else cache
    if any(name in (sys.modules if modules is None else modules) for name in ZIPPED):
        return []
    taken = []
    for entry in [p for p in path if p.endswith(".zip")]:
        rest = [p for p in path if p != entry]
        for name in ZIPPED:
            try:
                spec = PathFinder.find_spec(name, rest)
                if (spec is None or not spec.origin
                        or os.path.basename(spec.origin) != "__init__.py"):
                    continue
                if same_content(entry, name, os.path.dirname(spec.origin)):
                    taken.append(entry)
                    break
            except Exception:  # noqa: BLE001 - unreadable or unexpected: the zip stays
                continue
    return _forget(taken, path, cache)


def run_pyspark_daemon() -> None:
    """pyspark's own daemon, exactly as ``python -m pyspark.daemon`` runs it (its
    ``__main__`` block, which reads sys.argv[1], the worker module): no private name of
    the module is called."""
    import runpy

    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


def main() -> None:
    # Each step only saves memory or time, and may lean on how CPython or pyspark work
    # inside: one that fails leaves the daemon as pyspark's own would be. (Nothing is
    # printed: Spark reads this process's stdout.)
    for step in (drop_jars, prefer_installed, preimport):
        try:
            step()
        except Exception:  # noqa: BLE001, S112 - the plain path
            continue
    # Move what is imported out of the collector's generations: a worker's collections then
    # never touch (and so copy) those shared pages.
    gc.freeze()
    run_pyspark_daemon()


if __name__ == "__main__":
    main()
