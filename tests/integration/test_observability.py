"""What a run tells the outside, against the real stack: one JSON document on stdout even
through spark-submit, JSON log lines on stderr, and Prometheus metrics - in a textfile and
in a real Pushgateway - that equal the run's own summary."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
import warnings
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.driver.metrics import JOB
from tests.helpers import (
    ROOT,
    create_topic,
    init_cli,
    produce,
    produce_orders,
    query,
    result_keys,
    run_cli,
    toml_config,
    unique,
)
from tests.integration.test_core import spark_submit

GATEWAY_USER, GATEWAY_PASSWORD = "pipeline", "s3cret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pushgateway(tmp_path_factory):
    """Debian's prometheus-pushgateway (installed if missing) on a free loopback port, with
    basic auth, so that pushing with the credentials of the configured URL is tested too."""
    binary = shutil.which("prometheus-pushgateway")
    if binary is None:
        if os.geteuid() != 0:
            pytest.fail("prometheus-pushgateway is missing: apt-get install prometheus-pushgateway")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends",
                   "prometheus-pushgateway"]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
            subprocess.run(install, env=env, capture_output=True, check=True)
        binary = shutil.which("prometheus-pushgateway")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # crypt: bcrypt without a dependency
        import crypt

        hashed = crypt.crypt(GATEWAY_PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    web = tmp_path_factory.mktemp("pushgateway") / "web.yml"
    web.write_text(f"basic_auth_users:\n  {GATEWAY_USER}: '{hashed}'\n")
    port = free_port()
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}",
                             f"--web.config.file={web}", "--persistence.file="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            gateway_get(url, "/-/ready")
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            assert time.time() < deadline, "the Pushgateway did not get ready"
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


def gateway_get(url: str, path: str) -> str:
    token = base64.b64encode(f"{GATEWAY_USER}:{GATEWAY_PASSWORD}".encode()).decode()
    request = urllib.request.Request(url + path, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{GATEWAY_USER}:{GATEWAY_PASSWORD}@")


def metric_values(text: str, pipeline: str) -> dict[tuple, float]:
    """{(name, (label, value), ...): value} of one pipeline's pipeline_* samples; the
    Pushgateway's own grouping labels (job, instance) are checked apart."""
    return {(s.name, *sorted((k, v) for k, v in s.labels.items()
                             if k not in ("job", "instance"))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("pipeline_") and s.labels.get("pipeline") == pipeline}


def pushed(url: str, pipeline: str) -> dict[tuple, float]:
    text = gateway_get(url, "/metrics")
    jobs = {s.labels.get("job") for f in text_string_to_metric_families(text)
            for s in f.samples if s.labels.get("pipeline") == pipeline}
    assert jobs <= {JOB}
    return metric_values(text, pipeline)


def json_lines(stderr: str) -> list[dict]:
    """Our log records: every line that starts like a JSON object must be one (Spark's JVM
    writes its own lines in log4j's format beside them)."""
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def one(values: dict, name: str, **labels: str) -> float:
    matches = [v for k, v in values.items()
               if k[0] == name and all((lk, lv) in k[1:] for lk, lv in labels.items())]
    assert len(matches) == 1, (name, labels, values)
    return matches[0]


@pytest.fixture(scope="module")
def submitted(stack, pushgateway, tmp_path_factory):
    """One run through the real spark-submit, JSON logs, capped per partition so that it
    leaves lag behind: partition 0 holds 40 orders, partition 1 20 orders and 3 bad
    records, the cap is 30."""
    tmp = tmp_path_factory.mktemp("observed")
    topic = create_topic(unique("obs"), 2)
    produce_orders(topic, range(40), partition=0)
    produce_orders(topic, range(100, 120), partition=1)
    produce(topic, [(b"k", b"{not json"), (b"k", b"[]"), (b"k", None)], partition=1)
    name = unique("obs")
    textfile = tmp / f"{name}.prom"
    config = tmp / "c.toml"
    config.write_text(toml_config(name, [topic], extra_kafka="max_records_per_partition = 30")
                      + f'\n[metrics]\ntextfile = "{textfile}"\n'
                      f'pushgateway = "{with_credentials(pushgateway)}"\n')
    init_cli(config)
    command, env = spark_submit(str(config), "--json")
    script = command.index(str(ROOT / "pipeline" / "submit.py"))
    command.insert(script + 1, "--log-format=json")  # a global option, before the command
    started = time.time()
    r = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": str(ROOT)})
    return {"r": r, "topic": topic, "name": name, "textfile": textfile, "config": config,
            "gateway": pushgateway, "started": started, "ended": time.time()}


def test_through_spark_submit_stdout_is_exactly_the_json_document(submitted):
    r = submitted["r"]

    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)  # the whole of stdout, nothing before or after it
    assert summary["status"] == "succeeded"
    assert (summary["records_read"], summary["rows_written"], summary["dead_letters"]) == (
        53, 50, 3)
    assert len(result_keys(submitted["name"])) == 50


