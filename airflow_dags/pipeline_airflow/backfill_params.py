"""The backfill DAG's params and the checks their JSON schema cannot express. A run's params
are checked twice before anything is submitted: by the schema when the run is created,
then by ``backfill_args`` in the DAG's first task, which fails at once (no retry) saying
what to change."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException

OFFSET = {"type": ["null", "integer"], "minimum": 0}
TIME = {"type": ["null", "string"], "format": "date-time"}
OTHER_END = {"from_offset": "to_offset", "to_offset": "from_offset",
             "from_time": "to_time", "to_time": "from_time"}


def backfill_params() -> dict[str, Param]:
    return {
        "topic": Param(type="string", pattern=r"^[A-Za-z0-9._-]{1,249}$",
                       description="Topic to re-read (required)"),
        "partitions": Param([], type="array", items={"type": "integer", "minimum": 0},
                            uniqueItems=True, description="Partitions; empty = all"),
        "from_offset": Param(None, **OFFSET, description="First offset to read"),
        "to_offset": Param(None, **OFFSET, description="Offset to stop before (exclusive)"),
        "from_time": Param(None, **TIME, description="Or: from this time (no zone = UTC)"),
        "to_time": Param(None, **TIME, description="Or: stop before this time (exclusive)"),
        "reprocess": Param(False, type="boolean",
                           description="Overwrite existing rows instead of keeping them"),
    }


def invalid(reason: str) -> AirflowFailException:
    return AirflowFailException(f"invalid backfill params: {reason}")


def instant(params: dict[str, Any], key: str) -> datetime:
    """As the CLI reads it: ISO 8601, a time without a zone is UTC."""
    try:
        parsed = datetime.fromisoformat(params[key])
    except ValueError:
        raise invalid(f"{key} = {params[key]!r} is not an ISO 8601 time, e.g. "
                      "2025-01-31T00:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def backfill_args(config: Path, params: dict[str, Any]) -> list[str]:
    """The job's arguments, after the checks JSON schema cannot express (one range kind,
    both ends, from before to, the config on this worker); AirflowFailException if not."""
    if not config.is_file():
        raise invalid(f"config file {config} not found on this worker")
    offsets = [k for k in ("from_offset", "to_offset") if params[k] is not None]
    times = [k for k in ("from_time", "to_time") if params[k]]
    if offsets and times:
        raise invalid(f"give offsets or times, not both (got {', '.join(offsets + times)})")
    if not offsets and not times:
        raise invalid("give a range: from_offset and to_offset, or from_time and to_time")
    if len(offsets + times) == 1:
        given = (offsets + times)[0]
        raise invalid(f"{given} is set but {OTHER_END[given]} is not; give both ends")
    args = ["backfill", "--config", str(config), "--topic", params["topic"]]
    for p in params["partitions"]:
        args += ["--partition", str(p)]
    if offsets:
        if params["from_offset"] >= params["to_offset"]:
            raise invalid(f"from_offset {params['from_offset']} must be below to_offset "
                          f"{params['to_offset']} (the range is [from, to))")
        args += ["--from-offset", str(params["from_offset"]),
                 "--to-offset", str(params["to_offset"])]
    else:
        if instant(params, "from_time") >= instant(params, "to_time"):
            raise invalid(f"from_time {params['from_time']} must be before to_time "
                          f"{params['to_time']} (the range is [from, to))")
        args += ["--from-time", params["from_time"], "--to-time", params["to_time"]]
    if params["reprocess"]:
        args.append("--reprocess")
    return args
