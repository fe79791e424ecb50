"""Debezium's JDBC sink connector as a CDC peer: what a user replicating a database with
Debezium would run instead of this pipeline. Given the shop's change topics already filled
(scripts/cdc up, then python -m pipeline.sample_shop run), it

  1. empties the replica schema and registers the sink on the chain's Connect worker, as a
     user would configure it: upsert by the record key, deletes and truncates applied,
     basic schema evolution, tables named after the source tables;
  2. times it: events per second until its consumer group has committed the end of every
     topic (as the topics stood when it started), its start included (the worker commits a
     sink's offsets every second: scripts/cdc sets offset.flush.interval.ms=1000);
  3. meanwhile polls the replica with the shop's invariant reader (sample_shop check): each
     broken invariant a poll sees is a source transaction the sink applied in part;
  4. compares the replica with the source, row by row (sample_shop compare).

    .venv/bin/python -m bench.peers.debezium_jdbc [--prefix shop_json] [--schema peer_debezium]

Prints one JSON report. The connector is deleted at the end (--keep leaves it running).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request

NAME = "peer-debezium-jdbc"


def sink_config(prefix: str, jdbc_url: str, user: str, schema: str) -> dict:
    """The sink as its documentation has a user replicate a database: the data topics of
    the prefix (not its transaction topic), each to the table of the source table's name."""
    topics = rf"{re.escape(prefix)}\.public\..*"
    return {
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": "1",
        "topics.regex": topics,
        "connection.url": jdbc_url,
        "connection.username": user,
        "connection.password": "",
        "insert.mode": "upsert",
        "primary.key.mode": "record_key",
        "delete.enabled": "true",
        "truncate.enabled": "true",
        "schema.evolution": "basic",
        # <prefix>.public.<table> -> <schema>.<table>
        "transforms": "route",
        "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.route.regex": topics.replace(r"\..*", r"\.(.*)"),
        "transforms.route.replacement": "$1",
        "collection.name.format": f"{schema}.${{topic}}",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "true",
    }


def rest(connect_url: str, method: str, path: str, body: dict | None = None):
    req = urllib.request.Request(f"{connect_url}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def delete_connector(connect_url: str, name: str, timeout: float = 60) -> None:
    code, _ = rest(connect_url, "DELETE", f"/connectors/{name}")
    deadline = time.monotonic() + timeout
    while code in (200, 204) and time.monotonic() < deadline:
        code, _ = rest(connect_url, "GET", f"/connectors/{name}")
        if code == 404:
            return
        time.sleep(0.25)


def forget_group(admin, group: str, timeout: float = 60) -> None:
    """Deletes the sink's consumer group, so that it starts from the topics' beginning; a
    deleted connector's task may hold it a moment longer."""
    from confluent_kafka import KafkaException
    from confluent_kafka.error import KafkaError

    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.delete_consumer_groups([group], request_timeout=10)[group].result()
            return
        except KafkaException as e:
            code = e.args[0].code()
            if code == KafkaError.GROUP_ID_NOT_FOUND:
                return
            if code != KafkaError.NON_EMPTY_GROUP or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def data_topics(admin, prefix: str) -> list[str]:
    md = admin.list_topics(timeout=10)
    return sorted(t for t in md.topics if t.startswith(f"{prefix}.public."))


def end_offsets(bootstrap: str, topics: list[str]) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        md = c.list_topics(timeout=10)
        return {(t, p): c.get_watermark_offsets(TopicPartition(t, p), timeout=10)
                for t in topics for p in md.topics[t].partitions}
    finally:
        c.close()


def committed(admin, group: str, parts) -> dict:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    req = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in parts])
    res = admin.list_consumer_group_offsets([req], request_timeout=10)[group].result()
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions}


def connector_failure(connect_url: str, name: str) -> str | None:
    code, st = rest(connect_url, "GET", f"/connectors/{name}/status")
    if code != 200:
        return None
    for t in [st["connector"], *st["tasks"]]:
        if t["state"] == "FAILED":
            return (t.get("trace") or "FAILED").splitlines()[0]
    return None


