"""``pipeline verify`` of an upsert or aggregate sink: its table is state made from many
records, not one row per offset, so the state is recomputed from Kafka and compared. Also
``verify --values`` of an append sink: each row compared with the row its record makes.

Every range succeeded runs published is re-read (as driver/verify.py reads them), encoded
as the executors encode it (formats.encode.Encoder: the same rows, dead letters and
tombstones) and streamed into a temporary table; Postgres then computes the newest record
per key (upsert) or the totals per group (aggregate) and compares them with the table both
ways (store/state.py). One REPEATABLE READ transaction: the run rows and the table as of one
moment.

With ``[sink] transactions`` a change Kafka Connect wrote again is left out as the runs
left it out (plan/replays.py, one rule for both: the first of each identity in its
partition wins); the report counts them (``replayed``).

Records Kafka no longer holds (retention, a partition gone) are not re-read: the rows they
made are left out of the comparison, and, for a table that is the whole state (upsert), so
are the keys such rows or tombstones name (the lost record may be newer than any re-read);
the partitions they were in are "incomplete" (driver/verdict.py) unless --skip-lost left
them out of the scope. Totals (aggregate) include every record: one lost, and nothing is
compared."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from pipeline.config import Settings
from pipeline.driver.reconcile import published, retained
from pipeline.driver.verdict import MATCH, verdict
from pipeline.errors import ConfigError, TransientError

log = logging.getLogger(__name__)


@dataclass
class StateReport:
    pipeline: str
    mode: str
    records: int = 0  # Kafka records re-read
    replayed: int = 0  # of them, changes Kafka Connect wrote again: left out (replays.py)
    state_rows: int = 0  # rows the records make (keys, groups)
    table_rows: int = 0
    missing: int = 0  # state rows the table lacks or holds otherwise
    unexpected: int = 0  # table rows the state does not make
    missing_keys: list[list[str]] = field(default_factory=list)
    unexpected_keys: list[list[str]] = field(default_factory=list)
    # Published records Kafka no longer holds: {topic, partition, from, until, why}
    # (partition, from and until None: a whole topic), and the table rows they made.
    not_compared: list[dict] = field(default_factory=list)
    rows_not_compared: int = 0
    # Why nothing could be compared at all (totals that include a lost record), if so.
    nothing_compared: str | None = None
    partitions: list[dict] = field(default_factory=list)  # {topic, partition, ..., verdict}
    skip_lost: bool = False

    @property
    def differs(self) -> bool:
        return bool(self.missing or self.unexpected)

    @property
    def verdict(self) -> str:
        if self.nothing_compared and not self.differs:
            return verdict(False, True)  # --skip-lost cannot take a record out of a total
        return verdict(self.differs, bool(self.not_compared), self.skip_lost)

    @property
    def ok(self) -> bool:
        return self.verdict == MATCH

    @property
    def compared(self) -> bool:
        """Everything in the scope was compared."""
        return not (self.not_compared or self.nothing_compared)

    def as_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict, "ok": self.ok,
                "compared": self.compared}

    def by_partition(self, scope, records: dict, found: dict) -> None:
        """Each partition's verdict: ``scope``, the partitions published; ``records``, how
        many each gave; ``found``, the differences per partition (store/state.py; none
        when rows do not name their records: totals mix the partitions)."""
        gone: dict = {}
        for n in self.not_compared:
            gone.setdefault((n["topic"], n["partition"]), []).append(
                {k: n[k] for k in ("from", "until", "why")})
        named = {tp for side in ("missing", "unexpected")
                 for tp in found.get(f"{side}_by_partition", {})}
        for t, p in sorted(set(scope) | named):
            part = {"topic": t, "partition": p, "records": records.get((t, p), 0),
                    "not_compared": gone.get((t, p), []) + gone.get((t, None), [])}
            if "missing_by_partition" in found:
                part["missing"] = found["missing_by_partition"].get((t, p), 0)
                part["unexpected"] = found["unexpected_by_partition"].get((t, p), 0)
                part["verdict"] = verdict(bool(part["missing"] or part["unexpected"]),
                                          bool(part["not_compared"]), self.skip_lost)
            else:  # totals: the table's verdict is every partition's
                part["verdict"] = self.verdict
            self.partitions.append(part)


def check_filters(settings: Settings, partition, from_offset, to_offset,
                  topic: str | None = None) -> None:
    if partition is not None or from_offset is not None or to_offset is not None:
        raise ConfigError(
            f"pipeline '{settings.name}' (sink.mode = '{settings.sink.mode}'): its table is "
            "state made from every record, so verify compares all of it; --partition, "
            "--from and --to apply to append sinks only")
    if topic is not None and len(settings.kafka.topics) > 1:
        raise ConfigError(
            f"pipeline '{settings.name}' (sink.mode = '{settings.sink.mode}'): its table is "
            f"state made from the records of all its topics ({', '.join(settings.kafka.topics)})"
            ", so verify compares all of it: drop --topic")


def run_state_verify(settings: Settings, topic: str | None = None,
                     filters=None, skip_lost: bool = False,
                     topics: tuple[str, ...] | None = None) -> StateReport:
    """``filters`` (driver/verify.Filters): an append sink's window (``verify --values``);
    its rows are compared one by one, so any window is a true part of its state.
    ``topics``: the table's, in a pipeline of several tables (None: every topic published).
    ``skip_lost``: what Kafka no longer holds is out of the scope (listed, not a verdict)."""
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.driver.reconcile import clip
    from pipeline.driver.schema_probe import table_columns
    from pipeline.driver.verify import kafka_offsets
    from pipeline.executor.consume import reader_config
    from pipeline.executor.task import EncoderSettings
    from pipeline.sinks import for_settings
    from pipeline.store import Store

    settings = table_columns(settings)  # sink.columns = "schema": the table's
    k, sink = settings.kafka, for_settings(settings)
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-verify")
    encoder = EncoderSettings.for_settings(settings, 0).encoder()
    report = StateReport(settings.name, sink.mode, skip_lost=skip_lost)
    meta = KafkaMeta(k)
    with Store(settings) as store:
        store.schema.check([sink])
        state = store.state(sink)
        with store.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            plans = store.verification.published_plans()
            archived = store.verification.archiving_runs()
            ranges = published([p for _, p in plans], archived,
                               [run_id for run_id, _ in plans])
            # [sink] transactions: where each run's range started, per partition (what a
            # run's read task saw before a record: plan/replays.Identities).
            starts: dict | None = None
            if settings.sink.transactions is not None:
                starts = {}
                for run_id, planned in plans:
                    for d in planned:
                        if run_id >= archived.get(d["topic"], -1):  # as published() does
                            starts.setdefault((d["topic"], d["partition"]), set()).add(
                                d["from"])
            if sink.state_keeps_recreated_topics:
                # Totals kept through a topic's recreation count the old topic's records,
                # which Kafka no longer holds (sinks/aggregate.py).
                report.not_compared += [
                    {"topic": t, "partition": None, "from": None, "until": None,
                     "why": "the totals include records of the topic before it was "
                            "recreated"} for t in sorted(archived)
                    if t in settings.kafka.topics and topic in (None, t)]
            if topic is not None:
                ranges = {tp: rs for tp, rs in ranges.items() if tp[0] == topic}
            if topics is not None:
                ranges = {tp: rs for tp, rs in ranges.items() if tp[0] in topics}
            if filters is not None:
                ranges = {tp: list(clip(rs, w.from_offset, w.until_offset))
                          for tp, rs in ranges.items()
                          if filters.partition in (None, tp[1])
                          for w in [filters.window(*tp)]}
                ranges = {tp: rs for tp, rs in ranges.items() if rs}
            held = kafka_offsets(meta, sorted({t for t, _ in ranges}))
            for (t, p), rs in ranges.items():
                report.not_compared += lost(t, p, rs, held.get((t, p)))
            records: dict = {}
            found: dict = {}
            if report.not_compared and not state.names_records():
                report.nothing_compared = (
                    f"the {sink.mode} table's {'totals' if sink.mode == 'aggregate' else 'rows'}"
                    " are made from every record published, and Kafka no longer holds some")
            else:
                state.scratch(identities=starts is not None)
                for (t, p), rs in ranges.items():
                    records[(t, p)] = reread(
                        state, meta, reader, encoder, k.timeout_seconds, t, p, rs,
                        held.get((t, p)), report,
                        starts=None if starts is None else starts.get((t, p), ()))
                report.records = sum(records.values())
                if starts is not None:
                    report.replayed = state.leave_out_replays()
                lost_ranges = [(n["topic"], n["partition"], n["from"], n["until"])
                               for n in report.not_compared if n["partition"] is not None]
                if lost_ranges:
                    report.rows_not_compared = state.leave_out(lost_ranges)
                columns = state.recompute()
                found = state.differences(columns, bool(lost_ranges))
                for name in ("state_rows", "table_rows", "missing", "unexpected",
                             "missing_keys", "unexpected_keys"):
                    setattr(report, name, found[name])
            report.by_partition(ranges, records, found)
    log.info("verify %s (%s): %d records%s make %d rows, the table holds %d: %s",
             settings.name, sink.mode, report.records,
             f" ({report.replayed} written again by Kafka Connect, left out)"
             if report.replayed else "", report.state_rows, report.table_rows,
             report.verdict, extra={"event": "verify.state", "verdict": report.verdict})
    return report


def lost(topic: str, partition: int, ranges, held) -> list[dict]:
    """The published ``ranges`` of a partition Kafka no longer holds (``held``: its offsets
    now, None: the partition is gone)."""
    out = []
    for r in ranges:
        deleted = r if held is None else retained(r, held.earliest)[0]
        if deleted:
            out.append({"topic": topic, "partition": partition, "from": deleted.from_offset,
                        "until": deleted.until_offset, "why": "partition no longer in Kafka"
                        if held is None else "deleted by retention"})
    return out


def reread(state, meta, reader, encoder, timeout: float, topic: str, partition: int,
           ranges, held, report: StateReport, tries: int = 3, starts=None) -> int:
    """The records Kafka holds of the partition's published ``ranges``, encoded into the
    temp table; how many. Retention deleting records while they are read: the partition is
    read again from where its log starts now (what it took joins ``report.not_compared``).
    ``starts`` ([sink] transactions): where the runs' ranges started; each record's
    identity is staged too (plan/replays.py)."""
    from pipeline.driver.verify import partition_offsets

    for attempt in range(1, tries + 1):
        try:
            return _copy_held(state, reader, encoder, timeout, topic, partition, ranges, held,
                              starts)
        except TransientError as e:
            now = partition_offsets(meta, topic, partition)
            if held is None or now is None or now.earliest <= held.earliest:
                raise  # not retention: Kafka unreachable, say
            if attempt == tries:
                raise TransientError(
                    f"verify: retention deleted records of {topic}[{partition}] while verify "
                    f"read them, {tries} times over ({e.message}); verify again later") from None
            state.forget_records(topic, partition)
            report.not_compared = [n for n in report.not_compared
                                   if (n["topic"], n["partition"]) != (topic, partition)]
            report.not_compared += lost(topic, partition, ranges, now)
            held = now
    raise AssertionError("unreachable")


def _copy_held(state, reader, encoder, timeout: float, topic: str, partition: int, ranges,
               held, starts=None) -> int:
    from pipeline.driver.kafka_records import batches
    from pipeline.plan.offsets import OffsetRange
    from pipeline.plan.replays import Identities

    identities = None if starts is None else Identities(starts)
    n = 0
    for r in ranges if held is not None else []:
        start, end = max(r.from_offset, held.earliest), min(r.until_offset, held.latest)
        if end <= start:
            continue
        for batch in batches(reader, OffsetRange(topic, partition, start, end), timeout):
            if identities is None:
                rows, _, tombstones = encoder.encode(topic, partition, batch)
            else:
                (rows, _, tombstones), sources = encoder.transactions(topic, partition, batch)
                state.copy_identities(topic, partition, [
                    (m.offset(), i) for m, source in zip(batch, sources, strict=True)
                    if (i := identities.of(m.offset(), m.key(), m.value() is None, source))])
            state.copy_records(rows, tombstones, encoder.binary)
            n += len(batch)
    return n
