"""The Spark standalone cluster tests: `scripts/cluster up` (a master and two workers that
cannot see the repository) and `scripts/package` (the job environment shipped to them),
each once per session. The ports come from the environment as for scripts/cluster
(SPARK_MASTER_PORT, SPARK_MASTER_WEBUI_PORT, SPARK_WORKER_WEBUI_PORT)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

MASTER_PORT = os.environ.get("SPARK_MASTER_PORT", "7077")
MASTER_URL = f"spark://127.0.0.1:{MASTER_PORT}"
# Where scripts/cluster keeps each worker's Spark copy and work folder (outside the repo).
CLUSTER_DIR = Path(os.environ.get("SPARK_CLUSTER_DIR")
                   or f"/var/tmp/pipeline-cluster-{MASTER_PORT}")
WORKERS = int(os.environ.get("SPARK_WORKER_INSTANCES", "2"))
# scripts/cluster's pid files and daemon logs (worker-N.pid holds the Worker JVM's pid).
STATE_DIR = Path(os.environ.get("STACK_DIR") or ROOT / ".stack") / "cluster" / MASTER_PORT


def cluster_command(command: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "cluster"), command], capture_output=True,
                          text=True, timeout=300)


def app_dirs() -> dict[int, set[Path]]:
    return {n: set((CLUSTER_DIR / f"worker-{n}" / "work").glob("app-*"))
            for n in range(1, WORKERS + 1)}


def workers_with_tasks(before: dict[int, set[Path]]) -> set[int]:
    """Workers whose executors of the application(s) started since `before` ran a task."""
    ran = set()
    for n, dirs in app_dirs().items():
        for app in dirs - before[n]:
            if any("Finished task" in f.read_text(errors="replace")
                   for f in app.glob("*/stderr")):
                ran.add(n)
    return ran


@pytest.fixture(scope="session")
def cluster(stack):
    """The standalone cluster's master URL. Stopped at the end only if this session started
    it (a cluster someone had up already is left as it was)."""
    was_up = cluster_command("status").stdout.startswith("master    up")
    up = cluster_command("up")
    assert up.returncode == 0, f"scripts/cluster up failed:\n{up.stderr}"
    yield MASTER_URL
    if not was_up:
        down = cluster_command("down")
        assert down.returncode == 0, down.stderr


@pytest.fixture(scope="session")
def job_archive() -> Path:
    """dist/pipeline-env.tar.gz, built (or found up to date) by scripts/package."""
    done = subprocess.run([str(ROOT / "scripts" / "package")], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"scripts/package failed:\n{done.stderr}"
    archive = ROOT / "dist" / "pipeline-env.tar.gz"
    assert archive.is_file()
    return archive
