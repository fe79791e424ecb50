"""Runs inside the Airflow venv (.airflow-venv/bin/python), never under pytest: the job venv
cannot import Airflow. The tests call it as a subprocess and read the one JSON line it
prints last, prefixed with RESULT_MARKER. Run it with PYTHONUNBUFFERED=1 and stderr merged into
stdout, so that each run's log lines follow its RUN_MARKER.

  dag_runner.py check                      parse the DAGs folder like the dag processor
  dag_runner.py command DAG_ID TASK_ID     the spark-submit command that task would run,
                                           its connections resolved as on a worker
  dag_runner.py runs RUNS_JSON             dag.test() once per [DAG_ID, CONF] of the list,
                                           in its order (one Airflow start for them all)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULT_MARKER = "DAG_RUNNER_RESULT "
RUN_MARKER = "DAG_RUNNER_RUN "  # printed before each dag.test(): the tests split the log on it


def dag_bag():
    from airflow import settings
    from airflow.dag_processing.dagbag import BundleDagBag

    folder = Path(settings.DAGS_FOLDER)
    return BundleDagBag(folder, bundle_path=folder, bundle_name="dags-folder")


def describe(dag) -> dict:
    def seconds(td):
        return None if td is None else td.total_seconds()

    return {
        "fileloc": dag.fileloc,
        "timetable": type(dag.timetable).__name__,
        "schedule": dag.schedule if isinstance(dag.schedule, str | None) else repr(dag.schedule),
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "doc_md": dag.doc_md,
        "tags": sorted(dag.tags),
        "params": {k: {"default": p.value if p.has_value else None, "schema": p.schema}
                   for k, p in dag.params.items()},
        "tasks": {t.task_id: {
            "type": type(t).__name__,
            "mro": [c.__name__ for c in type(t).__mro__],
            "retries": t.retries,
            "retry_delay": seconds(t.retry_delay),
            "retry_exponential_backoff": t.retry_exponential_backoff,
            "max_retry_delay": seconds(t.max_retry_delay),
            "execution_timeout": seconds(t.execution_timeout),
            "upstream": sorted(t.upstream_task_ids),
            "modules": sorted({c.__module__ for c in type(t).__mro__}),
            **{k: getattr(t, k, None) for k in (
                "owner", "pool", "pool_slots", "queue", "application", "application_args",
                "config", "conf", "spark_submit", "spark_conn_id", "postgres_conn_id",
                "kafka_conn_id", "config_problems")},
        } for t in dag.tasks},
    }


def check() -> dict:
    bag = dag_bag()
    return {"import_errors": {str(k): v for k, v in bag.import_errors.items()},
            "dags": {dag_id: describe(dag) for dag_id, dag in bag.dags.items()}}


def command(dag_id: str, task_id: str) -> dict:
    """The task's command line, SUMMARY standing for the summary file a run names."""
    task = dag_bag().dags[dag_id].get_task(task_id)
    from pipeline_airflow.deployment import job_env  # as the DAG files imported it

    try:
        return {"command": task.submit_command(Path("SUMMARY")), "job_env": job_env()}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def run_test(runs: list[tuple[str, dict | None]]) -> list[dict]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    results = []
    for i, (dag_id, conf) in enumerate(runs):
        print(f"{RUN_MARKER}{i}", flush=True)
        # A fresh parse per run, as a worker does: resolving params mutates the DAG's Param
        # objects, so a second dag.test() of the same object would inherit the first's conf.
        bag = dag_bag()
        if bag.import_errors:
            raise SystemExit(f"import errors: {bag.import_errors}")
        dag = bag.dags[dag_id]
        try:
            dr = dag.test(run_conf=conf)
        except Exception as e:  # e.g. ParamValidationError: no run was created
            results.append({"error": f"{type(e).__name__}: {e}"})
            continue
        with create_session() as session:
            tis = session.scalars(select(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == dr.run_id)).all()
            xcoms = session.execute(select(XComModel.task_id, XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.run_id == dr.run_id,
                XComModel.key == "return_value")).all()
            results.append({
                "run_id": dr.run_id,
                "state": str(dr.state),
                "tasks": {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number,
                                       "max_tries": ti.max_tries} for ti in tis},
                "xcom": {task_id: value for task_id, value in xcoms},
            })
    return results


def main(argv: list[str]) -> None:
    if argv[:1] == ["check"]:
        result = check()
    elif argv[:1] == ["command"] and len(argv) == 3:
        result = command(argv[1], argv[2])
    elif argv[:1] == ["runs"] and len(argv) == 2:
        result = run_test([(dag_id, conf) for dag_id, conf in json.loads(argv[1])])
    else:
        raise SystemExit(__doc__)
    print(RESULT_MARKER + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
