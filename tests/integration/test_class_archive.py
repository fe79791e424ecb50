"""The driver JVM's class-data-sharing archive on a real run (spark/class_archive.py): the
first run's JVM writes it as it exits, the next run maps it, and a run whose archive was
corrupted on disk still succeeds (the JVM checks it and starts without it), with nothing
from the JVM's class-sharing messages in the run's output."""

from __future__ import annotations

import os
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


def run(config: Path, directory: Path):
    proc = run_cli("run", "--config", str(config),
                   env={"PIPELINE_CLASS_ARCHIVE_DIR": str(directory)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the JVM's own log goes to stdout by default: a --json reader's stream
    for stream in (proc.stdout, proc.stderr):
        assert "[cds" not in stream and "fatal error" not in stream, stream[-3000:]
    return proc


def test_a_run_writes_the_archive_the_next_maps_it_and_a_corrupt_one_fails_nothing(
        stack, tmp_path):
    name = unique("cds")
    create_topic(name, partitions=2)
    config = write_config(tmp_path / "p.toml", toml_config(name, [name]))
    init_cli(config)
    directory = tmp_path / "archives"
    crashes_before = set(ROOT.glob("hs_err_pid*.log"))

    produce_orders(name, range(0, 50))
    run(config, directory)
    [archive] = archives(directory)  # renamed into place once the JVM exited: no temp left
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
