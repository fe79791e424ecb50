"""The pipelines the DAGs are built for: every *.toml in PIPELINE_CONFIG_DIR (default
$PIPELINE_HOME/conf), named by its [pipeline] name, with its [airflow] table checked by the
job's own model (job_package.py). Only these files are read when the DAGs are parsed.

A config with a mistake keeps its DAGs, named after its file when its name cannot be
used, and carries the mistake as a problem: its runs fail at once saying what to fix
(operator.py), rather than the pipeline vanishing from the UI or taking the other
pipelines' DAGs down with it. Two configs naming one pipeline (they would share its
offsets and locks) are a problem of both.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_airflow import job_package
from pipeline_airflow.deployment import job_home

log = logging.getLogger(__name__)
_DAG_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# Airflow's DAG ids have at most 250 characters: "<name>.backfill" must fit.
MAX_NAME = 240


@dataclass(frozen=True)
class PipelineConfig:
    name: str  # the config's [pipeline] name, made safe for a DAG id; else its file's stem
    path: Path
    airflow: dict[str, Any]  # the [airflow] keys it sets, checked ({} if it has a mistake)
    problems: tuple[str, ...] = ()  # what fails its runs until the file is fixed


def config_dir() -> Path:
    return Path(os.environ.get("PIPELINE_CONFIG_DIR") or job_home() / "conf")


def pipeline_configs(folder: Path | None = None) -> list[PipelineConfig]:
    """One PipelineConfig per *.toml in ``folder``, in file name order, names unique. A
    folder that does not exist is an error (the DAG files' import error): silence would
    hide every pipeline."""
    folder = folder or config_dir()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"PIPELINE_CONFIG_DIR={folder} is not a folder: point it at the folder of "
            "pipeline configs (*.toml), the same on the dag-processor and the workers")
    read = [(path, *read_config(path)) for path in sorted(folder.glob("*.toml"))]
    claims = Counter(name for _, name, _, _ in read if name)
    taken = {name for name, n in claims.items() if n == 1}
    configs = []
    for path, name, table, problems in read:
        if name and claims[name] > 1:
            others = ", ".join(str(p) for p, n, _, _ in read if n == name)
            problems = [*problems, f"pipeline configs {others} all name the pipeline "
                                   f"{name!r}: give each pipeline its own name"]
            name = None
        if not name:  # its DAGs are named after the file
            name = _DAG_ID_UNSAFE.sub("_", path.stem)[:MAX_NAME]
            while name in taken:
                name += "_"
            taken.add(name)
        for problem in problems:
            log.warning("%s; its DAGs fail until that is fixed", problem)
        configs.append(PipelineConfig(name, path, table, tuple(problems)))
    return configs


def read_config(path: Path) -> tuple[str | None, dict[str, Any], list[str]]:
    """The config's DAG name (None if it has none to use), its checked [airflow] table, and
    what is wrong with either."""
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return None, {}, [f"pipeline config {path} cannot be read ({e}): fix the file"]
    problems = []
    section = doc.get("pipeline")
    name = section.get("name") if isinstance(section, dict) else None
    if not isinstance(name, str) or not name.strip():
        problems.append(f"pipeline config {path} has no [pipeline] name: add one, e.g. "
                        f'name = "{path.stem}"')
        name = None
    elif len(name) > MAX_NAME:
        problems.append(f"pipeline config {path}: [pipeline] name is longer than {MAX_NAME} "
                        "characters, too long for the DAG ids: shorten it")
        name = None
    else:
        name = _DAG_ID_UNSAFE.sub("_", name)
    table: dict[str, Any] = {}
    if "airflow" in doc:
        try:
            table = job_package.airflow_table(doc["airflow"])
        except job_package.AirflowTableError as e:
            problems.append(f"pipeline config {path}: {e}")
        except job_package.JobPackageUnavailable as e:
            problems.append(f"the [airflow] table of {path} cannot be checked: {e}")
    return name, table, problems
