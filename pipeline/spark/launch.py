"""Starting Spark for a run: the SparkContext its sinks need, or a configuration error
that names what the user set when Spark will not start."""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os

from pipeline.config import Settings
from pipeline.errors import ConfigError, PipelineError, SparkStartError

log = logging.getLogger(__name__)


def start_spark(settings: Settings, records: int = 0):
    """The SparkContext; Spark SQL's session is only built when a transform needs it.
    ``records``: how many the run plans to read (not used: the JVM's flags depend on the
    kind of run only, session.JVM_FLAGS)."""
    from pipeline.spark.driver_jvm import import_while_starting, release_at_exit
    from pipeline.spark.session import JVM_FLAGS, get_context, spark_active, submitted

    try:
        transform = bool(settings.sink.transform)
        if transform:
            missing = [m for m in ("pyarrow", "pandas") if importlib.util.find_spec(m) is None]
            if missing:
                raise ConfigError(
                    f"[sink] transform {settings.sink.transform!r} needs {' and '.join(missing)}"
                    ", which the built-in sinks do not: pip install "
                    "'kafka-offset-pipeline[transform]'; nothing was read")
        # No run reads through Spark's Kafka source (a transform's input is the built-in
        # read, executor/transform/feed.py): no connector jars.
        jvm = "transform" if transform else "light"
        archive = driver_archive(settings, transform, jvm)
        conf = settings.spark.conf
        if transform and not submitted() and not spark_active():
            import_while_starting()  # what its mapInArrow imports, while the JVM starts
        if archive is not None and archive.dump is None:  # map the one an earlier run made
            conf = {**conf, "spark.driver.extraJavaOptions":
                    f"{JVM_FLAGS[jvm]} {archive.options}"}
        sc = get_context(settings.spark.master, conf, jvm=jvm,
                         schema_registry=settings.schema_registry is not None,
                         arrow=transform)
        if archive is not None and archive.dump is not None and sc is not None:
            # None yet: this run goes without, and a detached process writes one after it
            # exits (spark/class_archive.py): neither the run nor its exit waits for it.
            from pipeline.spark.class_archive import spawn_dump

            log.info("the driver JVM's class archive is written in the background after this "
                     "run (once per JDK and Spark install; later runs start faster): %s",
                     archive.directory,
                     extra={"event": "spark.class_archive", "path": str(archive.directory)})
            master = os.environ.get("PIPELINE_SPARK_MASTER", settings.spark.master)
            atexit.register(spawn_dump, archive, master, conf, jvm, transform)
        release_at_exit(sc)  # registered last: runs first at exit
        return sc
    except PipelineError:
        raise
    except Exception as e:  # noqa: BLE001 - a JVM that will not start is sorted here
        raise spark_start_error(e, settings) from None


def driver_archive(settings: Settings, sql: bool, jvm: str = "light"):
    """The class-data-sharing archive for the driver JVM this run is about to start
    (spark/class_archive.py), or None: turned off ([spark] class_archive = false), a JVM
    up already (spark-submit's, or an earlier run's in this process), a cluster master
    (only measured on one machine), or JVM options the user set. ``jvm``: the flags the
    JVM starts with (session.JVM_FLAGS), part of the archive's key. Never fails a run."""
    from pipeline.spark.session import JVM_FLAGS, spark_active, submitted

    master = os.environ.get("PIPELINE_SPARK_MASTER", settings.spark.master)
    conf = settings.spark.conf
    if (not settings.spark.class_archive or submitted() or spark_active()
            or not master.startswith("local") or "spark.driver.extraJavaOptions" in conf):
        return None
    from pipeline.spark.class_archive import plan

    extra = ":".join(filter(None, (conf.get("spark.driver.extraClassPath", ""),
                                   os.environ.get("SPARK_DIST_CLASSPATH", ""))))
    try:
        return plan(dict(os.environ), JVM_FLAGS[jvm], sql, extra)
    except Exception:  # noqa: BLE001 - without an archive the JVM only starts slower
        log.debug("no class-data-sharing archive for the driver JVM", exc_info=True)
        return None


def spark_start_error(e: Exception, settings: Settings) -> SparkStartError:
    """Spark refusing to start is a configuration problem (a bad [spark.conf] value, an
    unknown master, no Java): exit 2 naming what the user set, not an internal error. When
    the JVM itself exits, its own message is on stderr just above ours."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()),
                 type(e).__name__)
    keys = sorted(settings.spark.conf)
    where = f"master {settings.spark.master!r}" + (
        f" and [spark.conf] {', '.join(keys)}" if keys else "")
    return SparkStartError(f"Spark did not start with {where}: {first[:300]} (the JVM's own "
                       "error, if any, is printed above); fix the value or JAVA_HOME, then "
                       "rerun; nothing was read")