def test_logs_go_to_stderr_as_json_lines_naming_the_pipeline_run_and_ranges(submitted):
    r, topic = submitted["r"], submitted["topic"]
    summary = json.loads(r.stdout)
    records = json_lines(r.stderr)
    events = [x["event"] for x in records if x["logger"].startswith("pipeline")]

    assert events == ["run.start", "plan", "spark.start", "read.start", "read.done",
                      "publish.done", "run.done"]
    assert {x["pipeline"] for x in records} == {submitted["name"]}
    by_event = {x["event"]: x for x in records}
    assert all(by_event[e]["run_id"] == summary["run_id"]
               for e in ("read.start", "read.done", "publish.done", "run.done"))
    assert by_event["plan"]["ranges"] == [
        {"topic": topic, "partition": 0, "from": 0, "until": 30, "offsets": 30},
        {"topic": topic, "partition": 1, "from": 0, "until": 23, "offsets": 23}]
    assert by_event["read.done"]["records"] == 53
    assert [(o["partition"], o["until"]) for o in by_event["publish.done"]["offsets"]] == [
        (0, 30), (1, 23)]
    done = by_event["run.done"]
    assert (done["records"], done["rows"], done["dead_letters"]) == (53, 50, 3)
    assert done["timings"] == summary["timings"] and done["level"] == "INFO"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", done["time"])
    # Spark's progress bar (redrawn with carriage returns) is off when stderr is no terminal.
    assert "\r" not in r.stderr and "[Stage " not in r.stderr


def expected_metrics(summary: dict, name: str, topic: str) -> dict[tuple, float]:
    p = ("pipeline", name)
    phases = {("pipeline_run_duration_seconds", ("phase", phase), p): seconds
              for phase, seconds in summary["timings"].items()}
    return {
        ("pipeline_run_records_read", p): summary["records_read"],
        ("pipeline_run_rows_written", p): summary["rows_written"],
        ("pipeline_run_dead_letters", p): summary["dead_letters"],
        ("pipeline_run_rows_deleted", p): summary["rows_deleted"],
        ("pipeline_run_exit_code", p): 0,
        ("pipeline_run_status", p, ("status", "succeeded")): 1,
        ("pipeline_run_status", p, ("status", "noop")): 0,
        ("pipeline_run_status", p, ("status", "failed")): 0,
        ("pipeline_run_id", p): summary["run_id"],
        **phases,
        ("pipeline_lag_records", ("partition", "0"), p, ("topic", topic)): 10,  # 40 - 30
        ("pipeline_lag_records", ("partition", "1"), p, ("topic", topic)): 0,
    }


def test_the_textfile_holds_the_runs_summary_lag_and_success_time(submitted):
    summary = json.loads(submitted["r"].stdout)
    values = metric_values(submitted["textfile"].read_text(), submitted["name"])

    finished = values.pop(("pipeline_run_finished_timestamp_seconds",
                           ("pipeline", submitted["name"])))
    success = values.pop(("pipeline_last_success_timestamp_seconds",
                          ("pipeline", submitted["name"])))
    assert submitted["started"] < finished == success < submitted["ended"]
    assert values == expected_metrics(summary, submitted["name"], submitted["topic"])
    assert summary["timings"].keys() == {"plan", "spark_start", "read_and_stage", "publish",
                                         "total"}


def test_the_pushgateway_holds_the_same_metrics_grouped_by_pipeline(submitted):
    values = pushed(submitted["gateway"], submitted["name"])

    assert values == metric_values(submitted["textfile"].read_text(), submitted["name"])
    group = gateway_get(submitted["gateway"], "/api/v1/metrics")
    assert f'"pipeline":"{submitted["name"]}"' in group.replace(" ", "")


