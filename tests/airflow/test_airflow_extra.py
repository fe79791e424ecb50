"""The package's `airflow` extra as a deployment uses it: the built wheel installed with
`[airflow]` into one fresh virtualenv (the job and Airflow together, the job's pins from
constraints/spark-4.0.txt), no checkout on its path. The ingest DAG of airflow_dags/ runs
in it, the job from that same venv, and emits its OpenLineage events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.airflow.conftest import dag_env, new_pipeline
from tests.helpers import result_keys, wheel_venv

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


@pytest.fixture(scope="module")
def extra_venv(tmp_path_factory) -> Path:
    return wheel_venv(tmp_path_factory.mktemp("airflow_extra"), "[airflow]", check=True)


def test_the_ingest_dag_runs_from_one_venv_with_the_airflow_extra(
        stack, airflow, extra_venv, tmp_path):
    pipeline = new_pipeline(tmp_path, "af_extra", partitions=1, records=6)
    [site] = extra_venv.glob("lib/python3*/site-packages")
    events = tmp_path / "openlineage.jsonl"
    transport = {"type": "file", "log_file_path": str(events), "append": True}
    # The wheel carries pipeline/submit.py and pipeline/errors.py: the DAGs import the
    # package as installed, and find submit.py beside it (no PIPELINE_HOME); PIPELINE_VENV
    # is the venv with its spark-submit.
    [run] = airflow.dag_test(pipeline.ingest, None, python=extra_venv / "bin" / "python",
                             env=dag_env(tmp_path, PIPELINE_VENV=str(extra_venv),
                                         AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(transport)))
    assert run["state"] == "success", run["log"][-4000:]
    assert f"{site}/pipeline/submit.py run --config" in run["log"]
    assert len(result_keys(pipeline.name)) == 6
    complete = [e for e in map(json.loads, events.read_text().splitlines())
                if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith(".ingest.ingest")]
    assert [(d["name"], e["run"]["facets"]["kafkaOffsetPipeline_offsets"]["rowsWritten"])
            for e in complete for d in e["inputs"]] == [(pipeline.name, 6)]
