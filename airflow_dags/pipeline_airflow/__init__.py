"""The pipeline's Airflow integration, imported by the DAG files beside this package
(ingest.py, backfill.py), which only hand each pipeline config to the operator. Nothing
here is a DAG file (.airflowignore), and nothing is read at import: the DAG files call
these modules when they are parsed, the operator when its task runs, so one bad setting
fails only what it concerns.

  configs.py          the pipeline configs in PIPELINE_CONFIG_DIR, one pair of DAGs each
  dag_settings.py     a config's [airflow] table and the PIPELINE_* defaults -> the DAG's
                      and its task's arguments, and what keeps them from being used
  job_package.py      the job's own package (pipeline/): the [airflow] model, exit codes
  deployment.py       where the job is on this host (PIPELINE_HOME, PIPELINE_VENV, ...)
  spark_submit.py     a Spark connection -> the spark-submit command line
  connections.py      Postgres and Kafka connections -> the job's environment
  job_process.py      spark-submit as the task's child: started, streamed, stopped
  outcome.py          the job's exit code and summary file -> the task's state and XCom
  operator.py         PipelineSubmitOperator, the submitting task of both DAGs
  backfill_params.py  the backfill DAG's params and the checks a schema cannot express
  lineage.py          OpenLineage: the datasets of a run and its offsets facet
"""
