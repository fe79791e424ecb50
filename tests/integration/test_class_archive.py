"""The driver JVM's class-data-sharing archive on a real run (spark/class_archive.py): a
first run neither writes it nor waits for it at exit (a detached process writes it after
the run), the next run maps it, and a run whose archive was corrupted on disk still
succeeds (the JVM checks it and starts without it), with nothing from the JVM's
class-sharing messages in the run's output."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.helpers import (
    ROOT,
    create_topic,
    init_cli,
    produce_orders,
    query,
    run_cli,
    toml_config,
    unique,
    write_config,
)

pytestmark = pytest.mark.slow


def archives(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def run(config: Path, directory: Path, env: dict | None = None):
    proc = run_cli("run", "--config", str(config),
                   env={"PIPELINE_CLASS_ARCHIVE_DIR": str(directory), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the JVM's own log goes to stdout by default: a --json reader's stream
    for stream in (proc.stdout, proc.stderr):
        assert "[cds" not in stream and "fatal error" not in stream, stream[-3000:]
    return proc


def wait_for_archive(directory: Path, seconds: float = 600) -> Path:
    """The archive the detached process renames into place (bounded: it starts a JVM and
    runs a small job at low priority on a busy machine)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done = [p for p in archives(directory) if p.suffix == ".jsa"]
        if done and not any(p.suffix in (".tmp", ".dumping") for p in archives(directory)):
            return done[0]
        time.sleep(0.5)
    raise AssertionError(f"no class archive in {directory}: {archives(directory)}")


def test_a_first_run_exits_without_waiting_for_the_archive_the_next_maps_it(
        stack, tmp_path):
    name = unique("cds")
    create_topic(name, partitions=2)
    config = write_config(tmp_path / "p.toml", toml_config(name, [name]))
    init_cli(config)
    directory = tmp_path / "archives"
    crashes_before = set(ROOT.glob("hs_err_pid*.log"))
    gate = tmp_path / "gate"

    # The process that writes the archive is held before it starts its JVM: the first
    # run's exit must not wait for it (run_cli reads the run's output to its end).
    produce_orders(name, range(0, 50))
    first = run(config, directory, {"PIPELINE_FAULT": f"class_archive_dump:wait={gate}"})
    assert "class archive is written in the background" in first.stderr
    assert not [p for p in archives(directory) if p.suffix == ".jsa"]
    gate.touch()
    archive = wait_for_archive(directory)  # renamed into place once its JVM exited
    size = archive.stat().st_size
    assert archive.name.endswith(f"-{size}.jsa") and size > 1_000_000
    written = archive.stat().st_mtime_ns

    produce_orders(name, range(50, 100))
    run(config, directory)
    assert archives(directory) == [archive]  # mapped, not written again
    assert archive.stat().st_mtime_ns == written

    # corrupted on disk, same size: the JVM's checksum refuses it and starts without it
    archive.chmod(0o644)
    with archive.open("r+b") as f:
        f.seek(size // 2)
        f.write(os.urandom(1 << 20))
    produce_orders(name, range(100, 150))
    run(config, directory)

    assert query(f"SELECT count(*), count(DISTINCT order_id) FROM {name}") == [(150, 150)]
    assert set(ROOT.glob("hs_err_pid*.log")) == crashes_before  # no JVM crashed