def run(connect_url: str, bootstrap: str, prefix: str, source_url: str, replica_url: str,
        schema: str, poll: float, timeout: float, keep: bool) -> dict:
    import psycopg
    from confluent_kafka.admin import AdminClient
    from sqlalchemy.engine import make_url

    from pipeline.sample_shop import watch
    from pipeline.sample_shop_compare import compare

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = data_topics(admin, prefix)
    if not topics:
        raise SystemExit(f"no topics {prefix}.public.*: run scripts/cdc up and the workload "
                         "(python -m pipeline.sample_shop run) first")
    delete_connector(connect_url, NAME)
    forget_group(admin, f"connect-{NAME}")
    with psycopg.connect(replica_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    ends = end_offsets(bootstrap, topics)
    events = sum(hi - lo for lo, hi in ends.values())
    u = make_url(replica_url)
    config = sink_config(prefix, f"jdbc:postgresql://{u.host}:{u.port or 5432}/{u.database}",
                         u.username or "postgres", schema)

    stop = threading.Event()
    reader: dict = {}

    def read_replica():
        try:
            reader.update(watch(replica_url, schema, poll, stop).summary())
        except Exception as e:  # noqa: BLE001 - reported with the run, not lost in the thread
            reader["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=read_replica, daemon=True)
    t0 = time.perf_counter()
    code, body = rest(connect_url, "PUT", f"/connectors/{NAME}/config", config)
    if code not in (200, 201):
        raise SystemExit(f"Connect refused the sink's config (HTTP {code}): {body}")
    thread.start()
    done = first = None
    try:
        while time.perf_counter() - t0 < timeout:
            have = committed(admin, f"connect-{NAME}", ends)
            if first is None and any(o > lo for tp, (lo, _) in ends.items()
                                     if (o := have.get(tp, -1)) >= 0):
                first = time.perf_counter() - t0
            if all(have.get(tp, -1) >= hi for tp, (_, hi) in ends.items()):
                done = time.perf_counter() - t0
                break
            failure = connector_failure(connect_url, NAME)
            if failure:
                raise SystemExit(f"the sink failed: {failure} (Connect's log has the rest)")
            time.sleep(0.25)
    finally:
        stop.set()
        thread.join(timeout=60)
        if not keep:
            delete_connector(connect_url, NAME)
    if done is None:
        raise SystemExit(f"the sink had not consumed the topics' end within {timeout} s")
    if "error" in reader:
        raise SystemExit(f"the invariant reader failed: {reader['error']}")
    diffs = compare(source_url, replica_url, schema)
    return {"peer": "debezium-jdbc", "topics": len(topics), "events": events,
            "seconds": round(done, 3), "events_per_second": round(events / done, 1),
            # its start (task, JDBC pool, Hibernate) ends about when it first commits
            "first_commit_seconds": round(first, 3) if first is not None else None,
            "reader": reader, "torn_polls": reader.get("broken_polls"),
            "compare": {"equal": all(d.equal for d in diffs),
                        "tables": {d.table: {**vars(d), "equal": d.equal} for d in diffs}}}


def main(argv=None) -> None:
    port = os.environ.get("PG_PORT", "5433")
    p = argparse.ArgumentParser(prog="python -m bench.peers.debezium_jdbc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connect", default=os.environ.get(
        "CONNECT_URL", f"http://127.0.0.1:{os.environ.get('CONNECT_PORT', '8083')}"))
    p.add_argument("--bootstrap", default=os.environ.get(
        "PIPELINE_TEST_BOOTSTRAP_SERVERS", f"127.0.0.1:{os.environ.get('KAFKA_PORT', '9092')}"))
    p.add_argument("--prefix", default="shop_json", help="the source connector's topic prefix")
    p.add_argument("--source", default=os.environ.get(
        "CDC_SOURCE_URL",
        f"postgresql://postgres@127.0.0.1:{os.environ.get('PG_SOURCE_PORT', '5434')}/shop"))
    p.add_argument("--replica", default=f"postgresql://postgres@127.0.0.1:{port}/pipeline",
                   help="the database the sink writes (the stack's Postgres)")
    p.add_argument("--schema", default="peer_debezium", help="the replica's schema (emptied)")
    p.add_argument("--poll", type=float, default=0.2, help="the invariant reader's interval")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--keep", action="store_true", help="leave the connector running")
    a = p.parse_args(argv)
    print(json.dumps(run(a.connect, a.bootstrap, a.prefix, a.source, a.replica, a.schema,
                         a.poll, a.timeout, a.keep), default=str))


if __name__ == "__main__":
    main()
