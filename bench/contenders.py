"""The contenders: this pipeline through its CLI (json or raw sink, any [spark] or
[sink] keys), and the peers a user would pick instead (bench/peers/*), each run as its own
process on the same topic into a fresh table and verified against the generator."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from bench.harness import BOOTSTRAP, DB, PY, ROOT, STAMP, drop, expected, produce, timed
from bench.peers.verify import checksum

# name -> (label, command builder); {topic} {table} {config} are filled in per run.
PEERS = {
    "single_process": "one Python process: confluent-kafka consume(num_messages) + orjson + "
                      "binary COPY, offsets in the same transaction",
    "sss_jdbc": "Spark Structured Streaming AvailableNow, from_json, foreachBatch -> JDBC",
    "sss_arrow": "Spark Structured Streaming AvailableNow, from_json, foreachBatch -> "
                 "mapInArrow + CSV COPY",
    "textbook": "the textbook loop: poll one, json.loads, executemany per 1,000, "
                "DB commit then Kafka commit",
}
PIPELINE_JSON = "**this pipeline, json sink** (`pipeline run`)"
PIPELINE_RAW = "this pipeline, raw sink (`pipeline run`)"
BIG_ONLY = ("pipeline_json", "sss_jdbc", "sss_arrow")  # what runs at sizes >= 10M


LABELS = {"pipeline_json": PIPELINE_JSON, "pipeline_raw": PIPELINE_RAW, **PEERS}
SHORT = {"pipeline_json": "this pipeline, json", "pipeline_raw": "this pipeline, raw",
         "single_process": "single Python process", "sss_jdbc": "Spark SS + JDBC",
         "sss_arrow": "Spark SS + Arrow/COPY", "textbook": "textbook loop"}


def pipeline_config(path: Path, name: str, topic: str, fmt: str, spark: str = "",
                    mode: str = "", tables: str = "", more_columns: str = "") -> None:
    """``spark``: a [spark] section (e.g. a cluster master); none = the default local[2].
    ``fmt`` json or avro: the orders' columns are declared (avro: ``tables`` holds its
    [schema_registry]).
    ``mode``: more [sink] keys (a sink mode and its key), ``tables``: sub-tables of [sink]
    after the columns (e.g. [sink.aggregates]); ``more_columns``: declared columns beyond
    the orders' four (e.g. a transform's derived ones)."""
    columns = ('[sink.columns]\norder_id = "long not null"\ncustomer = "string not null"\n'
               'amount = "decimal(12,2)"\nplaced_at = "timestamp"\n'
               f'{more_columns}') if fmt in ("json", "avro") else ""
    path.write_text(
        f'[pipeline]\nname = "{name}"\n[kafka]\nbootstrap_servers = "{BOOTSTRAP}"\n'
        f'topics = ["{topic}"]\nmax_records_per_partition = 0\nmax_records_per_run = 0\n'
        f'[database]\nurl = "{DB}"\n[sink]\nformat = "{fmt}"\ntable = "{name}"\n'
        f'max_bad_records = 0\n{mode}{columns}{tables}{spark}')


def run_pipeline(fmt: str, topic: str, n: int, run: int, env: dict, *, spark: str = "",
                 tag: str = "", root: Path = ROOT, sink: str = "", more_columns: str = "",
                 tables: str = "", check=None) -> tuple[float, float, dict]:
    """``root``: the checkout whose pipeline runs (its own package first on the path);
    ``sink``: more [sink] keys (e.g. a transform), ``more_columns`` more declared columns,
    ``tables`` more top-level tables (e.g. an avro sink's [schema_registry]);
    ``check(table, n)``: the verification of a table that is not the orders as produced
    (e.g. a transform's output), else the table must hold every order."""
    name = f"b_{fmt}{tag}_{STAMP}_{n}_{run}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.toml"
        pipeline_config(config, name, topic, fmt, spark, mode=sink, tables=tables,
                        more_columns=more_columns)
        cli = [PY, "-m", "pipeline"]
        subprocess.run([*cli, "init-db", "--config", str(config)], env=env, check=True,
                       capture_output=True, cwd=root)
        seconds, rss, out = timed([*cli, "run", "--config", str(config), "--json"], env,
                                  cwd=root)
    summary = json.loads(out)
    if check is not None:  # records_read counts rows and dead letters: not what it filtered
        assert sum(r["until"] - r["from"] for r in summary["plan"]) == n, summary
        check(name, n)
    elif fmt in ("json", "avro"):  # the same orders, whichever way they were encoded
        assert summary["records_read"] == n, summary
        got = checksum(DB, name)
        assert tuple(got[:3]) == expected(n) and got[4] == n, (name, got, expected(n))
    else:
        assert summary["records_read"] == n, summary
        with psycopg.connect(DB) as conn:
            count, distinct = conn.execute(
                f'SELECT count(*), count(DISTINCT ("partition", "offset")) FROM {name}'
            ).fetchone()
        assert count == n and distinct == n, (name, count, distinct)
    drop(name)
    return seconds, rss, summary["timings"]


def run_peer(peer: str, topic: str, n: int, run: int, env: dict,
             check=None) -> tuple[float, float]:
    """``check(table, n)``: as for run_pipeline."""
    table = f"b_{peer}_{STAMP}_{n}_{run}"
    seconds, rss, out = timed([PY, "-m", f"bench.peers.{peer}", "--topic", topic,
                               "--table", table], env)
    reported = json.loads(out.strip().splitlines()[-1])
    if check is not None:
        check(table, n)
    else:
        got = checksum(DB, table)
        assert reported["rows"] == n and tuple(got[:3]) == expected(n) and got[4] == n, \
            (peer, reported, got, expected(n))
    drop(table)
    return seconds, rss


IDENTITY = 'transform = "tests.integration.transforms.orders:identity"\n'


def class_archives(env: dict) -> None:
    """One small untimed run of the built-in path and one with a transform before any
    contender, so that every timed run maps the driver JVM's class archive
    (pipeline/spark/class_archive.py) as a scheduled pipeline's runs do; otherwise the
    first timed run of each kind on a fresh machine pays for writing it (~24 CPU-s).
    Cheap once the archives exist (two runs of 1,000 records)."""
    topic = f"bench_{STAMP}_archives"
    produce(topic, 1000)
    for tag, sink in (("_archive", ""), ("_archive_t", IDENTITY)):
        run_pipeline("json", topic, 1000, 0, env, tag=tag, sink=sink)
        drop(f"b_json{tag}_{STAMP}_1000_0")


def empty_run(env: dict) -> float:
    """A run with nothing new: no Spark. Timed through the CLI, as a scheduler starts it."""
    topic = f"bench_{STAMP}_empty"
    produce(topic, 1000)
    name = f"b_empty_{STAMP}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.toml"
        pipeline_config(config, name, topic, "json")
        cli = [PY, "-m", "pipeline"]
        subprocess.run([*cli, "init-db", "--config", str(config)], env=env, check=True,
                       capture_output=True, cwd=ROOT)
        timed([*cli, "run", "--config", str(config)], env)
        seconds, _, _ = timed([*cli, "run", "--config", str(config), "--json"], env)
    drop(name)
    return seconds


def init_db(config: Path, env: dict) -> None:
    """``pipeline init-db``; retried when it exits 75 (transient: e.g. a lock timeout while
    another pipeline on this database holds its tables), else its stderr is shown."""
    for attempt in range(3):
        done = subprocess.run([PY, "-m", "pipeline", "init-db", "--config", str(config)],
                              env=env, capture_output=True, text=True, cwd=ROOT)
        if done.returncode == 0:
            return
        print(f"bench: init-db exited {done.returncode}: {done.stderr.strip()[-500:]}",
              flush=True)
        if done.returncode != 75 or attempt == 2:
            raise SystemExit(f"bench: init-db failed ({done.returncode})")
        time.sleep(5)
