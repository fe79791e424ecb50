"""OpenLineage from the ingest DAG, through the real provider and a real file transport:
a run that succeeds emits COMPLETE naming the topic it read (kafka://host:port, the
topic), the table it wrote (postgres://host:port, db.schema.table) and the offsets it
published per partition; a run whose job fails emits FAIL with the same datasets and the
job's exit code. Without the provider installed, the same DAG runs as before."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.airflow.conftest import AIRFLOW_PYTHON, AIRFLOW_VENV, dag_env, new_pipeline, task
from tests.helpers import BOOTSTRAP, TEST_DB_URL, result_keys, toml_config, watermarks

pytestmark = pytest.mark.airflow

FACET = "kafkaOffsetPipeline_offsets"
# What apache-airflow-providers-openlineage installs (itself, openlineage-python and its
# friends), relative to site-packages; the folders above them are rebuilt, not linked.
OPENLINEAGE = ("airflow/providers/openlineage", "openlineage", "openlineage_sql")
OPENLINEAGE_DISTS = ("apache_airflow_providers_openlineage-", "openlineage_")
DB = urlsplit(TEST_DB_URL)
POSTGRES = f"postgres://{DB.hostname}:{DB.port}"


def file_transport(directory: Path) -> tuple[Path, dict[str, str]]:
    events = directory / "openlineage.jsonl"
    transport = {"type": "file", "log_file_path": str(events), "append": True}
    return events, {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
                    "AIRFLOW__OPENLINEAGE__NAMESPACE": "pipeline_tests"}


def events_of(events: Path, job: str) -> list[dict]:
    lines = events.read_text().splitlines() if events.exists() else []
    return [e for e in map(json.loads, lines) if e["job"]["name"] == job]


def datasets(event: dict, side: str) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in event[side]]


@pytest.fixture(scope="module")
def lineage_runs(stack, airflow, tmp_path_factory):
    """Two ingest DAGs on one topic, the file transport on: one lands the topic's records,
    the other's job exits 2 (its results table was never created), not retried."""
    directory = tmp_path_factory.mktemp("lineage")
    good = new_pipeline(directory, "af_lineage", partitions=2, records=25)
    bad = f"{good.name}_noinit"
    (directory / f"{bad}.toml").write_text(toml_config(bad, [good.name]))
    events, transport = file_transport(directory)
    env = dag_env(directory, PIPELINE_RETRIES="0", **transport)
    succeeded, failed = airflow.dag_tests([(good.ingest, None), (f"{bad}.ingest", None)],
                                          env=env)
    return good.name, bad, succeeded, failed, events


def test_a_completed_run_names_the_topic_the_table_and_the_offsets_it_published(lineage_runs):
    name, _, run, _, events = lineage_runs
    assert run["state"] == "success", run["log"][-4000:]
    ends = {part: high for part, (_, high) in watermarks(name).items()}
    assert sum(ends.values()) == 25 and len(ends) == 2
    [event] = [e for e in events_of(events, f"{name}.ingest.ingest")
               if e["eventType"] == "COMPLETE"]
    assert event["job"]["namespace"] == "pipeline_tests"
    assert datasets(event, "inputs") == [(f"kafka://{BOOTSTRAP}", name)]
    assert datasets(event, "outputs") == [(POSTGRES, f"{DB.path.lstrip('/')}.public.{name}")]
    facet = event["run"]["facets"][FACET]
    summary = run["xcom"]["ingest"]
    assert (facet["runId"], facet["kind"], facet["status"], facet["exitCode"]) == (
        summary["run_id"], "ingest", "succeeded", 0)
    assert (facet["recordsRead"], facet["rowsWritten"], facet["deadLetters"]) == (25, 25, 0)
    assert sorted((r["topic"], r["partition"], r["from"], r["until"], r["records"], r["rows"])
                  for r in facet["ranges"]) == sorted(
        (name, part, 0, high, high, high) for part, high in ends.items())


def test_a_failed_run_emits_fail_with_its_datasets_and_the_jobs_exit_code(lineage_runs):
    name, bad, _, run, events = lineage_runs
    assert run["state"] == "failed"
    assert task(run, "ingest")["try_number"] == 1
    emitted = events_of(events, f"{bad}.ingest.ingest")
    assert [e["eventType"] for e in emitted] == ["START", "FAIL"], emitted
    fail = emitted[-1]
    assert datasets(fail, "inputs") == [(f"kafka://{BOOTSTRAP}", name)]
    assert datasets(fail, "outputs") == [(POSTGRES, f"{DB.path.lstrip('/')}.public.{bad}")]
    facet = fail["run"]["facets"][FACET]
    # The job rolled back: nothing published, no run id; its exit code says why.
    assert (facet["status"], facet["exitCode"], facet["ranges"]) == ("failed", 2, [])
    assert "runId" not in facet
    assert facet["exitMeaning"].startswith("permanent: bad configuration")
    # The provider adds the task's error: the job's one-line error.
    assert "error: tables missing in schema public" in (
        fail["run"]["facets"]["errorMessage"]["message"])


def link_except(source: Path, target: Path, hidden: set[str], prefix: str = "") -> None:
    """``target`` gets a link to every entry of ``source`` but the ``hidden`` paths; a
    folder that holds a hidden path is made anew and filled the same way."""
    target.mkdir(exist_ok=True)
    for entry in source.iterdir():
        path = f"{prefix}{entry.name}"
        if path in hidden or entry.name.startswith(OPENLINEAGE_DISTS):
            continue
        if any(h.startswith(path + "/") for h in hidden):
            link_except(entry, target / entry.name, hidden, path + "/")
        else:
            (target / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def python_without_openlineage(tmp_path_factory) -> Path:
    """A virtualenv like .airflow-venv without the OpenLineage provider and client: its
    site-packages links everything of .airflow-venv's but their packages and dist-infos,
    so neither imports nor package metadata find them, as if never installed."""
    root = tmp_path_factory.mktemp("without_openlineage") / "venv"
    subprocess.run([str(AIRFLOW_PYTHON), "-m", "venv", "--without-pip", str(root)], check=True)
    [site] = root.glob("lib/python3*/site-packages")
    [source] = AIRFLOW_VENV.glob("lib/python3*/site-packages")
    site.rmdir()
    link_except(source, site, set(OPENLINEAGE))
    python = root / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import airflow.providers.openlineage"],
                           capture_output=True, text=True)
    assert "No module named 'airflow.providers.openlineage'" in probe.stderr, probe.stderr
    return python


def test_without_the_openlineage_provider_the_dag_still_runs(
        stack, airflow, python_without_openlineage, tmp_path):
    pipeline = new_pipeline(tmp_path, "af_nolineage", partitions=1, records=5)
    events, transport = file_transport(tmp_path)
    [run] = airflow.dag_test(pipeline.ingest, None, env=dag_env(tmp_path, **transport),
                             python=python_without_openlineage)
    assert run["state"] == "success", run["log"][-4000:]
    assert run["xcom"]["ingest"]["rows_written"] == 5
    assert len(result_keys(pipeline.name)) == 5
    # The transport is configured, yet nothing was emitted: the provider was really absent.
    assert not events.exists()