def test_a_noop_then_a_failed_run_report_their_outcome_and_keep_the_last_success(
        stack, pushgateway, tmp_path):
    """No Spark here: an empty topic is a noop, an unreachable broker exit 75."""
    topic = create_topic(unique("quiet"), 2)
    name = unique("quiet")
    textfile = tmp_path / "quiet.prom"
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic]).replace("timeout_seconds = 10",
                                                         "timeout_seconds = 1")
                      + f'\n[metrics]\ntextfile = "{textfile}"\n'
                      f'pushgateway = "{with_credentials(pushgateway)}"\n')
    init_cli(config)
    p = ("pipeline", name)

    noop = run_cli("run", "--config", str(config), "--json",
                   env={"PIPELINE_LOG_FORMAT": "json"})
    assert noop.returncode == 0, noop.stderr
    assert json.loads(noop.stdout)["status"] == "noop"
    after_noop = metric_values(textfile.read_text(), name)
    assert one(after_noop, "pipeline_run_status", status="noop") == 1
    assert one(after_noop, "pipeline_run_records_read") == 0
    assert (one(after_noop, "pipeline_last_success_timestamp_seconds")
            == one(after_noop, "pipeline_run_finished_timestamp_seconds"))
    assert one(after_noop, "pipeline_lag_records", partition="1") == 0

    failed = run_cli("run", "--config", str(config), "--json",
                     env={"PIPELINE_LOG_FORMAT": "json",
                          "PIPELINE__KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9"})

    assert failed.returncode == 75 and failed.stdout == ""
    assert failed.stderr.splitlines()[-1].startswith("error: Kafka")
    [failure] = [x for x in json_lines(failed.stderr) if x["event"] == "run.failed"]
    assert failure["exit_code"] == 75 and failure["error"].startswith("Kafka")
    for values in (metric_values(textfile.read_text(), name), pushed(pushgateway, name)):
        assert values[("pipeline_run_exit_code", p)] == 75
        assert values[("pipeline_run_status", p, ("status", "failed"))] == 1
        assert values[("pipeline_run_status", p, ("status", "noop"))] == 0
        # What a run that failed before planning could not measure keeps its last value.
        assert (values[("pipeline_last_success_timestamp_seconds", p)]
                == after_noop[("pipeline_last_success_timestamp_seconds", p)])
        assert values[("pipeline_lag_records", ("partition", "1"), p, ("topic", topic))] == 0
        assert (values[("pipeline_run_finished_timestamp_seconds", p)]
                > after_noop[("pipeline_run_finished_timestamp_seconds", p)])


def test_a_metrics_export_that_fails_leaves_the_run_as_it_was(stack, tmp_path):
    topic = create_topic(unique("nometrics"), 1)
    name = unique("nometrics")
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic])
                      + f'\n[metrics]\ntextfile = "{tmp_path / "missing" / "x.prom"}"\n'
                      f'pushgateway = "http://127.0.0.1:{free_port()}"\n')
    init_cli(config)

    r = run_cli("run", "--config", str(config))

    assert r.returncode == 0 and r.stdout.startswith("run "), r.stderr
    assert query("SELECT status FROM pipeline_runs WHERE pipeline = %s", (name,)) == [("noop",)]
    lines = r.stderr.splitlines()
    # The default text format, as it always read.
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) pipeline", line)
               for line in lines), lines
    assert sum("could not write the run's metrics" in line for line in lines) == 1
    assert sum("could not push the run's metrics" in line for line in lines) == 1


def test_a_bad_config_through_spark_submit_is_one_error_line_on_stderr(stack, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(toml_config(unique("bad"), ["t"]) + '\n[metrics]\ntextfile = "x.txt"\n')
    command, env = spark_submit(str(config), "--json")

    r = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": str(ROOT)})

    assert r.returncode == 2 and r.stdout == "", r.stdout
    # Spark's JVM may still log after it (its shutdown), in log4j's format.
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [
        "error: 'metrics.textfile' = 'x.txt': node_exporter's textfile collector reads only "
        "*.prom files; end the name in .prom"]


def test_the_json_log_format_from_the_command_line_without_spark_submit(stack, tmp_path):
    topic = create_topic(unique("cli"), 1)
    name = unique("cli")
    config = Path(tmp_path / "c.toml")
    config.write_text(toml_config(name, [topic]))
    init_cli(config)

    r = run_cli("--log-format", "json", "run", "--config", str(config), "--json")

    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "noop"
    records = [json.loads(line) for line in r.stderr.splitlines()]  # every line JSON
    assert [x["event"] for x in records] == ["run.start", "plan", "run.noop", "run.done"]
    assert records[-1]["run_id"] == json.loads(r.stdout)["run_id"]
