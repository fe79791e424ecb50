"""Randomized soak: the real CLI, killed again and again at random moments (SIGKILL of its
whole process group after a random delay, or at a random named fault point), with new
records produced between runs. After every run, every partition's results are exactly the
prefix its stored offset promises; at the end, what Postgres holds is compared record by
record with what Kafka holds. Prints one line:

    soak: records=N kills=K lost=0 duplicated=0

CI runs a short form (30,000 records, 6 kills); scripts/soak runs the full form (>= 200,000
records, >= 20 kills, about 4.5 minutes) with the same assertions (SOAK_RECORDS, SOAK_KILLS,
SOAK_PARTITIONS, SOAK_SEED override either).

test_soak_sink_modes does the same to an upsert and an aggregate pipeline reading one topic
(updates, tombstones, null amounts), run in turn: after every run, the table of the
pipeline just run equals the recomputation from the records below its stored offsets; now
and then, and at the end, the upsert pipeline replays an old range (backfill, reprocess),
which must change nothing. At the end the model of the topic is checked against Kafka.
Prints one line:

    soak modes: records=N kills=K upsert_keys=U groups=G mismatches=0

CI runs a short form (20,000 records, 6 kills: still one at every fault point);
scripts/soak the full form (60,000 records, 12 kills, about 4 minutes on two cores)
(SOAK_MODES_RECORDS, SOAK_MODES_KILLS, SOAK_MODES_PARTITIONS, SOAK_SEED override either).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from confluent_kafka import Producer

from pipeline import faults
from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    create_topic,
    init_cli,
    job_db_url,
    make_settings,
    query,
    toml_config,
)
from tests.helpers import unique as unique_name
from tests.integration._reliability import (
    finish,
    init_db,
    kafka_records,
    start_cli,
    stored,
    wait_for_processes_gone,
)


@dataclass
class SoakPlan:
    records: int
    kills: int
    partitions: int
    cap: int  # kafka.max_records_per_partition: bounds every run's cost
    seed: int
    name: str = "ci"


@dataclass
class SoakState:
    produced: int = 0
    kills: int = 0
    kills_by: Counter = field(default_factory=Counter)
    clean: int = 0
    conflicts: int = 0
    runs: int = 0
    pids: list = field(default_factory=list)


@dataclass
class Target:
    """One pipeline the soak runs: its config file, its job's database URL and, for the
    random delays of the kills, how long its recent non-empty clean runs took."""
    name: str
    config: Path
    database_url: str
    label: str = ""  # prefixes its kills in kills_by when a soak runs several pipelines
    clean_seconds: list = field(default_factory=list)

    def typical_run(self) -> float:
        recent = self.clean_seconds[-5:]
        return sum(recent) / len(recent) if recent else 30.0


class Soak:
    def __init__(self, plan: SoakPlan, tmp_path):
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.state = SoakState()
        self.setup(tmp_path)
        self.producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 50,
                                  "enable.idempotence": True})
        self.points: list[str] = []  # fault points in shuffled rounds: each one is hit

    def setup(self, tmp_path) -> None:
        """The topic, the pipelines' tables and config files: ``self.targets``."""
        plan = self.plan
        self.name = unique_name(f"soak_{plan.name}")
        self.topic = create_topic(self.name, plan.partitions)
        self.settings = init_db(make_settings(self.name, [self.topic], fmt="raw"))
        self.config = tmp_path / "soak.toml"
        self.config.write_text(toml_config(
            self.name, [self.topic], fmt="raw",
            extra_kafka=f"max_records_per_partition = {plan.cap}"))
        self.targets = [Target(self.name, self.config, self.settings.database_url)]

    def next_target(self) -> Target:
        return self.targets[0]

    def check(self, target: Target) -> None:
        """After any run of ``target``, killed or not."""
        self.check_prefixes()

    def between_runs(self, target: Target) -> None:
        """After a run of ``target`` and its check, before the next records."""

    # ---- the loop ---------------------------------------------------------------------
    def run(self) -> str:
        p, s = self.plan, self.state
        expected_runs = max(1, int(p.kills / 0.7))
        self.produce(p.records // 4)
        while s.kills < p.kills or s.produced < p.records:
            # New records between runs, spread over the runs still expected; once the
            # target is reached, a trickle, so that no run until the last kill is empty.
            left_runs = max(1, int((p.kills - s.kills) / 0.7))
            share = max((p.records - s.produced) // left_runs, p.records // 200)
            self.produce(self.rng.randint(share // 2, share * 3 // 2))
            kill = s.kills < p.kills and self.rng.random() < 0.75
            target = self.next_target()
            self.one_run(target, kill)
            self.check(target)
            self.between_runs(target)
            assert s.runs < 4 * expected_runs + 20, f"the soak does not converge: {s}"
        self.drain()
        return self.compare()

    def fault_kill(self, kill: bool) -> bool:
        """Whether a kill is at a fault point (else after a random delay)."""
        return kill and self.rng.random() < 0.5

    def next_point(self) -> str:
        if not self.points:
            self.points = self.rng.sample(faults.POINTS, len(faults.POINTS))
        return self.points.pop()

    def one_run(self, target: Target, kill: bool) -> int:
        """One run of the real CLI, killed or not; returns its exit code."""
        s = self.state
        how, point, delay = "clean", "none", None
        if self.fault_kill(kill):
            how, point = "fault", self.next_point()
        elif kill:
            how, delay = "delay", self.rng.uniform(0.5, 1.1 * target.typical_run())
        # A fault spec that never fires for clean and delayed runs: it makes faults.py mark
        # the run's processes, so that leftovers can be found afterwards.
        env = {"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": BOOTSTRAP,
               "PIPELINE__DATABASE__URL": target.database_url,
               "PIPELINE_FAULT": f"{point}:kill"}
        started = time.monotonic()
        proc = start_cli("run", "--config", str(target.config), env=env)
        s.runs += 1
        s.pids.append(proc.pid)
        if delay is not None:
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        code, out, err = finish(proc, timeout=600)
        if code == -signal.SIGKILL:
            s.kills += 1
            what = point if how == "fault" else "random delay"
            s.kills_by[f"{target.label}:{what}" if target.label else what] += 1
        elif code == 0:
            s.clean += 1
            if "nothing new to read" not in out:  # a no-op takes no time: not typical
                target.clean_seconds.append(time.monotonic() - started)
        elif code == 75 and "is busy" in err:  # a killed run's session not yet gone
            s.conflicts += 1
            time.sleep(2)
        else:
            raise AssertionError(f"run {s.runs} of {target.name} ({how} {point} {delay}) "
                                 f"exited {code} ({self.plan}):\n{err[-3000:]}")
        return code

    def drain(self) -> None:
        """Clean runs of each pipeline until one has nothing left to read."""
        for target in self.targets:
            for _ in range(self.plan.records // (self.plan.cap * self.plan.partitions) + 5):
                r = self.cli_json(target)
                if r == "noop":
                    break
                self.check(target)
            else:
                raise AssertionError(f"the soak's final runs of {target.name} never caught up")

    def cli_json(self, target: Target) -> str:
        proc = start_cli("run", "--config", str(target.config),
                         env={"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": BOOTSTRAP,
                              "PIPELINE__DATABASE__URL": target.database_url})
        self.state.runs += 1
        code, out, err = finish(proc, timeout=600)
        assert code == 0, err[-3000:]
        self.state.clean += 1
        return "noop" if "nothing new to read" in out else "succeeded"

    # ---- records ------------------------------------------------------------------------
    def produce(self, n: int) -> None:
        start = self.state.produced
        for seq in range(start, start + n):
            self.producer.produce(
                self.topic, key=b"k%d" % seq, partition=seq % self.plan.partitions,
                value=b'{"seq": %d, "pad": "%s"}' % (seq, b"x" * self.rng.randint(0, 80)),
                headers=[("seq", str(seq).encode())])
            if seq % 20000 == 0:
                self.producer.poll(0)
        assert self.producer.flush(60) == 0
        self.state.produced += n

    # ---- checks -------------------------------------------------------------------------
    def check_prefixes(self) -> None:
        """After any run, killed or not: each partition holds exactly the records
        [0, stored next offset), once each (the topic has no gaps)."""
        offsets = stored(self.name, TEST_DB_URL)
        held = {p: (n, lo, hi) for p, n, lo, hi in query(
            f'SELECT "partition", count(*), min("offset"), max("offset") FROM {self.name} '
            "GROUP BY 1")}
        for p in range(self.plan.partitions):
            n = offsets.get(p, 0)
            # n rows, keyed uniquely, from 0 to n - 1: exactly the prefix, once each.
            assert held.get(p, (0, None, None)) == ((n, 0, n - 1) if n else (0, None, None)), (
                f"partition {p}: stored next offset {n}, results {held.get(p)}; "
                f"{self.plan} {self.state}")

    def compare(self) -> str:
        kafka = kafka_records(self.topic, BOOTSTRAP)
        assert len(kafka) == self.state.produced
        rows = query(f'SELECT "partition", "offset", key, value FROM {self.name}')
        coords = Counter((p, o) for p, o, _, _ in rows)
        pg = {(p, o): (k, v) for p, o, k, v in rows}
        lost = [c for c in kafka if c not in pg]
        phantom = [c for c in pg if c not in kafka]
        changed = [c for c, (k, v) in pg.items() if c in kafka and kafka[c][:2] != (k, v)]
        seqs = Counter(v for _, v in pg.values())
        duplicated = sum(n - 1 for n in coords.values()) + sum(n - 1 for n in seqs.values())
        assert stored(self.name, TEST_DB_URL) == {
            p: sum(1 for q, _ in kafka if q == p) for p in range(self.plan.partitions)}
        statuses = Counter(r[0] for r in query(
            "SELECT status FROM pipeline_runs WHERE pipeline = %s", (self.name,)))
        # Nothing the killed runs started may outlive them.
        wait_for_processes_gone(*self.state.pids, timeout=30)
        s = self.state
        line = (f"soak: records={len(kafka)} kills={s.kills} lost={len(lost)} "
                f"duplicated={duplicated}")
        detail = (f"soak detail: plan={self.plan} runs={s.runs} clean={s.clean} "
                  f"conflicts={s.conflicts} kills_by={dict(s.kills_by)} "
                  f"statuses={dict(statuses)} phantom={len(phantom)} changed={len(changed)}")
        assert not lost and not duplicated and not phantom and not changed, (line, detail)
        assert statuses.get("running", 0) == 0
        assert s.kills >= self.plan.kills and len(kafka) >= self.plan.records
        return line + "\n" + detail


class SinkModesSoak(Soak):
    """The soak of an upsert and an aggregate pipeline on one topic, run in turn.

    Records are partitioned explicitly (id k in partition k % partitions, Kafka key str(k)),
    so with one idempotent producer the offsets of partition p are 0, 1, 2, ... in the order
    produced: ``self.log`` is the model every check recomputes from (and the end checks it
    against Kafka). About one record in 15 is a tombstone of an id produced before: the
    upsert pipeline deletes its row; for the aggregate pipeline it is a dead letter."""

    COLUMNS = {"id": "long", "bucket": "string", "seq": "long", "amount": "decimal(12,2)"}
    AGGREGATES = {"n": "count(*)", "total": "sum(amount)", "priced": "count(amount)",
                  "first_seq": "min(seq)", "last_seq": "max(seq)"}
    BUCKETS = 40
    TOMBSTONE_ONE_IN = 15
    CENT = Decimal("0.01")

    def setup(self, tmp_path) -> None:
        plan = self.plan
        self.name = unique_name(f"soakm_{plan.name}")
        self.topic = create_topic(self.name, plan.partitions)
        self.keys = max(100, plan.records // 8)  # ids: each is written about 8 times
        # Per partition, in offset order: (id, value bytes or None, seq, bucket, amount as
        # the decimal(12,2) column holds it).
        self.log: list[list[tuple]] = [[] for _ in range(plan.partitions)]
        self.seen: set[int] = set()
        self.undelivered: list = []
        self.last_offsets: dict[str, dict[int, int]] = {}
        self.turn = 0
        self.replays: list[str] = []
        aggregates = "".join(f'{k} = "{v}"\n' for k, v in self.AGGREGATES.items())
        self.upsert = self.pipeline(tmp_path, "upsert", 'mode = "upsert"\nkey = ["id"]\n')
        self.aggregate = self.pipeline(tmp_path, "aggregate", 'mode = "aggregate"\n'
                                       f'group_by = ["bucket"]\n[sink.aggregates]\n{aggregates}')
        self.targets = [self.upsert, self.aggregate]

    def pipeline(self, tmp_path, mode: str, sink: str) -> Target:
        name = f"{self.name}_{mode[:3]}"
        columns = "".join(f'{k} = "{v}"\n' for k, v in self.COLUMNS.items())
        config = tmp_path / f"{mode}.toml"
        config.write_text(f"""
[pipeline]
name = "{name}"
[kafka]
bootstrap_servers = "{BOOTSTRAP}"
topics = ["{self.topic}"]
timeout_seconds = 10
max_records_per_partition = {self.plan.cap}
[database]
url = "{job_db_url()}"
[sink]
format = "json"
table = "{name}"
max_bad_records = -1
{sink}
[sink.columns]
{columns}
[spark]
master = "local[2]"
""")
        init_cli(config)
        return Target(name, config, job_db_url(), label=mode)

    def next_target(self) -> Target:
        self.turn += 1
        return self.targets[self.turn % 2]

    # Kills: every fault point is hit (those not hit yet come first; when the kills left are
    # as many as the points not hit, every kill is at one), preferably in each mode.
    def hit(self, label: str | None = None) -> set[str]:
        return {what for key in self.state.kills_by
                for mode, _, what in [key.partition(":")]
                if what in faults.POINTS and label in (None, mode)}

    def fault_kill(self, kill: bool) -> bool:
        unhit = len(faults.POINTS) - len(self.hit())
        return kill and (self.plan.kills - self.state.kills <= unhit
                         or self.rng.random() < 0.5)

    def one_run(self, target: Target, kill: bool) -> int:
        self.running = target
        return super().one_run(target, kill)

    def next_point(self) -> str:
        overall, here = self.hit(), self.hit(self.running.label)
        for candidates in ([q for q in faults.POINTS if q not in overall and q not in here],
                           [q for q in faults.POINTS if q not in overall],
                           [q for q in faults.POINTS if q not in here]):
            if candidates:
                return self.rng.choice(candidates)
        return super().next_point()

    # Replays: after some runs of the upsert pipeline, and once at the end, it re-reads an
    # old range (`pipeline backfill`, every other time with --reprocess): an older record
    # must never replace or resurrect newer state, so the table must still equal the model
    # (and a backfill writes and deletes nothing).
    def between_runs(self, target: Target) -> None:
        if target is self.upsert and self.rng.random() < 0.4:
            self.replay(reprocess=len(self.replays) % 2 == 1)

    def drain(self) -> None:
        super().drain()
        self.replay(reprocess=False, whole=True)

    def replay(self, reprocess: bool, whole: bool = False) -> None:
        target = self.upsert
        end = min(stored(target.name, TEST_DB_URL).get(p, 0)
                  for p in range(self.plan.partitions))
        if end == 0:
            return
        start = 0 if whole else self.rng.randrange(end)
        stop = end if whole else self.rng.randint(start + 1, end)
        what = f"{'reprocess' if reprocess else 'backfill'} [{start}, {stop})"
        for _ in range(5):
            proc = start_cli("backfill", "--config", str(target.config), "--topic",
                             self.topic, "--from-offset", str(start), "--to-offset", str(stop),
                             "--json", *(["--reprocess"] if reprocess else []),
                             env={"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": BOOTSTRAP,
                                  "PIPELINE__DATABASE__URL": target.database_url})
            self.state.runs += 1
            code, out, err = finish(proc, timeout=600)
            if code != 75:
                break
            self.state.conflicts += 1  # a killed run's session not yet gone
            time.sleep(2)
        assert code == 0, f"{what}: exit {code}\n{err[-3000:]}"
        self.replays.append(what)
        self.check(target)
        result = json.loads(out)
        if not reprocess:
            assert (result["rows_written"], result["rows_deleted"]) == (0, 0), (what, result)

    # ---- records ------------------------------------------------------------------------
    def amount(self) -> tuple[object, Decimal | None]:
        """(the JSON field, the value the decimal(12,2) column holds): mostly a decimal
        string, some null, some with three decimals (rounded half up), some JSON numbers."""
        r = self.rng.random()
        if r < 0.1:
            return None, None
        if r < 0.2:
            raw: object = str(Decimal(self.rng.randint(-999_999, 99_999_999)).scaleb(-3))
        elif r < 0.3:
            raw = float(Decimal(self.rng.randint(-99_999, 9_999_999)).scaleb(-2))
        else:
            raw = str(Decimal(self.rng.randint(-99_999, 9_999_999)).scaleb(-2))
        return raw, Decimal(str(raw)).quantize(self.CENT, ROUND_HALF_UP)

    def produce(self, n: int) -> None:
        parts = self.plan.partitions
        for _ in range(n):
            seq = self.state.produced
            k = self.rng.randrange(self.keys)
            p = k % parts
            if k in self.seen and self.rng.randrange(self.TOMBSTONE_ONE_IN) == 0:
                value, bucket, amount = None, None, None
            else:
                self.seen.add(k)
                bucket = f"b{k // parts % self.BUCKETS}"  # every bucket in every partition
                raw, amount = self.amount()
                value = json.dumps({"id": k, "bucket": bucket, "seq": seq,
                                    "amount": raw}).encode()
            offset = len(self.log[p])
            self.log[p].append((k, value, seq, bucket, amount))
            self.state.produced += 1

            def delivered(err, msg, p=p, offset=offset):
                if err is not None or (msg.partition(), msg.offset()) != (p, offset):
                    self.undelivered.append((p, offset, err, msg.partition(), msg.offset()))
            while True:
                try:
                    self.producer.produce(self.topic, key=str(k).encode(), value=value,
                                          partition=p, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let it drain
                    self.producer.poll(1)
            if seq % 20000 == 0:
                self.producer.poll(0)
        assert self.producer.flush(60) == 0
        assert not self.undelivered, f"records not where the model puts them (partition, " \
                                     f"offset, error, ...): {self.undelivered[:5]}"

    # ---- checks -------------------------------------------------------------------------
    def check(self, target: Target) -> None:
        wrong = self.mismatches(target)
        assert not wrong, (f"{target.label} pipeline {target.name}: {len(wrong)} mismatches "
                           f"(what, key, expected, actual), first {wrong[:8]}; stored offsets "
                           f"{self.last_offsets.get(target.name)}; {self.plan} {self.state}")

    def mismatches(self, target: Target) -> list[tuple]:
        """What differs from the recomputation from the records below the stored offsets."""
        offsets = stored(target.name, TEST_DB_URL)
        before = self.last_offsets.get(target.name, {})
        self.last_offsets[target.name] = offsets
        wrong = [("stored offset", p, f"{before.get(p, 0)}..{len(self.log[p])}",
                  offsets.get(p, 0)) for p in range(self.plan.partitions)
                 if not before.get(p, 0) <= offsets.get(p, 0) <= len(self.log[p])]
        wrong += [("stored offset", p, "a partition of the topic", n)
                  for p, n in offsets.items() if p not in range(self.plan.partitions)]
        committed = [self.log[p][:offsets.get(p, 0)] for p in range(self.plan.partitions)]
        if target is self.upsert:
            return wrong + self.upsert_mismatches(target.name, committed)
        return wrong + self.aggregate_mismatches(target.name, committed)

    @staticmethod
    def differ(what: str, want: dict, got: dict) -> list[tuple]:
        return [(what, k, want.get(k), got.get(k)) for k in sorted(set(want) | set(got), key=str)
                if want.get(k) != got.get(k)]

    def upsert_mismatches(self, table: str, committed: list[list[tuple]]) -> list[tuple]:
        """The newest committed record per id (a tombstone deletes it, and is kept in
        <table>_deleted until a newer record of the id); no dead letters. A replayed old
        tombstone leaves no trace (the first version of this soak found one that did).
        Newest by the upsert rule (docs/reliability.md, "Upsert across partitions"): an id
        never changes partition here (k % partitions, the topic does not grow), so the rule
        is the offset order; records across partitions: test_partition_growth.py."""
        rows: dict[int, tuple] = {}
        deleted: dict[int, tuple] = {}
        for p, records in enumerate(committed):  # an id lives in one partition: by offset
            for offset, (k, value, seq, bucket, amount) in enumerate(records):
                if value is None:
                    rows.pop(k, None)
                    deleted[k] = (p, offset)
                else:
                    rows[k] = (seq, bucket, amount, p, offset)
                    deleted.pop(k, None)
        got_rows = {r[0]: tuple(r[1:]) for r in query(
            f'SELECT id, seq, bucket, amount, "partition", "offset" FROM {table}')}
        got_deleted = {r[0]: tuple(r[1:]) for r in query(
            f'SELECT id, "partition", "offset" FROM {table}_deleted')}
        dead = query("SELECT count(*) FROM pipeline_dead_letters WHERE pipeline = %s",
                     (table,))[0][0]
        return (self.differ("row", rows, got_rows)
                + self.differ("tombstone", deleted, got_deleted)
                + ([("dead letters", None, 0, dead)] if dead else []))

    def aggregate_mismatches(self, table: str, committed: list[list[tuple]]) -> list[tuple]:
        """Per bucket the aggregates of the committed non-null records, exactly; every
        committed tombstone a dead letter (null_value), nothing else."""
        groups: dict[str, tuple] = {}
        tombstones: dict[tuple, str] = {}
        for p, records in enumerate(committed):
            for offset, (_, value, seq, bucket, amount) in enumerate(records):
                if value is None:
                    tombstones[(p, offset)] = "null_value"
                    continue
                n, total, priced, first, last = groups.get(bucket, (0, None, 0, seq, seq))
                if amount is not None:
                    total = amount if total is None else total + amount
                    priced += 1
                groups[bucket] = (n + 1, total, priced, min(first, seq), max(last, seq))
        got = {r[0]: tuple(r[1:]) for r in query(
            f"SELECT bucket, {', '.join(self.AGGREGATES)} FROM {table}")}
        dead = query('SELECT "partition", "offset", error_type FROM pipeline_dead_letters '
                     "WHERE pipeline = %s", (table,))
        got_dead = {(p, o): t for p, o, t in dead}
        return (self.differ("group", groups, got)
                + self.differ("dead letter", tombstones, got_dead)
                + ([("dead letters", None, len(got_dead), len(dead))]
                   if len(dead) != len(got_dead) else []))

    def compare(self) -> str:
        """The model against Kafka itself, then each pipeline against the model."""
        kafka = kafka_records(self.topic, BOOTSTRAP)
        model = {(p, o): (str(k).encode(), value) for p, records in enumerate(self.log)
                 for o, (k, value, *_) in enumerate(records)}
        wrong = [("kafka", c, model.get(c), kafka[c][:2] if c in kafka else None)
                 for c in sorted(set(model) | set(kafka))
                 if model.get(c) != (kafka[c][:2] if c in kafka else None)]
        ends = {p: len(records) for p, records in enumerate(self.log)}
        for target in self.targets:
            wrong += self.mismatches(target)
            if stored(target.name, TEST_DB_URL) != ends:
                wrong.append(("not drained", target.name, ends,
                              stored(target.name, TEST_DB_URL)))
        statuses = {t.label: dict(Counter(r[0] for r in query(
            "SELECT status FROM pipeline_runs WHERE pipeline = %s", (t.name,))))
            for t in self.targets}
        wait_for_processes_gone(*self.state.pids, timeout=30)
        s = self.state
        line = (f"soak modes: records={len(kafka)} kills={s.kills} "
                f"upsert_keys={query(f'SELECT count(*) FROM {self.upsert.name}')[0][0]} "
                f"groups={query(f'SELECT count(*) FROM {self.aggregate.name}')[0][0]} "
                f"mismatches={len(wrong)}")
        tombstones = sum(1 for records in self.log for r in records if r[1] is None)
        detail = (f"soak modes detail: plan={self.plan} runs={s.runs} clean={s.clean} "
                  f"conflicts={s.conflicts} tombstones={tombstones} replays={self.replays} "
                  f"kills_by={dict(sorted(s.kills_by.items()))} statuses={statuses}")
        assert not wrong, (line, detail, wrong[:10])
        assert not any(st.get("running") for st in statuses.values()), statuses
        assert s.kills >= self.plan.kills and len(kafka) >= self.plan.records
        if self.plan.kills >= len(faults.POINTS):
            assert self.hit() == set(faults.POINTS), (self.hit(), detail)
        return line + "\n" + detail


def run_soak(plan: SoakPlan, tmp_path, capsys, soak: type[Soak] | None = None) -> None:
    started = time.monotonic()
    report = (soak or Soak)(plan, tmp_path).run()
    with capsys.disabled():
        print(f"\n{report} seconds={time.monotonic() - started:.0f}")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_soak(stack, tmp_path, capsys):
    """The soak: in CI its short form, >= 30,000 records and >= 6 kills; scripts/soak runs
    the full form, >= 200,000 records and >= 20 kills (about 4.5 minutes on two cores).
    SOAK_RECORDS, SOAK_KILLS, SOAK_PARTITIONS and SOAK_SEED change it."""
    records = int(os.environ.get("SOAK_RECORDS", 30000))
    partitions = int(os.environ.get("SOAK_PARTITIONS", 6))
    run_soak(SoakPlan(records=records, kills=int(os.environ.get("SOAK_KILLS", 6)),
                      partitions=partitions, cap=max(1000, records // (partitions * 4)),
                      seed=int(os.environ.get("SOAK_SEED", time.time_ns() % 10**6)),
                      name="full"), tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_soak_sink_modes(stack, tmp_path, capsys):
    """The soak of the upsert and aggregate sinks (SinkModesSoak), 4 partitions: in CI its
    short form, >= 20,000 records and >= 6 kills (one at every fault point); scripts/soak
    runs the full form, >= 60,000 records and >= 12 kills (about 4 minutes on two cores).
    SOAK_MODES_RECORDS, SOAK_MODES_KILLS, SOAK_MODES_PARTITIONS and SOAK_SEED change it."""
    records = int(os.environ.get("SOAK_MODES_RECORDS", 20000))
    partitions = int(os.environ.get("SOAK_MODES_PARTITIONS", 4))
    run_soak(SoakPlan(records=records, kills=int(os.environ.get("SOAK_MODES_KILLS", 6)),
                      partitions=partitions, cap=max(1000, records // (partitions * 4)),
                      seed=int(os.environ.get("SOAK_SEED", time.time_ns() % 10**6)),
                      name="modes"), tmp_path, capsys, SinkModesSoak)
