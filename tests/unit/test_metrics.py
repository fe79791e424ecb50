"""A run's metrics as Prometheus reads them: names, labels and values; the textfile written
atomically and keeping what a failed run could not measure; [metrics] validated."""

from __future__ import annotations

import os
import re
import tomllib

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.config import mask, parse_settings
from pipeline.driver import metrics
from pipeline.errors import ConfigError
from tests.helpers import ROOT


def samples(text: str) -> dict[tuple, float]:
    """{(name, (label, value), ...): value} of an exposition text."""
    return {(s.name, *sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def settings(**metrics_table):
    doc = {"pipeline": {"name": "p1"},
           "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
           "database": {"url": "postgresql://u@h/db"},
           "sink": {"format": "raw", "table": "events"},
           "metrics": metrics_table}
    return parse_settings(doc, environ={"GW_PASSWORD": "s3cret"})


SUCCESS = metrics.RunOutcome(
    "ingest", "succeeded", 0, 12, records_read=10, rows_written=8, dead_letters=2,
    rows_deleted=3, timings={"plan": 0.5, "read_and_stage": 2.0, "total": 3.0},
    lag={("t", 0): 0, ("t", 1): 7}, finished_at=1_000.0)
FAILED = metrics.RunOutcome("ingest", "failed", 75, None, timings={"total": 0.2},
                            finished_at=2_000.0)


def test_a_succeeded_run_exports_its_counts_phases_lag_and_success_time():
    got = samples(generate_latest(metrics.registry_for("p1", SUCCESS)).decode())

    p = ("pipeline", "p1")
    assert got == {
        ("pipeline_run_records_read", p): 10, ("pipeline_run_rows_written", p): 8,
        ("pipeline_run_dead_letters", p): 2, ("pipeline_run_rows_deleted", p): 3,
        ("pipeline_run_exit_code", p): 0,
        ("pipeline_run_status", p, ("status", "succeeded")): 1,
        ("pipeline_run_status", p, ("status", "noop")): 0,
        ("pipeline_run_status", p, ("status", "failed")): 0,
        ("pipeline_run_finished_timestamp_seconds", p): 1_000,
        ("pipeline_run_id", p): 12,
        ("pipeline_run_duration_seconds", ("phase", "plan"), p): 0.5,
        ("pipeline_run_duration_seconds", ("phase", "read_and_stage"), p): 2.0,
        ("pipeline_run_duration_seconds", ("phase", "total"), p): 3.0,
        ("pipeline_last_success_timestamp_seconds", p): 1_000,
        ("pipeline_lag_records", ("partition", "0"), p, ("topic", "t")): 0,
        ("pipeline_lag_records", ("partition", "1"), p, ("topic", "t")): 7,
    }


def test_a_failed_run_has_its_exit_code_and_no_success_time_or_lag_of_its_own():
    got = samples(generate_latest(metrics.registry_for("p1", FAILED)).decode())
    names = {name for name, *_ in got}

    assert got[("pipeline_run_exit_code", ("pipeline", "p1"))] == 75
    assert got[("pipeline_run_status", ("pipeline", "p1"), ("status", "failed"))] == 1
    assert got[("pipeline_run_records_read", ("pipeline", "p1"))] == 0
    assert not names & {"pipeline_last_success_timestamp_seconds", "pipeline_lag_records",
                        "pipeline_run_id"}


def test_the_textfile_is_replaced_whole_and_keeps_what_a_failed_run_did_not_measure(tmp_path):
    path = tmp_path / "p1.prom"
    metrics.write_textfile(str(path), metrics.registry_for("p1", SUCCESS))
    before = os.stat(path).st_ino
    with open(path) as reader_of_the_old_file:
        metrics.write_textfile(str(path), metrics.registry_for("p1", FAILED))
        old = samples(reader_of_the_old_file.read())

    new = samples(path.read_text())
    assert os.stat(path).st_ino != before  # a new file renamed over the old one
    assert old[("pipeline_run_exit_code", ("pipeline", "p1"))] == 0  # never half-written
    assert new[("pipeline_run_exit_code", ("pipeline", "p1"))] == 75
    assert new[("pipeline_last_success_timestamp_seconds", ("pipeline", "p1"))] == 1_000
    assert new[("pipeline_lag_records", ("partition", "1"), ("pipeline", "p1"),
                ("topic", "t"))] == 7
    assert new[("pipeline_run_duration_seconds", ("phase", "total"), ("pipeline", "p1"))] == 0.2
    assert ("pipeline_run_duration_seconds", ("phase", "plan"), ("pipeline", "p1")) not in new
    assert sorted(os.listdir(tmp_path)) == ["p1.prom"]  # no temporary file left


def test_a_textfile_that_is_not_metrics_is_replaced(tmp_path):
    path = tmp_path / "p1.prom"
    path.write_text("this is { not the exposition format\n")

    metrics.write_textfile(str(path), metrics.registry_for("p1", FAILED))

    assert samples(path.read_text())[("pipeline_run_exit_code", ("pipeline", "p1"))] == 75


def test_without_a_metrics_table_nothing_is_exported_and_nothing_fails(tmp_path):
    s = settings()
    assert s.metrics.textfile is None and s.metrics.pushgateway is None
    metrics.export(s, SUCCESS)  # returns without touching anything


def test_an_export_that_fails_is_a_warning_not_an_error(tmp_path, caplog):
    s = settings(textfile=str(tmp_path / "missing" / "p1.prom"),
                 pushgateway="http://127.0.0.1:9")  # discard port: connection refused

    metrics.export(s, SUCCESS)

    failures = [r for r in caplog.records if getattr(r, "event", None) == "metrics.failed"]
    assert [r.levelname for r in failures] == ["WARNING", "WARNING"]
    assert "the run is not affected" in failures[0].getMessage()


@pytest.mark.parametrize("table, message", [
    ({"textfile": "/var/lib/node_exporter/p1.txt"}, "'metrics.textfile' = "
     "'/var/lib/node_exporter/p1.txt': node_exporter's textfile collector reads only *.prom"),
    ({"textfile": 3}, "'metrics.textfile' must be a string"),
    ({"pushgateway": "pushgateway:9091"}, "'metrics.pushgateway' = 'pushgateway:9091': write "
     "the Pushgateway's URL as http://host:9091"),
    ({"pushgateway": "http://${NOT_SET}:9091"}, "refers to ${NOT_SET}, which is not set"),
    ({"push_gateway": "http://h:9091"}, "unknown key 'metrics.push_gateway'"),
])
def test_a_bad_metrics_table_is_one_line_naming_the_key(table, message):
    with pytest.raises(ConfigError) as e:
        settings(**table)
    assert message in e.value.message and "\n" not in e.value.message


def test_a_pushgateway_password_is_a_secret_kept_out_of_messages(caplog):
    s = settings(pushgateway="http://pipeline:${GW_PASSWORD}@127.0.0.1:9")
    assert s.metrics.pushgateway == "http://pipeline:s3cret@127.0.0.1:9"
    assert mask(f"push to {s.metrics.pushgateway} failed") == (
        "push to http://pipeline:***@127.0.0.1:9 failed")

    metrics.export(s, SUCCESS)

    [warning] = [r for r in caplog.records if getattr(r, "event", None) == "metrics.failed"]
    assert "http://127.0.0.1:9" in warning.getMessage()
    assert "s3cret" not in warning.getMessage() + str(vars(warning))


def load_settings_text(text: str):
    return parse_settings(tomllib.loads(text), environ={})


def test_the_metrics_table_documented_in_conf_local_toml_is_valid_when_uncommented():
    text = (ROOT / "conf" / "local.toml").read_text()
    head, _, tail = text.partition("# [metrics]")
    uncommented = "[metrics]" + "".join(
        "\n" + line[2:] for line in tail.splitlines() if re.match(r"# \w+ = ", line))

    s = load_settings_text(head + uncommented)

    assert s.metrics.textfile == "/var/lib/node_exporter/textfile/demo.prom"
    assert s.metrics.pushgateway == "http://127.0.0.1:9091"


def test_the_lag_a_run_leaves_counts_from_its_planned_end_if_it_committed_else_its_start():
    from pipeline.driver.report import Seen
    from pipeline.plan.offsets import PartitionOffsets, plan_ranges

    kafka = [PartitionOffsets("t", 0, 0, 100), PartitionOffsets("t", 1, 50, 60)]
    seen = Seen(plan=plan_ranges({("t", 0): 10}, kafka, max_records_per_partition=30),
                latest={("t", 0): 100, ("t", 1): 60})

    assert seen.lag(committed=True) == {("t", 0): 60, ("t", 1): 0}  # read [10, 40), [50, 60)
    assert seen.lag(committed=False) == {("t", 0): 90, ("t", 1): 10}
    assert Seen().lag(committed=False) is None  # failed before planning: not measured
