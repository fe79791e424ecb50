"""The tree passes the linter the project pins (ruff, [tool.ruff] in pyproject.toml).

A lint error is a defect the suite reports, not a step someone may forget to run."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff() -> str:
    # The venv's ruff (the dev extra pins it); the one on PATH as a fallback.
    beside = Path(sys.executable).with_name("ruff")
    found = str(beside) if beside.exists() else shutil.which("ruff")
    assert found, "ruff is not installed: scripts/stack venv installs the dev extra"
    return found


def test_tree_passes_ruff():
    done = subprocess.run([ruff(), "check", "--no-cache", "--output-format=concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
