"""Debezium's transaction topic (``[sink] transactions``), read on the driver: the END
events from the pipeline's stored offset of the topic to its latest, as
plan/transactions.TransactionEnd values, for the run's cut at whole source transactions.

With ``provide.transaction.metadata=true`` the connector writes a BEGIN and an END per
source transaction to ``<topic.prefix>.transaction``, in commit order, with the same
converter as its changes: JSON (with or without Kafka Connect's schema envelope) or Avro
in the Confluent wire format (decoded by the writer schema's id, [schema_registry]). A few
small records per transaction: they are read here, with the executors' exact range reader
(executor/consume.py), not by Spark.

The topic's offset is stored like a data topic's (pipeline_offsets, partition 0): the run
moves it to TransactionCut.metadata_next in its publishing transaction
(``TransactionTopicRead.offset_update``), by the same compare-and-set.

What goes wrong, decided here once:
- the topic does not exist: exit 2 naming ``provide.transaction.metadata`` (the connector
  writes no metadata, or ``sink.transactions`` names another topic);
- more than one partition: exit 2 (commit order is one partition's order);
- its stored offset is below its earliest (retention deleted ENDs not read yet):
  ``kafka.on_data_loss`` ``fail`` exits 3 naming the lost offsets and the fix; ``skip``
  reads from the earliest offset and says so (``lost``); that run cuts by the first run's
  rules (``first_run``), which pass a transaction whose END was deleted once a later
  transaction's END follows it, instead of letting it wait for ever;
- a record that is not a transaction event: exit 3 naming its offset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from pipeline.config import Settings
from pipeline.errors import ConfigError, DataError
from pipeline.plan.offsets import OffsetRange, PlannedPartition, TopicPartition
from pipeline.plan.transactions import TransactionEnd

log = logging.getLogger(__name__)

PARTITION = 0
METADATA_SETTING = "provide.transaction.metadata"


@dataclass(frozen=True)
class TransactionTopicRead:
    """What one run read of the transaction topic ``topic``: ``ends`` in offset order, of
    ``[start, latest)``; ``stored``: the stored next offset (None: none yet); ``lost``: the
    offsets retention deleted before they were read (on_data_loss = skip); ``topic_id``:
    Kafka's ID of the topic, stored with its offset."""

    topic: str
    stored: int | None
    start: int
    latest: int
    ends: tuple[TransactionEnd, ...]
    lost: OffsetRange | None = None
    topic_id: str | None = None

    @property
    def first_run(self) -> bool:
        """Cut by the first run's rules (plan/transactions.cut_at_transactions' first_run):
        no offset stored yet, or ENDs lost to retention."""
        return self.stored is None or self.lost is not None

    def offset_update(self, metadata_next: int | None) -> PlannedPartition | None:
        """The compare-and-set of the topic's stored offset (store.offsets.compare_and_set)
        to the cut's ``metadata_next``; None when it stays (nothing passed and nothing
        skipped)."""
        until = self.start if metadata_next is None else metadata_next
        if not self.start <= until <= self.latest:
            raise ValueError(f"{self.topic}[{PARTITION}]: next offset {until} is outside what "
                             f"was read [{self.start}, {self.latest})")
        update = PlannedPartition(OffsetRange(self.topic, PARTITION, self.start, until),
                                  self.stored, self.lost)
        return update if update.moves_offset or self.lost is not None else None


def check_position(settings: Settings, meta, stored: Mapping[TopicPartition, int]) -> None:
    """Before anything is read: the transaction topic exists with one partition, and its
    stored offset is not behind its earliest under on_data_loss = fail (read_transaction_ends
    checks all of it again after the read)."""
    _position(settings, meta, stored, quiet=True)


def read_transaction_ends(settings: Settings, meta, stored: Mapping[TopicPartition, int],
                          data_topics=(), earlier: TransactionTopicRead | None = None
                          ) -> TransactionTopicRead:
    """The END events of ``[sink] transactions`` from ``stored`` (store.offsets.load of the
    topic; its earliest offset when none) to its latest. ``meta``: the run's KafkaMeta;
    ``data_topics``: the topics the run reads (the transaction topic must not be one);
    ``earlier``: what this run read of the topic while Spark read the data
    (driver/transaction_prefetch.py), whose ENDs are kept where it read the same start
    (``continued``): then only the offsets after it are read."""
    topic = settings.sink.transactions
    if topic in data_topics:
        raise ConfigError(f"'sink.transactions' = {topic!r} is also one of the topics the "
                          "pipeline reads: it holds BEGIN/END events, not changes; take it out "
                          "of the pipeline's topics")
    topic_id, current, start, latest, lost = _position(settings, meta, stored)
    ends, resumed = continued(earlier, current, start, latest,
                              lambda a, b: _ends(settings, topic, a, b))
    log.info("transaction topic %s[%d] [%d, %d): %d END events%s", topic, PARTITION, start,
             latest, len(ends), f" ([{start}, {resumed}) read during the data's read)"
             if resumed > start else "",
             extra={"event": "transactions.read", "topic": topic, "from": start,
                    "until": latest, "ends": len(ends), "read_before": resumed - start})
    return TransactionTopicRead(topic, current, start, latest, ends, lost, topic_id)


