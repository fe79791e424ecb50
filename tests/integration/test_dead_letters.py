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
from pipeline.errors import EXIT_CONFIG, EXIT_OK, EXIT_TRANSIENT, ConflictError
from pipeline.store import Store
from pipeline.store.dead_letters import DeadLetterFilter
from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    cli_here,
    create_topic,
    init_cli,
    job_db_url,
    make_settings,
    produce,
    query,
    run_cli,
    unique,
)
from tests.integration._reliability import finish, init_db, start_waiting

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
        ingest.locks.lock_or_fail()  # as a running ingest holds it
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


# An offset lives in one place whichever path writes it (invariant 8), through the CLI: a
# backfill after a fix of the config, a replay beside a backfill, a backfill under an older
# (stricter) config over offsets that have rows.

LONG = {"order_id": "long not null", "customer": "string not null", "amount": "long",
        "note": "string"}
DOUBLE = {**LONG, "amount": "double"}
STRICT = {**DOUBLE, "note": "string not null"}  # the table's note stays nullable


def order_doc(i: int) -> bytes:
    """Odd ids: a decimal amount (a dead letter while amount is long); ids 2, 3, 6, 7, ...:
    no note (a dead letter under STRICT)."""
    return json.dumps({"order_id": i, "customer": f"c{i}", "amount": i + 0.5 if i % 2 else i,
                       **({} if i % 4 in (2, 3) else {"note": f"n{i}"})}).encode()


def cli_config(path, name: str, topic: str, columns: dict[str, str]):
    cols = "".join(f'{k} = "{v}"\n' for k, v in columns.items())
    path.write_text(
        f'[pipeline]\nname = "{name}"\n[kafka]\nbootstrap_servers = "{BOOTSTRAP}"\n'
        f'topics = ["{topic}"]\ntimeout_seconds = 10\n[database]\nurl = "{job_db_url()}"\n'
        f'[sink]\nformat = "json"\ntable = "{name}"\nmax_bad_records = -1\n'
        f'[sink.columns]\n{cols}[spark]\nmaster = "local[2]"\n')
    return str(path)


def outcomes(name: str) -> tuple[list, list, list]:
    """Offsets with a row, offsets with a dead letter, (offset, replayed_run_id) moved."""
    return ([o for (o,) in query(f'SELECT "offset" FROM {name} ORDER BY 1')],
            [o for (o,) in query('SELECT "offset" FROM pipeline_dead_letters WHERE pipeline '
                                 "= %s ORDER BY 1", (name,))],
            query('SELECT "offset", replayed_run_id FROM pipeline_dead_letters_replayed '
                  "WHERE pipeline = %s ORDER BY 1, 2", (name,)))


def test_an_offset_is_a_row_or_a_dead_letter_whichever_path_writes_it(spark, tmp_path):
    name = unique("dl_one")
    topic = create_topic(name, 1)
    produce(topic, [(b"k%d" % i, order_doc(i)) for i in range(20)])
    long_, double, strict = (cli_config(tmp_path / f"{n}.toml", name, topic, c) for n, c in
                             (("long", LONG), ("double", DOUBLE), ("strict", STRICT)))
    init_cli(long_)
    ran = cli_here("run", "--config", long_)
    assert ran.returncode == 0, ran.stderr[-2000:]
    evens, odds = list(range(0, 20, 2)), list(range(1, 20, 2))
    assert outcomes(name) == (evens, odds, [])

    # The fix (amount double, the ALTER done), then a backfill over the dead letters'
    # offsets: their rows land and the dead letters move out in the same transaction.
    as_owner(f"ALTER TABLE {name} ALTER COLUMN amount TYPE double precision")
    backfill = ["backfill", "--topic", topic, "--from-offset", "0", "--to-offset", "20",
                "--json"]
    fixed_run = run_cli(*backfill, "--config", double,
                        env={"PIPELINE_FAULT": "before_commit:sleep=2"})
    assert fixed_run.returncode == 0, fixed_run.stderr[-2000:]
    run_id = json.loads(fixed_run.stdout)["run_id"]
    assert outcomes(name) == (list(range(20)), [], [(o, run_id) for o in odds])
    assert query(f"SELECT amount FROM {name} WHERE order_id = 7") == [(7.5,)]
    [(details, ended_after_start)] = query(
        "SELECT details, finished_at - (SELECT max(replayed_at) FROM "
        "pipeline_dead_letters_replayed WHERE pipeline = %s) FROM pipeline_runs WHERE run_id "
        "= %s", (name, run_id))
    assert details["dead_letters_replayed"] == len(odds)
    # The run row ends as its transaction does: after the 2 s slept before COMMIT, not at
    # the transaction's start (replayed_at: now(), the start).
    assert ended_after_start.total_seconds() >= 2

    # A backfill under a stricter config (10 of its records fail) is running: a replay
    # takes turns with it (exit 75), and the backfill's failures, whose offsets have rows,
    # become no dead letters: the rows stay.
    go = tmp_path / "go"
    paused = start_waiting(*backfill, "--config", strict, point="after_stage", go=go)
    replay = cli_here("dead-letters", "replay", "--config", double, "--yes")
    go.touch()
    code, out, err = finish(paused)
    assert replay.returncode == EXIT_TRANSIENT, replay.stderr[-2000:]
    assert "backfill lock" in replay.stderr
    assert code == 0, err[-2000:]
    kept = json.loads(out)
    assert (kept["rows_written"], kept["dead_letters"]) == (0, 0)
    assert "10 records failed again but their offsets already have result rows" in err
    assert outcomes(name) == (list(range(20)), [], [(o, run_id) for o in odds])

    checked = cli_here("verify", "--config", double)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]


