"""``pipeline verify`` of an upsert or aggregate sink: its table is state made from many
records, not one row per offset, so the state is recomputed from Kafka and compared. Also
``verify --values`` of an append sink: each row compared with the row its record makes.

Every range succeeded runs published is re-read (as driver/verify.py reads them), encoded
as the executors encode it (formats.encode.Encoder: the same rows, dead letters and
tombstones) and streamed into a temporary table; Postgres then computes the newest record
per key (upsert) or the totals per group (aggregate) and compares them with the table both
ways (store/state.py). One REPEATABLE READ transaction: the run rows and the table as of one
moment. The state can only be recomputed from every record published: when retention has
deleted some, nothing is compared and the report says why."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from pipeline.config import Settings
from pipeline.driver.reconcile import published
from pipeline.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class StateReport:
    pipeline: str
    mode: str
    records: int = 0  # Kafka records re-read
    state_rows: int = 0  # rows the records make (keys, groups)
    table_rows: int = 0
    missing: int = 0  # state rows the table lacks or holds otherwise
    unexpected: int = 0  # table rows the state does not make
    missing_keys: list[list[str]] = field(default_factory=list)
    unexpected_keys: list[list[str]] = field(default_factory=list)
    not_verifiable: list[dict] = field(default_factory=list)  # {topic, partition, why}

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected)

    @property
    def compared(self) -> bool:
        return not self.not_verifiable

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "compared": self.compared}


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
                     filters=None) -> StateReport:
    """``filters`` (driver/verify.Filters): an append sink's window (``verify --values``);
    its rows are compared one by one, so any window is a true part of its state."""
    from pipeline.driver.kafka_meta import KafkaMeta
    from pipeline.driver.kafka_records import batches
    from pipeline.driver.reconcile import clip
    from pipeline.driver.verify import kafka_offsets
    from pipeline.executor.consume import reader_config
    from pipeline.executor.task import EncoderSettings
    from pipeline.plan.offsets import OffsetRange
    from pipeline.store import Store

    k, sink = settings.kafka, settings.sink
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-verify")
    encoder = EncoderSettings.for_settings(settings, 0).encoder()
    report = StateReport(settings.name, sink.mode)
    with Store(settings) as store:
        store.check_schema()
        with store.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            plans = store.published_plans()
            archived = store.archiving_runs()
            ranges = published([p for _, p in plans], archived,
                               [run_id for run_id, _ in plans])
            if store.sink.state_keeps_recreated_topics:
                # Totals kept through a topic's recreation count the old topic's records,
                # which Kafka no longer holds (sinks/aggregate.py).
                report.not_verifiable += [
                    {"topic": t, "partition": None,
                     "why": "the totals include records of the topic before it was "
                            "recreated"} for t in sorted(archived)
                    if t in settings.kafka.topics and topic in (None, t)]
            if topic is not None:
                ranges = {tp: rs for tp, rs in ranges.items() if tp[0] == topic}
            if filters is not None:
                ranges = {tp: list(clip(rs, w.from_offset, w.until_offset))
                          for tp, rs in ranges.items()
                          if filters.partition in (None, tp[1])
                          for w in [filters.window(*tp)]}
                ranges = {tp: rs for tp, rs in ranges.items() if rs}
            held = kafka_offsets(KafkaMeta(k), sorted({t for t, _ in ranges}))
            for (t, p), rs in ranges.items():
                h = held.get((t, p))
                if h is None or h.earliest > rs[0].from_offset:
                    report.not_verifiable.append({
                        "topic": t, "partition": p,
                        "why": "partition no longer in Kafka" if h is None else
                        f"records before offset {h.earliest} deleted by retention"})
            if report.not_verifiable:
                return report
            store.state_scratch()
            for (t, p), rs in ranges.items():
                for r in rs:
                    end = min(r.until_offset, held[(t, p)].latest)
                    if end <= r.from_offset:
                        continue
                    for batch in batches(reader, OffsetRange(t, p, r.from_offset, end),
                                         k.timeout_seconds):
                        rows, _, tombstones = encoder.encode(t, p, batch)
                        store.copy_records(rows, tombstones, encoder.binary)
                        report.records += len(batch)
            columns = store.recompute_state()
            for name, value in store.state_differences(columns).items():
                setattr(report, name, value)
    log.info("verify %s (%s): %d records make %d rows, the table holds %d: %s",
             settings.name, sink.mode, report.records, report.state_rows, report.table_rows,
             "match" if report.ok else "MISMATCH", extra={"event": "verify.state",
                                                           "ok": report.ok})
    return report
