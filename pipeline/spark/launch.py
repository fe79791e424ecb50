"""Starting Spark for a run: the SparkContext its sinks need, or a configuration error
that names what the user set when Spark will not start."""

from __future__ import annotations

import importlib.util

from pipeline.config import Settings
from pipeline.errors import ConfigError, PipelineError


def start_spark(settings: Settings, records: int = 0):
    """The SparkContext; Spark SQL's session is only built when a transform needs it.
    ``records``: how many the run plans to read (not used: every run starts the JVM with
    the same flags, session.JVM_FLAGS)."""
    from pipeline.spark.session import get_context

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
        # read, executor/feed.py): no connector jars.
        return get_context(settings.spark.master, settings.spark.conf, jvm="light")
    except PipelineError:
        raise
    except Exception as e:  # noqa: BLE001 - a JVM that will not start is sorted here
        raise spark_start_error(e, settings) from None


def spark_start_error(e: Exception, settings: Settings) -> ConfigError:
    """Spark refusing to start is a configuration problem (a bad [spark.conf] value, an
    unknown master, no Java): exit 2 naming what the user set, not an internal error. When
    the JVM itself exits, its own message is on stderr just above ours."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()),
                 type(e).__name__)
    keys = sorted(settings.spark.conf)
    where = f"master {settings.spark.master!r}" + (
        f" and [spark.conf] {', '.join(keys)}" if keys else "")
    return ConfigError(f"Spark did not start with {where}: {first[:300]} (the JVM's own "
                       "error, if any, is printed above); fix the value or JAVA_HOME, then "
                       "rerun; nothing was read")
