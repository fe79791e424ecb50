"""The package as a user installs it: the built wheel in a fresh virtualenv outside this
checkout, no connector jars, no repository on the path. init-db must apply the migrations
it carries, and run + lag must work with the built-in sink (which never uses Spark's Kafka
source); a transform without the `transform` extra is a one-line exit-2 error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (
    ROOT,
    TEST_DB_URL,
    create_topic,
    grant_job_role,
    produce_orders,
    query,
    stored_offsets,
    toml_config,
    unique,
    wheel_venv,
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with the wheel built from this checkout and its pinned dependencies only."""
    return wheel_venv(tmp_path_factory.mktemp("wheel"))


def outside(env_dir: Path, *args: str, cwd: Path, extra: dict | None = None
            ) -> subprocess.CompletedProcess:
    """The installed `pipeline` command, run from a folder outside the checkout, with an
    environment that names nothing of it (no PYTHONPATH, no project venv, no jars)."""
    env = {"PATH": f"{env_dir / 'bin'}:/usr/local/bin:/usr/bin:/bin",
           "HOME": os.environ.get("HOME", "/root"), "SPARK_LOCAL_IP": "127.0.0.1",
           **({"JAVA_HOME": os.environ["JAVA_HOME"]} if "JAVA_HOME" in os.environ else {}),
           **(extra or {})}
    return subprocess.run([str(env_dir / "bin" / "pipeline"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_wheel_carries_its_migrations_and_runs_outside_the_checkout(installed, tmp_path):
    import pipeline as checkout

    found = subprocess.run([str(installed / "bin" / "python"), "-c",
                            "import pipeline; print(pipeline.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(found).resolve().parent != Path(checkout.__file__).resolve().parent
    assert "site-packages" in found

    version = outside(installed, "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("pipeline 0."), version

    name, topic = unique("wheel"), unique("wheel_orders")
    create_topic(topic, partitions=2)
    produce_orders(topic, range(40))
    config = tmp_path / "pipeline.toml"
    config.write_text(toml_config(name, [topic]))

    init = outside(installed, "init-db", "--config", str(config), cwd=tmp_path,
                   extra={"PIPELINE__DATABASE__URL": TEST_DB_URL})
    assert init.returncode == 0, init.stderr[-2000:]
    assert "001_offsets.sql" in init.stdout + init.stderr
    grant_job_role("public", name)

    run = outside(installed, "run", "--config", str(config), "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["records_read"] == 40
    assert query(f"SELECT count(*) FROM {name}") == [(40,)]
    assert sum(stored_offsets(name).values()) == 40

    lag = outside(installed, "lag", "--config", str(config), "--json", cwd=tmp_path)
    assert lag.returncode == 0, lag.stderr[-2000:]
    assert json.loads(lag.stdout)["total_lag"] == 0


def test_a_transform_without_its_extra_says_what_to_install(installed, tmp_path):
    name, topic = unique("wheel_tx"), unique("wheel_tx_orders")
    create_topic(topic, partitions=1)
    produce_orders(topic, range(3))
    config = tmp_path / "pipeline.toml"
    config.write_text(toml_config(name, [topic], extra_sink='transform = "json:loads"'))
    init = outside(installed, "init-db", "--config", str(config), cwd=tmp_path,
                   extra={"PIPELINE__DATABASE__URL": TEST_DB_URL})
    assert init.returncode == 0, init.stderr[-2000:]
    grant_job_role("public", name)

    run = outside(installed, "run", "--config", str(config), cwd=tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    error = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "kafka-offset-pipeline[transform]" in error[0], run.stderr
    assert stored_offsets(name) == {}


def test_spark_submit_conf_wins_over_the_jobs_defaults(tmp_path):
    """A cluster user's --conf (the UI back on, more shuffle partitions) is kept: the job's
    defaults only fill keys nothing set."""
    script = tmp_path / "show_conf.py"
    script.write_text(
        "import json\n"
        "from pipeline.spark.session import spark_conf\n"
        "c = spark_conf()\n"
        "out = {k: c.get(k, None) for k in ('spark.ui.enabled', 'spark.sql.shuffle.partitions',"
        " 'spark.sql.session.timeZone')}\n"
        "print(json.dumps(out))\n")
    venv_bin = os.path.dirname(sys.executable)
    r = subprocess.run(
        [os.path.join(venv_bin, "spark-submit"), "--master", "local[1]",
         "--conf", "spark.ui.enabled=true", "--conf", "spark.sql.shuffle.partitions=7",
         "--conf", "spark.driver.host=127.0.0.1", str(script)],
        env={**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}",
             "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    shown = json.loads(r.stdout.strip().splitlines()[-1])
    assert shown["spark.ui.enabled"] == "true"
    assert shown["spark.sql.shuffle.partitions"] == "7"
    assert shown["spark.sql.session.timeZone"] == "UTC"  # ours, where nothing was set
