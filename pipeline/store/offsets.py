"""pipeline_offsets: where each pipeline resumes (the NEXT offset to read). Read by the
plan, moved only by compare-and-set inside the publishing transaction, or set by an
operator's 'offsets' run."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, literal, select
from sqlalchemy import update as update_
from sqlalchemy.dialects.postgresql import JSONB, insert

from pipeline.errors import ConflictError
from pipeline.plan.offsets import PlannedPartition, TopicPartition
from pipeline.store.archive import Archive
from pipeline.store.run import Run
from pipeline.store.tables import offsets, runs


class Offsets(Archive):
    def load_offsets(self, topics: Sequence[str] | None = None) -> dict[TopicPartition, int]:
        rows = self.run(select(offsets.c.topic, offsets.c.partition, offsets.c.next_offset)
                        .where(offsets.c.pipeline == self.pipeline)).all()
        return {(t, p): o for t, p, o in rows if topics is None or t in topics}

    def load_topic_ids(self, topics: Sequence[str]) -> dict[str, set[str]]:
        """The Kafka topic IDs the stored offsets of each topic belong to (one, normally;
        rows stored before IDs were have none)."""
        out: dict[str, set[str]] = {}
        for topic, topic_id in self.run(
                select(offsets.c.topic, offsets.c.topic_id).distinct()
                .where(offsets.c.pipeline == self.pipeline, offsets.c.topic.in_(list(topics)),
                       offsets.c.topic_id.is_not(None))).all():
            out.setdefault(topic, set()).add(topic_id)
        return out

    def compare_and_set_offsets(self, run: Run, updates: Sequence[PlannedPartition],
                                topic_ids: dict[str, str] | None = None) -> None:
        """Invariant 2: move each offset only from the value the plan started from. A stale
        plan, a zombie or a concurrent run matches no row, and the whole transaction rolls
        back."""
        for u in updates:
            r = u.range
            topic_id = (topic_ids or {}).get(r.topic)
            if u.stored is None:
                n = self.run(insert(offsets).values(
                    pipeline=self.pipeline, topic=r.topic, partition=r.partition,
                    next_offset=r.until_offset, run_id=run.id, topic_id=topic_id)
                    .on_conflict_do_nothing()).rowcount
            else:
                # The plan checked the stored ID against Kafka's; a legacy row gets it here.
                n = self.run(update_(offsets).where(
                    offsets.c.pipeline == self.pipeline, offsets.c.topic == r.topic,
                    offsets.c.partition == r.partition, offsets.c.next_offset == u.stored)
                    .values(next_offset=r.until_offset, updated_at=func.now(), run_id=run.id,
                            topic_id=func.coalesce(topic_id, offsets.c.topic_id))).rowcount
            if n != 1:
                current = self.run(select(offsets.c.next_offset).where(
                    offsets.c.pipeline == self.pipeline, offsets.c.topic == r.topic,
                    offsets.c.partition == r.partition)).scalar()
                raise ConflictError(
                    f"{r.topic}[{r.partition}]: stored next offset is "
                    f"{'absent' if current is None else current}, expected "
                    f"{'absent' if u.stored is None else u.stored}: another run already "
                    f"published [{r.from_offset}, {r.until_offset}); rolled back, nothing "
                    "written twice - rerun to plan from the stored offsets")

    def set_offsets(self, changes: dict[TopicPartition, int | None], run: Run,
                    topic_ids: dict[str, str] | None = None,
                    archive: dict[str, list[str]] | None = None) -> dict[str, dict[str, int]]:
        """Set (or, for None, forget) stored offsets, with their topic's Kafka ID, and mark
        the run that records the change succeeded: one transaction, so a failure half-way
        changes nothing. ``archive``: topics recreated under the same name (old IDs) whose
        result rows and dead letters move to the archive tables in the same transaction,
        so the new topic's records at reused offsets are written, not taken as present."""
        archived = {}
        with self.transaction() as conn:
            self.set_timeouts(conn)
            for topic, old_ids in sorted((archive or {}).items()):
                archived[topic] = self.archive_topic(conn, topic, ", ".join(old_ids), run.id)
            for (topic, partition), offset in sorted(changes.items()):
                if offset is None:
                    self.run(delete(offsets).where(
                        offsets.c.pipeline == self.pipeline, offsets.c.topic == topic,
                        offsets.c.partition == partition))
                    continue
                row = insert(offsets).values(
                    pipeline=self.pipeline, topic=topic, partition=partition,
                    next_offset=offset, run_id=run.id, topic_id=(topic_ids or {}).get(topic))
                self.run(row.on_conflict_do_update(
                    index_elements=list(offsets.primary_key), set_={
                        "next_offset": row.excluded.next_offset, "updated_at": func.now(),
                        "run_id": row.excluded.run_id, "topic_id": row.excluded.topic_id}))
            self.run(update_(runs).where(runs.c.run_id == run.id).values(
                status="succeeded", finished_at=func.clock_timestamp(), exit_code=0,
                details=func.coalesce(runs.c.details, literal({}, JSONB)).op(
                    "||", return_type=JSONB)(
                    literal({"archived": archived} if archived else {}, JSONB))))
        return archived
