"""The wheel carries every package of pipeline/: pyproject.toml lists them one by one
([tool.setuptools] packages), and a folder missing there is missing from an installed
pipeline (tests/integration/test_wheel.py runs the wheel, but only the json format's
modules)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_lists_every_package_folder_of_pipeline():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "pipeline").rglob("__init__.py")}
    assert listed == folders