def planned_read(settings: Settings, meta, stored: Mapping[TopicPartition, int]
                 ) -> TransactionTopicRead:
    """The read read_transaction_ends would do now, its ENDs not read yet (``ends`` empty):
    for the read ahead of driver/transaction_prefetch.py. Raises as read_transaction_ends
    does (a data loss skipped is not logged here: the run's own read logs it)."""
    topic_id, current, start, latest, lost = _position(settings, meta, stored, quiet=True)
    return TransactionTopicRead(settings.sink.transactions, current, start, latest, (), lost,
                                topic_id)


def read_planned(settings: Settings, planned: TransactionTopicRead, stop=None
                 ) -> TransactionTopicRead:
    """``planned`` (planned_read) with its ENDs read; ``stop()`` true between two batches
    gives up (raises Abandoned)."""
    return replace(planned, ends=tuple(_ends(settings, planned.topic, planned.start,
                                             planned.latest, stop)))


class Abandoned(Exception):
    """A read ahead given up (read_planned's ``stop``)."""


def continued(earlier: TransactionTopicRead | None, stored: int | None, start: int,
              latest: int, read: Callable[[int, int], Iterable[TransactionEnd]]
              ) -> tuple[tuple[TransactionEnd, ...], int]:
    """(the END events of ``[start, latest)``, the offset up to which ``earlier`` gave
    them): ``earlier``'s ENDs and ``read(earlier.latest, latest)`` where ``earlier`` read
    from the same stored offset and start and ``latest`` is not below its end; else
    ``read(start, latest)`` alone, as if there were no earlier read (a start that moved: an
    offset stored meanwhile, ENDs lost to retention and skipped; a topic whose end went
    back). ``read``: the ENDs of ``[a, b)`` in offset order. Pure but for ``read``."""
    if (earlier is None or earlier.stored != stored or earlier.start != start
            or not earlier.start <= earlier.latest <= latest):
        return tuple(read(start, latest)), start
    return earlier.ends + tuple(read(earlier.latest, latest)), earlier.latest


def _position(settings: Settings, meta, stored: Mapping[TopicPartition, int],
              quiet: bool = False):
    """(topic id, stored offset, where to read from, latest, lost range) of the
    transaction topic; every rule of the module's docstring but the records'."""
    topic = settings.sink.transactions
    if topic is None:
        raise ValueError("[sink] transactions is not set")
    try:
        topic_id, partitions = meta.describe([topic])[topic]
    except DataError:  # does not exist
        raise ConfigError(
            f"the transaction topic '{topic}' ([sink] transactions) does not exist on "
            f"{settings.kafka.bootstrap_servers}: set {METADATA_SETTING}=true on the Debezium "
            "connector (it then writes <topic.prefix>.transaction), or point sink.transactions "
            "at its transaction topic; nothing was read") from None
    if partitions != [PARTITION]:
        raise ConfigError(
            f"the transaction topic '{topic}' has partitions {partitions}: its END events are "
            "in commit order only within one partition; recreate it with one partition "
            "(Kafka Connect's topic.creation settings of the connector); nothing was read")
    (held,) = meta.offsets([(topic, PARTITION)])
    current = stored.get((topic, PARTITION))
    lost = None
    if current is None:
        start = held.earliest
    elif current > held.latest:
        raise DataError(
            f"{topic}[{PARTITION}]: stored next offset {current} is beyond the latest offset "
            f"{held.latest} (the transaction topic recreated, or another cluster?); reset it "
            f"with 'pipeline offsets set --topic {topic} --partition {PARTITION} --to "
            f"{held.earliest}'; nothing was read")
    elif current < held.earliest:
        lost = OffsetRange(topic, PARTITION, current, held.earliest)
        if settings.kafka.on_data_loss != "skip":
            raise DataError(
                f"data loss: the transaction topic {topic}[{PARTITION}] offsets [{current}, "
                f"{held.earliest}) were deleted (retention) before they were read, so the END "
                "events of the source transactions they held are gone and their changes cannot "
                "be checked whole; give the topic a longer retention than the pipeline's lag, "
                "or set kafka.on_data_loss = 'skip' to go on from offset "
                f"{held.earliest} (the run passes transactions whose END is gone once a later "
                "one follows them, and records the gap); nothing was read")
        if not quiet:
            log.warning("data loss skipped (on_data_loss=skip): transaction topic %s deleted "
                        "before it was read; transactions whose END was there pass unchecked",
                        lost, extra={"event": "transactions.data_loss_skipped",
                                     **lost.as_dict()})
        start = held.earliest
    else:
        start = current
    return topic_id, current, start, held.latest, lost


