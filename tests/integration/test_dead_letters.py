"""pipeline dead-letters list|replay on the real stack: 600 dead letters from a column
declared long that receives decimals; the config (and the table) fixed to double; a replay
SIGKILLed inside its transaction leaves all as it was; the replay writes exactly the rows
the records give, moves the dead letters, keeps what still fails with its new reason; a
second replay changes nothing; a transform sink is refused (exit 2); a running ingest's lock
makes it wait its turn (exit 75); verify is still clean after the replay. Upsert and aggregate
sinks: the replay lands through the sink's merge (an older record never replaces a newer row,
a key without a row gets one; totals count each replayed record once), checked against a
recomputation from what was produced. A few ingests (Spark, in-process); the rest is the
driver."""

from __future__ import annotations

import json
import signal
from dataclasses import replace

import psycopg
import pytest

from pipeline.cli import main as cli_main
from pipeline.config import Column
from pipeline.driver.job import run_ingest
from pipeline.driver.replay import run_replay
from pipeline.errors import EXIT_CONFIG, EXIT_OK, ConflictError
from pipeline.store import Store
from pipeline.store.dead_letters import DeadLetterFilter
from tests.helpers import TEST_DB_URL, create_topic, make_settings, produce, query, run_cli, unique
from tests.integration._reliability import init_db

GOOD, DECIMAL, WORDS = 400, 600, 20  # per kind of record, over 2 partitions
COLUMNS = {"order_id": "long not null", "customer": "string not null", "qty": "long"}


def doc(i: int, qty) -> bytes:
    return json.dumps({"order_id": i, "customer": f"c{i}", "qty": qty}).encode()


def records() -> list[tuple[int, bytes]]:
    """(order_id, value): good, then decimals (wrong_type for long, fine as double), then
    words (wrong_type either way), interleaved so that every partition holds each kind."""
    out = [(i, doc(i, i)) for i in range(GOOD)]
    out += [(i, doc(i, i + 0.5)) for i in range(GOOD, GOOD + DECIMAL)]
    out += [(i, doc(i, "many")) for i in range(GOOD + DECIMAL, GOOD + DECIMAL + WORDS)]
    return sorted(out, key=lambda r: r[0] % 7)  # mixed order


def config_text(s, columns: dict[str, str]) -> str:
    cols = "".join(f'{k} = "{v}"\n' for k, v in columns.items())
    return (f'[pipeline]\nname = "{s.name}"\n[kafka]\nbootstrap_servers = '
            f'"{s.kafka.bootstrap_servers}"\ntopics = ["{s.kafka.topics[0]}"]\n'
            f'timeout_seconds = 10\n[database]\nurl = "{s.database_url}"\n[sink]\n'
            f'format = "json"\ntable = "{s.sink.table}"\nmax_bad_records = -1\n'
            f"[sink.columns]\n{cols}")


def as_owner(statement: str) -> None:
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(statement)


def fixed(s):
    """The settings with qty declared double: the fix."""
    return replace(s, sink=replace(s.sink, columns=tuple(
        Column(n, t.replace(" not null", ""), t.endswith("not null"))
        for n, t in {**COLUMNS, "qty": "double"}.items())))


def state(s) -> tuple:
    """Everything a replay may change: the rows, the dead letters, the replayed ones."""
    return (query(f'SELECT topic, "partition", "offset", order_id, customer, qty, run_id '
                  f'FROM {s.sink.table} ORDER BY 1, 2, 3'),
            query('SELECT "partition", "offset", error_type, error_message, run_id, failed_at '
                  "FROM pipeline_dead_letters WHERE pipeline = %s ORDER BY 1, 2", (s.name,)),
            query('SELECT "partition", "offset", replayed_run_id FROM '
                  "pipeline_dead_letters_replayed WHERE pipeline = %s ORDER BY 1, 2",
                  (s.name,)))


@pytest.fixture(scope="module")
def broken(spark, tmp_path_factory):
    """An ingested pipeline with qty declared long: 620 dead letters (wrong_type)."""
    topic = create_topic(unique("dlq"), 2)
    sent = records()
    produce(topic, [(b"k%d" % i, v) for i, v in sent])
    s = init_db(make_settings(unique("dlq"), [topic], sink={"columns": COLUMNS}))
    result = run_ingest(s)
    assert (result.rows_written, result.dead_letters) == (GOOD, DECIMAL + WORDS)
    path = tmp_path_factory.mktemp("dlq")
    return s, topic, path


