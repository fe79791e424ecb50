"""A pipeline's settings from its TOML file and the environment: the PIPELINE__<TABLE>__<KEY>
variables laid over the file (env.py), the tables checked by their models (pydantic), the
run's Settings built; every problem one ConfigError line naming the key (and the variable,
when the environment set it)."""

from __future__ import annotations

import logging
import os
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.errors import ConfigError
from pipeline.settings import env as env_overrides
from pipeline.settings.document import ConfigFile, Settings
from pipeline.settings.messages import config_error

_WARNED: set[str] = set()  # a process loads its config more than once: warn once
log = logging.getLogger("pipeline")


def parse_settings(doc: dict[str, Any], source: str = "<dict>",
                   environ: dict[str, str] | None = None) -> Settings:
    """``doc`` with the PIPELINE__<TABLE>__<KEY> environment variables overlaid, validated;
    an error names the variable a key came from."""
    env = os.environ if environ is None else environ
    found = env_overrides.overrides(env)
    for o in env_overrides.replaced(doc, found):  # the key and variable, never the value
        line = f"{o.key} is set by the environment ({o.variable}), not by {source}"
        if line not in _WARNED:
            _WARNED.add(line)
            log.info("config: %s", line, extra={"event": "config.override", "key": o.key,
                                                "variable": o.variable, "source": source})
    doc = env_overrides.apply(doc, found)
    old, warnings = env_overrides.legacy(doc, env, found, source)
    for line in warnings:
        if line not in _WARNED:
            _WARNED.add(line)
            print(line, file=sys.stderr)
    found += old
    try:
        return _validate(env_overrides.apply(doc, old), source, env)
    except ConfigError as e:
        raise env_overrides.blame(e, found) from None


def _validate(doc: dict[str, Any], source: str, env: dict[str, str]) -> Settings:
    try:
        file = ConfigFile.model_validate(doc)
    except ValidationError as e:
        raise config_error(e, ConfigFile) from None
    return file.settings(source, env)


def load_settings(path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found; pass --config conf/local.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    return parse_settings(doc, str(path), environ)


def with_overrides(settings: Settings, **kafka_changes: Any) -> Settings:
    return replace(settings, kafka=replace(settings.kafka, **kafka_changes))