# A dry run changes nothing and takes no lock another session can wait on (invariant 10).

def upsert_doc(i: int, version: int) -> bytes:
    """Order i's versions: 1 an int qty, 2 a decimal (a dead letter while qty is long), 3
    (orders 0, 3, 6, 9) a word (a dead letter either way)."""
    return json.dumps({"order_id": i, "customer": f"c{i}.{version}",
                       "qty": [i, i + 0.5, "many"][version - 1]}).encode()


def test_a_dry_run_replay_locks_nothing_and_says_what_the_replay_does(spark, tmp_path):
    from pipeline.sinks.upsert import MERGE_LOCK_CLASS
    from pipeline.store.dead_letters import DEAD_LETTER_LOCK_CLASS
    from tests.integration.test_evolve import grant_evolve

    name = unique("dl_dry")
    topic = create_topic(name, 1)
    produce(topic, [(str(i).encode(), upsert_doc(i, v)) for v in (1, 2, 3) for i in range(10)
                    if v < 3 or i % 3 == 0])
    upsert = 'mode = "upsert"\nkey = ["order_id"]\n'

    def config(file: str, columns: dict[str, str], sink: str = "") -> str:
        path = tmp_path / file
        cli_config(path, name, topic, columns)
        path.write_text(path.read_text().replace("[sink]\n", f"[sink]\n{upsert}{sink}")
                        .replace("[sink]", "lock_timeout_seconds = 5\n[sink]", 1))
        return str(path)

    broken = config("long.toml", COLUMNS)
    init_cli(broken)
    grant_evolve(name)
    assert cli_here("run", "--config", broken).returncode == 0
    as_owner(f"ALTER TABLE {name} ALTER COLUMN qty TYPE double precision")
    # The fix, and a new column declared: sink.evolve adds it.
    fixed_config = config("fixed.toml", {**COLUMNS, "qty": "double", "channel": "string"},
                          'evolve = "add_columns"\n')

    def everything() -> tuple:
        return (query(f"SELECT * FROM {name} ORDER BY order_id"),
                query("SELECT * FROM pipeline_dead_letters WHERE pipeline = %s ORDER BY "
                      '"offset"', (name,)),
                query("SELECT count(*) FROM pipeline_dead_letters_replayed WHERE pipeline = %s",
                      (name,)),
                query("SELECT run_id, status FROM pipeline_runs WHERE pipeline = %s ORDER BY 1",
                      (name,)))

    before = everything()
    # Another session holds what a replay takes: the table (ACCESS SHARE, as a long reader
    # does), a dead letter's row lock, the upsert merge lock and the dead-letter lock. A
    # dry run that took any of them would wait 5 s (lock_timeout) and exit 75.
    other = psycopg.connect(TEST_DB_URL, application_name="long-reader")
    try:
        other.execute(f"SELECT count(*) FROM {name}").fetchone()
        other.execute('SELECT 1 FROM pipeline_dead_letters WHERE pipeline = %s ORDER BY '
                      '"offset" LIMIT 1 FOR UPDATE', (name,)).fetchone()
        for lock in (MERGE_LOCK_CLASS, DEAD_LETTER_LOCK_CLASS):
            other.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (lock, name))
        dry = cli_here("dead-letters", "replay", "--config", fixed_config, "--dry-run",
                      "--json")
        assert dry.returncode == 0, dry.stderr[-2000:]
        assert everything() == before
        assert "channel" not in [c for (c,) in query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
            (name,))]
        # The real replay must add the column first: it waits for the table only briefly at
        # a time, and after lock_timeout_seconds it gives up naming who holds the table.
        busy = cli_here("dead-letters", "replay", "--config", fixed_config, "--yes")
        assert busy.returncode == EXIT_TRANSIENT, busy.stderr[-2000:]
        [error] = [x for x in busy.stderr.splitlines() if x.startswith("error: ")]
        assert f'"public"."{name}"' in error and "application 'long-reader'" in error
    finally:
        other.close()

    done = run_cli("dead-letters", "replay", "--config", fixed_config, "--yes", "--json",
                   env={"PIPELINE_FAULT": "replay_before_commit:sleep=2"})
    assert done.returncode == 0, done.stderr[-2000:]
    would, did = json.loads(dry.stdout), json.loads(done.stdout)
    assert would.pop("dry_run") and not did.pop("dry_run")
    assert would.pop("run_id") is None
    run_id = did.pop("run_id")
    assert would == did  # the dry run's counts were the replay's
    assert (did["chosen"], did["replayed"], did["still_failing"], did["rows_written"],
            did["columns_added"]) == (14, 10, 4, 10, ["channel"])
    assert query(f"SELECT order_id, customer, qty FROM {name} ORDER BY 1") == [
        (i, f"c{i}.2", i + 0.5) for i in range(10)]
    # The run row ends as its transaction does, after the 2 s slept before COMMIT.
    [(took,)] = query("SELECT finished_at - started_at FROM pipeline_runs WHERE run_id = %s",
                      (run_id,))
    assert took.total_seconds() >= 2
