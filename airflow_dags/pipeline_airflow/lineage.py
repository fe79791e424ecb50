"""OpenLineage for the pipeline's task runs: the datasets a run reads and writes, named by
OpenLineage's naming spec, and the run's published offsets as a custom run facet.

The OpenLineage provider (apache-airflow-providers-openlineage) calls the operator's
get_openlineage_facets_on_complete / _on_failure (operator.py), which call
``operator_lineage`` here.
Only that imports openlineage: without the provider nothing calls it, and the operator
runs as before (lineage is optional).

  input, one per topic read   namespace kafka://<first bootstrap server host:port>, name
                              the topic
  output                      namespace postgres://<host>:<port>, name
                              <database>.<schema>.<table>
  run facet                   kafkaOffsetPipeline_offsets (FACET_NAME): the job's run id,
                              kind, status, exit code, counts, and per partition the
                              published range [from, until) with its records and rows
"""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import urlsplit

# Custom facets carry the prefix of the project that defines them (OpenLineage spec).
FACET_NAME = "kafkaOffsetPipeline_offsets"

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PROTOCOL = re.compile(r"^[A-Za-z_]+://")  # a listener name some clients accept


def kafka_namespace(servers: str) -> str:
    """kafka://host:port of the first bootstrap server: the spec names a Kafka datasource
    by one server, so runs configured with the servers in another order still match only
    if the first is the same (the config's order is what operators keep stable)."""
    first = _PROTOCOL.sub("", servers.split(",")[0].strip())
    return f"kafka://{first.lower()}"


def postgres_namespace_and_table(url: str, schema: str, table: str) -> tuple[str, str]:
    """postgres://host:port (5432 when the URL has none), <database>.<schema>.<table>."""
    parts = urlsplit(url)
    database = parts.path.lstrip("/") or "postgres"
    return (f"postgres://{(parts.hostname or 'localhost').lower()}:{parts.port or 5432}",
            f"{database}.{schema}.{table}")


def lineage_datasets(doc: dict[str, Any], args: list[str], env: dict[str, str], *,
                     servers: str | None = None, url: str | None = None
                     ) -> dict[str, list[tuple[str, str]]]:
    """(namespace, name) of the topics read and the table written, from the config
    ``doc`` and the job's arguments. ``servers`` and ``url``, when the job's environment
    overrides the config's (a connection's), win, as they do in the job; ``env`` fills the
    config's ${VAR} references."""
    kafka, database = doc.get("kafka", {}), doc.get("database", {})
    servers = servers or kafka["bootstrap_servers"]
    # A kafka.topic_pattern's topics are the run's to find: only what the config names is
    # told (a pattern's tables, when [sink] table names one).
    topics = ([args[args.index("--topic") + 1]] if "--topic" in args
              else kafka.get("topics") or [])
    url = url or _ENV_REF.sub(lambda m: env.get(m.group(1), ""), database["url"])
    sink = doc["sink"]
    tables = [t for t in (
        [_table_of(sink.get("topics", {}).get(topic, {}).get("table", sink["table"]), topic)
         for topic in topics] if topics else [_table_of(sink["table"], None)]) if t]
    outputs = [postgres_namespace_and_table(url, database.get("schema", "public"), t)
               for t in dict.fromkeys(tables)]
    return {"inputs": [(kafka_namespace(servers), t) for t in topics], "outputs": outputs}


def _table_of(template: str, topic: str | None) -> str | None:
    """The table [sink] table (or a topic's own) names for ``topic``: a template's
    placeholders as the job resolves them (pipeline/settings/table_template.py; {topic},
    and for <prefix>.<schema>.<table> names {prefix}, {schema}, {table}); None when it
    names none."""
    parts = topic.split(".") if topic else []
    values = {"topic": topic, **({"prefix": ".".join(parts[:-2]), "schema": parts[-2],
                                  "table": parts[-1]} if len(parts) >= 3 else {})}
    try:
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)] or "", template) or None
    except KeyError:
        return None


_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def published_ranges(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per partition of the job's JSON summary: the range [from, until) it published and
    the records it read there (rows + dead letters + tombstones) and rows it staged."""
    counts = summary.get("per_partition") or {}
    ranges = []
    for r in summary.get("plan") or []:
        done = counts.get(f"{r['topic']}[{r['partition']}]", {})
        ranges.append({"topic": r["topic"], "partition": r["partition"], "from": r["from"],
                       "until": r["until"], "records": sum(done.values()),
                       "rows": done.get("rows", 0), "deadLetters": done.get("dead", 0)})
    return ranges


@functools.cache
def _facet_class() -> type:
    import attrs
    from openlineage.client.facet_v2 import RunFacet

    @attrs.define
    class KafkaOffsetPipelineOffsetsRunFacet(RunFacet):
        """What the job did in this task run: its row in pipeline_runs (runId), kind,
        status, exit code and, per topic partition, the published offset range."""
        runId: int | None = None  # noqa: N815 - OpenLineage facets are camelCase
        kind: str = ""
        status: str = ""
        exitCode: int = 0  # noqa: N815
        exitMeaning: str = ""  # noqa: N815
        recordsRead: int = 0  # noqa: N815
        rowsWritten: int = 0  # noqa: N815
        deadLetters: int = 0  # noqa: N815
        ranges: list[dict[str, Any]] = attrs.field(factory=list)

    return KafkaOffsetPipelineOffsetsRunFacet


def offsets_facet(summary: dict[str, Any] | None, exit_code: int,
                  exit_meaning: str = "") -> Any:
    """The facet of a finished job: from its JSON summary when it succeeded; of a failed
    job only its exit code is told (no ranges: a failed ingest rolled back; a failed
    multi-chunk backfill may have committed chunks before it failed, which
    ``pipeline runs`` lists - the job prints no summary on failure)."""
    summary = summary or {}
    return _facet_class()(
        runId=summary.get("run_id"), kind=summary.get("kind", ""),
        status=summary.get("status") or ("failed" if exit_code else ""),
        exitCode=exit_code, exitMeaning=exit_meaning,
        recordsRead=summary.get("records_read", 0),
        rowsWritten=summary.get("rows_written", 0),
        deadLetters=summary.get("dead_letters", 0), ranges=published_ranges(summary))


def operator_lineage(datasets: dict[str, list[tuple[str, str]]],
                     summary: dict[str, Any] | None, exit_code: int | None,
                     exit_meaning: str = "") -> Any:
    """The provider's OperatorLineage for one task run. No facet when the job never ran
    (e.g. the Spark connection was missing): there is no exit code to tell."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    run_facets = {}
    if exit_code is not None:
        run_facets[FACET_NAME] = offsets_facet(summary, exit_code, exit_meaning)
    return OperatorLineage(
        inputs=[Dataset(namespace=ns, name=name) for ns, name in datasets.get("inputs", [])],
        outputs=[Dataset(namespace=ns, name=name) for ns, name in datasets.get("outputs", [])],
        run_facets=run_facets)
