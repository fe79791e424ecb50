"""pipeline_offsets: where each pipeline resumes (the NEXT offset to read). Read by the
plan, moved only by compare-and-set inside the publishing transaction, or set by an
operator's 'offsets' run (with the archive of a recreated topic: store/archive.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, literal, select
from sqlalchemy import update as update_
from sqlalchemy.dialects.postgresql import JSONB, insert

from pipeline.errors import ConflictError
from pipeline.plan.offsets import PlannedPartition, TopicPartition
from pipeline.store.archive import Archive
from pipeline.store.results import Sink
from pipeline.store.run import Run
from pipeline.store.session import Session
from pipeline.store.tables import offsets, runs


class Offsets:
    """The stored offsets, on the Store's session (``store.offsets``)."""

    def __init__(self, db: Session, archive: Archive):
        self.db, self.archive = db, archive

    def load(self, topics: Sequence[str] | None = None) -> dict[TopicPartition, int]:
        rows = self.db.run(select(offsets.c.topic, offsets.c.partition, offsets.c.next_offset)
                           .where(offsets.c.pipeline == self.db.pipeline)).all()
        return {(t, p): o for t, p, o in rows if topics is None or t in topics}

    def topic_ids(self, topics: Sequence[str]) -> dict[str, set[str]]:
        """The Kafka topic IDs the stored offsets of each topic belong to (one, normally;
        rows stored before IDs were have none)."""
        out: dict[str, set[str]] = {}
        for topic, topic_id in self.db.run(
                select(offsets.c.topic, offsets.c.topic_id).distinct()
                .where(offsets.c.pipeline == self.db.pipeline,
                       offsets.c.topic.in_(list(topics)),
                       offsets.c.topic_id.is_not(None))).all():
            out.setdefault(topic, set()).add(topic_id)
        return out

    def rows(self) -> list[dict[str, Any]]:
        """pipeline_offsets of this pipeline, with the run that last moved each offset
        (what 'pipeline lag' and 'offsets show' print)."""
        o, r = offsets, runs
        return [dict(row._mapping) for row in self.db.run(
            select(o.c.topic, o.c.partition, o.c.next_offset, o.c.topic_id, o.c.updated_at,
                   o.c.run_id, r.c.kind.label("run_kind"),
                   r.c.finished_at.label("run_finished_at"))
            .select_from(o.outerjoin(r, r.c.run_id == o.c.run_id))
            .where(o.c.pipeline == self.db.pipeline).order_by(o.c.topic, o.c.partition))]

    def compare_and_set(self, run: Run, updates: Sequence[PlannedPartition],
                        topic_ids: dict[str, str] | None = None) -> None:
        """Invariant 2: move each offset only from the value the plan started from. A stale
        plan, a zombie or a concurrent run matches no row, and the whole transaction rolls
        back."""
        for u in updates:
            r = u.range
            topic_id = (topic_ids or {}).get(r.topic)
            if u.stored is None:
                n = self.db.run(insert(offsets).values(
                    pipeline=self.db.pipeline, topic=r.topic, partition=r.partition,
                    next_offset=r.until_offset, run_id=run.id, topic_id=topic_id)
                    .on_conflict_do_nothing()).rowcount
            else:
                # The plan checked the stored ID against Kafka's; a legacy row gets it here.
                n = self.db.run(update_(offsets).where(
                    offsets.c.pipeline == self.db.pipeline, offsets.c.topic == r.topic,
                    offsets.c.partition == r.partition, offsets.c.next_offset == u.stored)
                    .values(next_offset=r.until_offset, updated_at=func.now(), run_id=run.id,
                            topic_id=func.coalesce(topic_id, offsets.c.topic_id))).rowcount
            if n != 1:
                current = self.db.run(select(offsets.c.next_offset).where(
                    offsets.c.pipeline == self.db.pipeline, offsets.c.topic == r.topic,
                    offsets.c.partition == r.partition)).scalar()
                raise ConflictError(
                    f"{r.topic}[{r.partition}]: stored next offset is "
                    f"{'absent' if current is None else current}, expected "
                    f"{'absent' if u.stored is None else u.stored}: another run already "
                    f"published [{r.from_offset}, {r.until_offset}); rolled back, nothing "
                    "written twice - rerun to plan from the stored offsets")

    def change(self, changes: dict[TopicPartition, int | None], run: Run,
               topic_ids: dict[str, str] | None = None,
               archive: dict[str, list[str]] | None = None,
               sinks: Sequence[Sink] = ()) -> dict[str, dict[str, int]]:
        """Set (or, for None, forget) stored offsets, with their topic's Kafka ID, and mark
        the run that records the change succeeded: one transaction, so a failure half-way
        changes nothing. ``archive``: topics recreated under the same name (old IDs) whose
        result rows (in the ``sinks``' tables) and dead letters move to the archive tables
        in the same transaction, so the new topic's records at reused offsets are written,
        not taken as present."""
        archived = {}
        db = self.db
        with db.transaction() as conn:
            db.set_timeouts(conn)
            for topic, old_ids in sorted((archive or {}).items()):
                archived[topic] = self.archive.archive_topic(conn, topic, ", ".join(old_ids),
                                                             run.id, sinks)
            for (topic, partition), offset in sorted(changes.items()):
                if offset is None:
                    self.db.run(delete(offsets).where(
                        offsets.c.pipeline == self.db.pipeline, offsets.c.topic == topic,
                        offsets.c.partition == partition))
                    continue
                row = insert(offsets).values(
                    pipeline=self.db.pipeline, topic=topic, partition=partition,
                    next_offset=offset, run_id=run.id, topic_id=(topic_ids or {}).get(topic))
                self.db.run(row.on_conflict_do_update(
                    index_elements=list(offsets.primary_key), set_={
                        "next_offset": row.excluded.next_offset, "updated_at": func.now(),
                        "run_id": row.excluded.run_id, "topic_id": row.excluded.topic_id}))
            self.db.run(update_(runs).where(runs.c.run_id == run.id).values(
                status="succeeded", finished_at=func.clock_timestamp(), exit_code=0,
                details=func.coalesce(runs.c.details, literal({}, JSONB)).op(
                    "||", return_type=JSONB)(
                    literal({"archived": archived} if archived else {}, JSONB))))
        return archived
