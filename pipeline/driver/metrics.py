"""A scheduled run's Prometheus metrics, exported once its outcome is final: to a file for
node_exporter's textfile collector and/or to a Pushgateway ([metrics] in the config).

A batch job is not scraped while it runs, so each run leaves its numbers behind: what it
read and wrote, how long each phase took, the lag it left, its exit code, and when the
pipeline last succeeded (the one to alert on). Everything is a gauge labelled by the
pipeline: it describes the last run, not a total. A metric a run could not measure (the
last success of a failed run; the lag of a run that failed before planning) keeps its
previous value: the Pushgateway push replaces only the metrics it sends (POST), and the
textfile carries the others over from the file it replaces.

Exporting never fails a run: the results are committed (or rolled back) before this runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, Gauge, pushadd_to_gateway, write_to_textfile
from prometheus_client.exposition import basic_auth_handler, default_handler
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pipeline.config import Settings

log = logging.getLogger(__name__)

JOB = "kafka_offset_pipeline"  # the Pushgateway's job label; grouped further by pipeline
PUSH_TIMEOUT_SECONDS = 10
STATUSES = ("succeeded", "noop", "failed")


@dataclass(frozen=True)
class RunOutcome:
    kind: str
    status: str  # succeeded | noop | failed
    exit_code: int
    run_id: int | None
    records_read: int = 0  # committed: 0 for a failed run
    rows_written: int = 0
    dead_letters: int = 0
    rows_deleted: int = 0  # by tombstones (upsert sinks)
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds, and total
    lag: dict[tuple[str, int], int] | None = None  # None: not measured
    finished_at: float = field(default_factory=time.time)


def registry_for(pipeline: str, outcome: RunOutcome) -> CollectorRegistry:
    """A fresh registry holding this run's metrics (nothing of another run in the process)."""
    registry = CollectorRegistry()

    def gauge(name: str, text: str, value: float | None = None,
              labels: tuple[str, ...] = ()) -> Gauge:
        g = Gauge(name, text, ["pipeline", *labels], registry=registry)
        if value is not None:
            g.labels(pipeline).set(value)
        return g

    gauge("pipeline_run_records_read", "Kafka records the last run read and committed",
          outcome.records_read)
    gauge("pipeline_run_rows_written", "Result rows the last run committed",
          outcome.rows_written)
    gauge("pipeline_run_rows_deleted", "Result rows the last run's tombstones deleted "
          "(upsert sinks)", outcome.rows_deleted)
    gauge("pipeline_run_dead_letters", "Dead letters the last run committed",
          outcome.dead_letters)
    gauge("pipeline_run_exit_code", "Exit code of the last run (0 success, 75/143 retry, "
          "1/2/3 a person must look)", outcome.exit_code)
    status = gauge("pipeline_run_status", "1 for the last run's status, 0 for the others",
                   labels=("status",))
    for s in STATUSES:
        status.labels(pipeline, s).set(1 if s == outcome.status else 0)
    gauge("pipeline_run_finished_timestamp_seconds", "When the last run ended (Unix time)",
          outcome.finished_at)
    if outcome.run_id is not None:
        gauge("pipeline_run_id", "run_id of the last run in pipeline_runs", outcome.run_id)
    durations = gauge("pipeline_run_duration_seconds",
                      "Seconds the last run spent per phase (plan, spark_start, "
                      "read_and_stage, publish) and in total", labels=("phase",))
    for phase, seconds in outcome.timings.items():
        durations.labels(pipeline, phase).set(seconds)
    if outcome.status in ("succeeded", "noop"):
        gauge("pipeline_last_success_timestamp_seconds",
              "When a run last succeeded (also with nothing to read; Unix time)",
              outcome.finished_at)
    if outcome.lag is not None:
        lag = gauge("pipeline_lag_records", "Offsets Kafka held (when the last run planned) "
                    "beyond the next offset to read after it", labels=("topic", "partition"))
        for (topic, partition), n in sorted(outcome.lag.items()):
            lag.labels(pipeline, topic, str(partition)).set(n)
    return registry


def export(settings: Settings, outcome: RunOutcome) -> None:
    """Write and/or push the run's metrics as configured; a failure is a warning only."""
    target = settings.metrics
    if not (target.textfile or target.pushgateway):
        return
    registry = registry_for(settings.name, outcome)
    if target.textfile:
        try:
            write_textfile(target.textfile, registry)
            log.debug("metrics written to %s", target.textfile,
                      extra={"event": "metrics.written", "textfile": target.textfile})
        except Exception as e:  # noqa: BLE001 - the run's outcome stands
            log.warning("could not write the run's metrics to %s (%s); the run is not affected",
                        target.textfile, e,
                        extra={"event": "metrics.failed", "textfile": target.textfile,
                               "error": str(e)})
    if target.pushgateway:
        url, handler = _gateway(target.pushgateway)
        try:
            pushadd_to_gateway(url, job=JOB, registry=registry,
                               grouping_key={"pipeline": settings.name},
                               timeout=PUSH_TIMEOUT_SECONDS, handler=handler)
            log.debug("metrics pushed to %s", url,
                      extra={"event": "metrics.pushed", "pushgateway": url})
        except Exception as e:  # noqa: BLE001 - the run's outcome stands
            log.warning("could not push the run's metrics to %s (%s); the run is not affected",
                        url, e, extra={"event": "metrics.failed", "pushgateway": url,
                                       "error": str(e)})


def _gateway(url: str) -> tuple[str, Callable]:
    """The Pushgateway's URL without credentials, and the handler that sends them (basic
    auth) when the configured URL has some: urllib does not read them from a URL."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, default_handler
    user, password = unquote(parts.username), unquote(parts.password or "")
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))

    def handler(url, method, timeout, headers, data):
        return basic_auth_handler(url, method, timeout, headers, data, user, password)

    return bare, handler


class _Carried:
    """Metric families of the file being replaced that this run did not measure."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def write_textfile(path: str, registry: CollectorRegistry) -> None:
    """Write atomically (a temporary file in the same directory, then rename), so the
    collector never reads half a file; keep what the previous file had that this run did
    not measure."""
    fresh = {m.name for m in registry.collect()}
    try:
        with open(path) as previous:
            old = [m for m in text_string_to_metric_families(previous.read())
                   if m.name not in fresh]
    except FileNotFoundError:
        old = []
    except (OSError, ValueError) as e:  # unreadable or not the exposition format: replace it
        log.debug("not carrying metrics over from %s: %s", path, e)
        old = []
    if old:
        registry.register(_Carried(old))
    write_to_textfile(os.fspath(path), registry)