def test_list_counts_by_type_and_shows_the_newest(broken, capsys):
    s, topic, path = broken
    config = path / "broken.toml"
    config.write_text(config_text(s, COLUMNS))
    assert cli_main(["dead-letters", "list", "--config", str(config), "--json",
                     "--last", "3"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)
    assert listed["total"] == DECIMAL + WORDS
    assert [(c["error_type"], c["count"], c["partitions"]) for c in listed["by_type"]] == [
        ("wrong_type", DECIMAL + WORDS, 2)]
    assert len(listed["newest"]) == 3 and listed["newest"][0]["topic"] == topic
    assert cli_main(["dead-letters", "list", "--config", str(config), "--partition", "1",
                     "--from", "0", "--to", "400"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "wrong_type" in out and "total:" in out and "qty" in out  # the reason names it
    assert cli_main(["dead-letters", "list", "--config", str(config), "--type",
                     "malformed_json"]) == EXIT_OK
    assert "no dead letters of pipeline" in capsys.readouterr().out


def test_replay_after_the_fix_is_exact_all_or_nothing_and_idempotent(broken, capsys):
    s, topic, path = broken
    fixed_settings = fixed(s)
    config = path / "fixed.toml"
    config.write_text(config_text(s, {**COLUMNS, "qty": "double"}))
    # The table must take the fixed config's rows: the owner's ALTER, as the check says.
    with pytest.raises(Exception, match="ALTER TABLE"):
        run_replay(fixed_settings, DeadLetterFilter(), dry_run=True)
    as_owner(f"ALTER TABLE {s.sink.table} ALTER COLUMN qty TYPE double precision")
    before = state(s)

    # A dry run does everything but COMMIT.
    dry = run_replay(fixed_settings, DeadLetterFilter(), dry_run=True)
    assert (dry.chosen, dry.replayed, dry.still_failing) == (DECIMAL + WORDS, DECIMAL, WORDS)
    assert state(s) == before

    # SIGKILL inside the replay's transaction: nothing of it is visible.
    killed = run_cli("dead-letters", "replay", "--config", str(config), "--yes",
                     env={"PIPELINE_FAULT": "replay_before_commit:kill"}, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert state(s) == before

    # The replay: exactly the rows the records give with qty as double.
    assert cli_main(["dead-letters", "replay", "--config", str(config), "--yes",
                     "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert (report["chosen"], report["replayed"], report["still_failing"],
            report["rows_written"]) == (DECIMAL + WORDS, DECIMAL, WORDS, DECIMAL)
    assert report["still_failing_by_type"] == {"wrong_type": WORDS}
    assert report["reasons_changed"] == WORDS  # the reason now names double, not long
    run_id = report["run_id"]
    rows, dead, moved = state(s)
    by_id = {r[3]: r for r in rows}
    assert len(rows) == GOOD + DECIMAL and set(by_id) == set(range(GOOD + DECIMAL))
    for i in range(GOOD + DECIMAL):
        _, _, _, order_id, customer, qty, rid = by_id[i]
        assert (customer, qty) == (f"c{i}", i if i < GOOD else i + 0.5)
        assert rid == (run_id if i >= GOOD else before[0][0][6])
    # Each record is in exactly one table, at its own offset.
    offsets = {(r[1], r[2]) for r in rows}
    assert len(dead) == WORDS and not offsets & {(d[0], d[1]) for d in dead}
    assert len(offsets) + len(dead) == GOOD + DECIMAL + WORDS
    assert all("double" in d[3] for d in dead)
    assert len(moved) == DECIMAL and {m[2] for m in moved} == {run_id}
    assert offsets >= {(m[0], m[1]) for m in moved}
    runs = query("SELECT kind, status FROM pipeline_runs WHERE pipeline = %s ORDER BY run_id",
                 (s.name,))
    assert runs == [("ingest", "succeeded"), ("replay", "abandoned"), ("replay", "succeeded")]

    # A second replay changes nothing: the ones left still fail for the same reason.
    after = state(s)
    again = run_replay(fixed_settings, DeadLetterFilter())
    assert (again.chosen, again.replayed, again.rows_written, again.reasons_changed) == (
        WORDS, 0, 0, 0)
    assert state(s) == after
    # The replayed records are no dead letters any more: choosing them finds nothing.
    none = run_replay(fixed_settings, DeadLetterFilter(error_type="no_such_type"))
    assert none.chosen == 0 and state(s) == after


def test_replay_takes_turns_with_the_ingest(broken):
    s, _, _ = broken
    altered = query("SELECT data_type FROM information_schema.columns WHERE table_name = %s "
                    "AND column_name = 'qty'", (s.sink.table,)) == [("double precision",)]
    with Store(s) as ingest:
        ingest.lock_or_fail()  # as a running ingest holds it
        with pytest.raises(ConflictError, match="ingest lock"):
            run_replay(fixed(s) if altered else s, DeadLetterFilter())


def test_a_transform_sink_is_refused_with_exit_2(broken, tmp_path, capsys):
    s, _, _ = broken
    config = tmp_path / "transform.toml"
    config.write_text(config_text(s, COLUMNS).replace(
        "max_bad_records = -1", 'max_bad_records = -1\ntransform = '
        '"tests.integration.transforms.orders:identity"'))
    code = cli_main(["dead-letters", "replay", "--config", str(config), "--yes"])
    err = capsys.readouterr().err
    assert code == EXIT_CONFIG
    assert "[sink] transform" in err and "backfill --reprocess" in err


def test_verify_is_clean_after_an_append_replay(broken, capsys):
    """Replayed records leave pipeline_dead_letters as their rows land: verify still finds
    each record in exactly one of the two tables (exit 0)."""
    s, _, path = broken
    as_owner(f"ALTER TABLE {s.sink.table} ALTER COLUMN qty TYPE double precision")
    run_replay(fixed(s), DeadLetterFilter())  # replays what the test above may have left
    config = path / "verify.toml"
    config.write_text(config_text(s, {**COLUMNS, "qty": "double"}))
    assert cli_main(["verify", "--config", str(config), "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["partitions"]) == 2
    parts = report["partitions"]
    assert sum(p["expected"] for p in parts) == GOOD + DECIMAL + WORDS
    assert (sum(p["rows"] for p in parts), sum(p["dead_letters"] for p in parts)) == (
        GOOD + DECIMAL, WORDS)
    assert not any(p["missing"] or p["duplicates"] or p["unexpected"] or p["unpublished"]
                   for p in parts)


# Upsert and aggregate sinks: the replay lands through the sink's own merge. The expected
# tables are recomputed from what was produced, with qty as double (words still fail).

def decodes(qty) -> bool:
    return not isinstance(qty, str)


def with_double(s, sink: dict):
    """The fixed settings of a sink mode's pipeline ``s``: qty declared double."""
    return replace(make_settings(s.name, list(s.kafka.topics), sink={
        **sink, "columns": {**COLUMNS, "qty": "double"}}), database_url=s.database_url)


KEYED = {"mode": "upsert", "key": ["order_id"]}


def versions(i: int) -> list:
    """An order's qty per version, in the order produced (version v: i * 10 + v; a decimal
    is a dead letter while qty is long). By i % 4: an older dead letter under a newer row;
    a dead letter only (no row); a row under a newer dead letter; an older dead letter, a
    row, and a newer record that fails either way."""
    v = i * 10
    return [[v + 1.5, v + 2], [v + 1.5], [v + 1, v + 2.5], [v + 1.5, v + 2, "many"]][i % 4]


def test_upsert_replay_keeps_newer_rows_and_lands_new_keys(spark):
    topic = create_topic(unique("dlq_up"), 2)
    ids = {p: [i for i in range(80) if i % 2 == p] for p in (0, 1)}
    produced: dict[tuple[int, int], tuple[int, object]] = {}  # (partition, offset) -> record

    def send(p: int, vs: list[tuple[int, object]]) -> None:
        start = sum(1 for q, _ in produced if q == p)
        produce(topic, [(str(i).encode(), doc(i, q)) for i, q in vs], partition=p)
        produced.update({(p, start + n): r for n, r in enumerate(vs)})

    s = init_db(make_settings(unique("dlq_up"), [topic], sink={**KEYED, "columns": COLUMNS}))
    # Two ingests: the first versions, then the later ones (a newer row by a later run).
    for first in (True, False):
        for p in (0, 1):
            send(p, [(i, q) for i in ids[p] for q in
                     (versions(i)[:1] if first else versions(i)[1:])])
        run_ingest(s)
    as_owner(f"ALTER TABLE {s.sink.table} ALTER COLUMN qty TYPE double precision")
    table = (f'SELECT order_id, "partition", "offset", customer, qty, run_id FROM '
             f"{s.sink.table} ORDER BY 1")
    before = {r[0]: r for r in query(table)}

    report = run_replay(with_double(s, KEYED), DeadLetterFilter())
    # Expected: per key, its newest record (highest offset: one partition per key) that
    # decodes with qty as double.
    newest: dict[int, tuple] = {}
    for (p, o), (i, q) in sorted(produced.items()):
        if decodes(q):
            newest[i] = (i, p, o, f"c{i}", q)
    rows = query(table)
    assert [r[:5] for r in rows] == [newest[i] for i in sorted(newest)]
    replaced = {r[0] for r in rows if r[5] == report.run_id}
    assert replaced == {i for i in range(80) if i % 4 in (1, 2)}  # older rows never replaced
    assert all(before[i] == r for r in rows if (i := r[0]) not in replaced)
    dead = sum(1 for i, q in produced.values() if not decodes(q))
    decimals = sum(1 for i, q in produced.values() if isinstance(q, float))
    assert (report.chosen, report.replayed, report.still_failing, report.rows_written) == (
        decimals + dead, decimals, dead, len(replaced))
    assert query("SELECT count(*) FROM pipeline_dead_letters WHERE pipeline = %s",
                 (s.name,)) == [(dead,)]

    again = run_replay(with_double(s, KEYED), DeadLetterFilter())
    assert (again.chosen, again.replayed, again.rows_written) == (dead, 0, 0)
    assert query(table) == rows


TOTALS = {"mode": "aggregate", "group_by": ["customer"],
          "aggregates": {"orders": "count(*)", "total": "sum(qty)", "smallest": "min(qty)",
                         "biggest": "max(qty)", "priced": "count(qty)"}}


def test_aggregate_replay_adds_to_the_totals_exactly_once(spark):
    topic = create_topic(unique("dlq_agg"), 2)
    # qty: an int, a decimal (a dead letter while long), none (a row, no value), a word.
    sent = [(i, [i, i + 0.5, None, i + 0.5, "many"][i % 5]) for i in range(300)]
    produce(topic, [(str(i).encode(), json.dumps(
        {"order_id": i, "customer": f"c{i % 6}", "qty": q}).encode()) for i, q in sent])
    s = init_db(make_settings(unique("dlq_agg"), [topic], sink={**TOTALS, "columns": COLUMNS}))
    run_ingest(s)
    for col in ("total", "smallest", "biggest"):
        as_owner(f"ALTER TABLE {s.sink.table} ALTER COLUMN {col} TYPE double precision")
    totals = (f"SELECT customer, orders, total, smallest, biggest, priced FROM "
              f"{s.sink.table} ORDER BY 1")

    def expected() -> list[tuple]:
        groups: dict[str, list] = {}
        for i, q in sent:
            if decodes(q):
                groups.setdefault(f"c{i % 6}", []).append(q)
        out = []
        for c, qs in sorted(groups.items()):
            vals = [q for q in qs if q is not None]
            out.append((c, len(qs), float(sum(vals)), float(min(vals)), float(max(vals)),
                        len(vals)))
        return out

    fixed_settings = with_double(s, TOTALS)
    # Partition 0 first, then the rest: each replayed record counts once.
    first = run_replay(fixed_settings, DeadLetterFilter(partition=0))
    rest = run_replay(fixed_settings, DeadLetterFilter())
    decimals = sum(1 for _, q in sent if isinstance(q, float))
    words = sum(1 for _, q in sent if isinstance(q, str))
    assert first.replayed + rest.replayed == decimals and 0 < first.replayed < decimals
    assert rest.still_failing == words
    assert query(totals) == expected()

    again = run_replay(fixed_settings, DeadLetterFilter())
    assert (again.chosen, again.replayed, again.rows_written) == (words, 0, 0)
    assert query(totals) == expected()
