"""The sample shop replicated by this pipeline (docs/cdc.md): one pipeline reading every
change topic of the shop into a replica schema, all tables in one transaction per run; the
wait for the chain to have delivered a workload's events; and the runs repeated until the
replica has caught up with the topics, as a scheduler would start them, optionally
SIGKILLed at random moments (the chain tests, the soak). ``scripts/bench --cdc`` times it
against Debezium's JDBC sink (bench/cdc.py).

``config`` is pure; ``delivered`` reads Kafka; ``Runs`` starts the CLI.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

TABLES = ("accounts", "carts", "customers", "order_lines", "orders")
# The shop's columns (conf/examples/cdc/shop.sql) as a route declares them; orders.channel,
# which the workload adds mid-stream, is declared from the start (NULL until it is sent).
COLUMNS = {
    "customers": {"id": "long not null", "name": "string", "email": "string",
                  "profile": "string", "prefs": "jsonb", "created_at": "timestamp",
                  "updated_at": "timestamp"},
    "accounts": {"id": "long not null", "customer_id": "long", "balance": "decimal",
                 "opened_on": "date", "updated_at": "timestamp"},
    "orders": {"id": "long not null", "customer_id": "long", "status": "string",
               "total": "decimal(14,2)", "line_count": "int", "placed_at": "timestamp",
               "updated_at": "timestamp", "channel": "string"},
    "order_lines": {"order_id": "long not null", "line_no": "int not null", "sku": "string",
                    "qty": "int", "unit_price": "decimal(10,2)", "amount": "decimal(12,2)"},
    "carts": {"id": "long not null", "customer_id": "long", "sku": "string", "qty": "int",
              "added_at": "timestamp"},
}
KEYS = {"order_lines": ("order_id", "line_no")}


def data_topics(prefix: str, tables: tuple[str, ...] = TABLES) -> list[str]:
    return [f"{prefix}.public.{t}" for t in tables]


def config(name: str, bootstrap: str, database_url: str, schema: str, *,
           prefix: str = "shop_json", transactions: bool = False,
           records_per_partition: int = 0, tables: tuple[str, ...] = TABLES) -> str:
    """The pipeline's TOML: each topic into the table of its source table's name in
    ``schema``, upserts and deletes by the source key, truncates applied; ``transactions``:
    only whole source transactions (Debezium's <prefix>.transaction topic);
    ``records_per_partition``: a run's budget per partition (0: the default); ``tables``:
    the shop's tables replicated (all unless told)."""
    def inline(cols: dict[str, str]) -> str:
        return "{ " + ", ".join(f'{c} = "{t}"' for c, t in cols.items()) + " }"

    routes = "".join(
        f'[sink.topics."{prefix}.public.{t}"]\nkey = {list(KEYS.get(t, ("id",)))!r}\n'
        f"columns = {inline(COLUMNS[t])}\n" for t in tables)
    budget = (f"max_records_per_partition = {records_per_partition}\n"
              if records_per_partition else "")
    tx = f'transactions = "{prefix}.transaction"\n' if transactions else ""
    return (f'[pipeline]\nname = "{name}"\n'
            f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
            f"topics = {data_topics(prefix, tables)!r}\n"
            f"timeout_seconds = 30\n{budget}"
            f'[database]\nurl = "{database_url}"\nschema = "{schema}"\n'
            f'[sink]\nformat = "json"\nenvelope = "debezium"\nmode = "upsert"\n'
            f'table = "{{table}}"\nkey = ["id"]\ntruncate = "apply"\nmax_bad_records = 0\n{tx}'
            f'[sink.columns]\nid = "long not null"\n{routes}'
            '[spark]\nmaster = "local[2]"\n')


def _end_value(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    v = json.loads(raw)
    return v.get("payload", v) if isinstance(v, dict) and "schema" in v else v


def delivered(bootstrap: str, prefix: str, last_txid: int, timeout: float,
              decode=None) -> dict:
    """Waits until the chain has written the workload's last transaction (its END in
    <prefix>.transaction, ``last_txid`` its source.txId) and every data event the ENDs count;
    returns {(topic, partition): end offset} of the data topics then. ``decode(message)``:
    an event's value as a dict (the JSON connector's unless told). Kafka Connect writes
    again after a restart: an END and a change count once (by transaction, and by the
    change's order in its table); an END written again may come with only part of its
    changes (Debezium resumes inside a transaction)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topics = [*data_topics(prefix), f"{prefix}.transaction"]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"shop-replica-{os.getpid()}",
                  "enable.auto.commit": False, "fetch.max.bytes": 64 << 20})
    deadline = time.monotonic() + timeout
    counted: dict[str, int] = {}  # tx -> its END's event count
    changes: set[tuple] = set()  # (topic, tx, data_collection_order)
    last = False
    value = decode or (lambda m: _end_value(m.value()))
    try:
        while not c.list_topics(timeout=10).topics.keys() >= set(topics):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the topics {topics} were not all there in {timeout:.0f} s")
            time.sleep(1)
        # From each topic's earliest offset (0 may be deleted: a reset would skip to the end).
        c.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in topics])
        while not (last and len(changes) >= sum(counted.values())):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{prefix}: the workload's events did not all arrive within {timeout:.0f} "
                    f"s (END of txId {last_txid} seen: {last}; {len(changes)} of "
                    f"{sum(counted.values())} data events): see $STACK_DIR/connect/connect.log")
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is not None or m.value() is None:
                    continue
                v = value(m)
                if m.topic().endswith(".transaction"):
                    if v and v.get("status") == "END":
                        tx = v["id"].split(":")[0]
                        counted.setdefault(tx, v["event_count"])
                        last = last or tx == str(last_txid)
                elif v and v.get("transaction"):
                    t = v["transaction"]
                    changes.add((m.topic(), t["id"].split(":")[0], t["data_collection_order"]))
        return {(t, 0): c.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1]
                for t in data_topics(prefix)}
    finally:
        c.close()


def committed(database_url: str, schema: str, name: str) -> dict:
    """The pipeline's stored next offsets: {(topic, partition): offset}."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(database_url, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass(%s)",
                            (f'"{schema}".pipeline_offsets',)).fetchone()[0]:
            return {}
        return {(t, p): o for t, p, o in conn.execute(sql.SQL(
            'SELECT topic, "partition", next_offset FROM {}.pipeline_offsets WHERE '
            "pipeline = %s").format(sql.Identifier(schema)), (name,))}


@dataclass
class Runs:
    """``pipeline run --json`` of ``config_path`` again and again until the stored offsets
    reach ``ends``; with ``kill_chance`` > 0 a run is SIGKILLed (its whole process group:
    driver, JVM, Python workers) after a random moment of up to ``kill_within`` seconds;
    ``kill_one``: until a run has been killed, every run is killed at such a moment (a test of
    kills must kill whatever the dice say)."""

    config_path: str
    database_url: str
    schema: str
    name: str
    env: dict
    kill_chance: float = 0.0
    kill_within: float = 20.0
    seed: int = 1
    kill_one: bool = False
    log: list[dict] = field(default_factory=list)  # per run: exit code, seconds, summary

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def kill_at(self) -> float | None:
        """When the next run is killed (seconds after its start), or None."""
        dice = self.rng.random() < self.kill_chance
        if dice or (self.kill_one and not any(r["killed"] for r in self.log)):
            return self.rng.uniform(0.5, self.kill_within)
        return None

    def until_caught_up(self, ends: dict, timeout: float, between=None) -> float:
        """Seconds from the first run's start to the end of the run that caught up;
        ``between(i)`` is called after run i (e.g. a fault elsewhere)."""
        t0 = time.perf_counter()
        while not self.caught_up(ends):
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{self.name}: not caught up within {timeout:.0f} s: "
                                   f"stored {committed(self.database_url, self.schema, self.name)}"
                                   f", ends {ends}; runs {self.log[-3:]}")
            self.log.append(self.run_once(self.kill_at()))
            if between is not None:
                between(len(self.log))
        return time.perf_counter() - t0

    def caught_up(self, ends: dict) -> bool:
        have = committed(self.database_url, self.schema, self.name)
        return all(have.get(tp, 0) >= end for tp, end in ends.items())

    def run_once(self, kill_at: float | None) -> dict:
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--config",
                                 self.config_path, "--json"], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        killed = False
        try:
            out, err = proc.communicate(timeout=kill_at)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            killed = True
        entry = {"code": proc.returncode, "killed": killed,
                 "seconds": round(time.perf_counter() - t, 2)}
        if killed:
            return entry
        if proc.returncode not in (0, 75):  # transient: the next run retries, as a DAG's would
            raise RuntimeError(f"{self.name}: pipeline run exited {proc.returncode}:\n"
                               f"{err[-3000:]}")
        try:
            summary = json.loads(out)
            entry.update(records=summary.get("records_read"), status=summary.get("status"),
                         timings=summary.get("timings", {}))
        except ValueError:
            entry["stderr"] = err[-500:]
        return entry