def _ends(settings: Settings, topic: str, start: int, until: int, stop=None):
    """The END events of ``[start, until)``, in offset order; ``stop()`` true between two
    batches raises Abandoned."""
    if until <= start:
        return
    from pipeline.driver.kafka_records import batches
    from pipeline.executor.consume import reader_config

    k = settings.kafka
    reader = reader_config(k.client_config(), k.isolation_level, f"{settings.name}-transactions")
    payload = _payloads(settings)
    for batch in batches(reader, OffsetRange(topic, PARTITION, start, until),
                         k.timeout_seconds, "transaction topic"):
        if stop is not None and stop():
            raise Abandoned(f"the read of {topic}[{PARTITION}] [{start}, {until}) given up")
        for m in batch:
            value = m.value()
            if value is None:
                continue  # a tombstone: no transaction event
            try:
                doc = payload(value)
            except ValueError as e:  # not JSON (orjson's error is one), not Avro
                raise decode_error(topic, m.offset(), str(e) or type(e).__name__) from None
            end = _event(doc, topic, m.offset())
            if end is not None:
                yield end


def _payloads(settings: Settings):
    """The transaction topic's values -> their events (``payload`` of Kafka Connect's JSON
    with schemas): Avro in the Confluent wire format by the registry (sink.format =
    "avro", the connector's converter), else JSON. With the schema envelope only the
    payload is parsed, where the schema before it (the same for every event) parses alone
    (formats/debezium/plans.py: the split is exact, anything else the whole value's parse):
    the schema is most of an event's bytes."""
    if settings.sink.format != "avro":
        import orjson

        from pipeline.formats.debezium.plans import UNPLANNABLE, Plans

        loads = orjson.loads
        schemas = Plans(loads, lambda schema: True)

        def json(value: bytes):
            plan, payload = schemas.of(value)
            if plan is not UNPLANNABLE:
                try:
                    return loads(payload)
                except ValueError:  # the whole value's parse says why
                    pass
            return _unwrapped(loads(value))
        return json
    from fastavro import schemaless_reader

    from pipeline.formats.avro.format import decode_wire
    from pipeline.formats.refused import Refused

    def avro(value: bytes):
        try:
            return _unwrapped(decode_wire(settings.schema_registry, value, schemaless_reader,
                                          "value")[0])
        except Refused as e:
            raise _NotAnEvent(e.message) from None
    return avro


class _NotAnEvent(ValueError):
    pass


def _unwrapped(doc):
    """Kafka Connect's JSON with schemas: the payload; anything else as it is."""
    if type(doc) is dict and "payload" in doc and "schema" in doc and len(doc) == 2:
        return doc["payload"]
    return doc


def parse_event(doc, topic: str, offset: int) -> TransactionEnd | None:
    """A transaction event's value (parsed JSON, with or without the schema envelope, or a
    decoded Avro record) -> its TransactionEnd, None for a BEGIN. Raises DataError naming
    the offset for anything else."""
    return _event(_unwrapped(doc), topic, offset)


def _event(doc, topic: str, offset: int) -> TransactionEnd | None:
    """parse_event of an event without the schema envelope."""
    status = doc.get("status") if type(doc) is dict else None
    if status == "BEGIN":
        return None
    try:
        if status != "END":
            raise ValueError(f"status {status!r}, not BEGIN or END")
        tid = doc["id"]
        collections = doc["data_collections"] or ()
        events = {c["data_collection"]: c["event_count"] for c in collections}
        if (type(tid) is not str or not all(type(n) is int and n >= 0 for n in events.values())
                or not all(type(c) is str for c in events)):
            raise ValueError("an id or event count of the wrong type")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DataError(
            f"{topic}[{PARTITION}] offset {offset} is not a Debezium transaction event ({e}); "
            "sink.transactions must name the connector's transaction topic "
            f"(<topic.prefix>.transaction, {METADATA_SETTING}=true); nothing was "
            "published") from None
    return TransactionEnd(tid.partition(":")[0], offset, events)


def decode_error(topic: str, offset: int, why: str) -> DataError:
    return DataError(f"{topic}[{PARTITION}] offset {offset} does not decode ({why}); "
                     "sink.transactions must name the connector's transaction topic, written "
                     "by the same converter as its changes (sink.format); nothing was published")

