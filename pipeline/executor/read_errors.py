"""How a read task fails: RangeReadError (a typed TaskError naming the range), and the
broker's refusals of the reader (login, certificate, ACLs), which are the user's to fix."""

from __future__ import annotations

from pipeline.errors import Kind, TaskError, Where
from pipeline.plan.offsets import OffsetRange


class RangeReadError(TaskError):
    """Raised inside a Spark task when a range cannot be read exactly; it reaches the
    driver as a typed TaskError (errors.decode), naming the range it was reading."""

    def __init__(self, kind: Kind | str, message: str, r: OffsetRange | None = None):
        super().__init__(kind, message, None if r is None else Where(
            r.topic, r.partition, r.from_offset, r.until_offset))


def refused(err) -> bool:
    """The broker refused this reader: its login, its certificate, or an ACL."""
    from confluent_kafka import KafkaError

    return err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL,
                          KafkaError.GROUP_AUTHORIZATION_FAILED,
                          KafkaError.TOPIC_AUTHORIZATION_FAILED)


def refusal(config: dict, r: OffsetRange, err) -> RangeReadError:
    """The broker refused this reader (``refused``): the user's to fix, not retried."""
    group = config.get("group.id")
    return RangeReadError(
        Kind.CONFIG,
        f"Kafka at {config.get('bootstrap.servers')} refused the reader of {r} (user "
        f"'{config.get('sasl.username', '-')}', consumer group '{group}'): {err.str()}; "
        f"grant the user Describe and Read on the topic and on the group '{group}' (it only "
        "looks the group up, never commits), or fix its credentials; nothing committed", r)
