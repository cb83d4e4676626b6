"""Creating the job's topics, idempotently, with the cleanup policy of the contract."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from safepoint.errors import BrokerError

__all__ = ["ensure_topics", "topic_specs"]


def topic_specs(topics: dict[str, str], events_partitions: int) -> list[NewTopic]:
    """The contract's topics: events (delete), directives (compact), alerts and dead letters (delete)."""
    return [
        NewTopic(topics["events"], num_partitions=events_partitions, replication_factor=1, config={"cleanup.policy": "delete"}),
        NewTopic(topics["directives"], num_partitions=1, replication_factor=1, config={"cleanup.policy": "compact"}),
        NewTopic(topics["alerts"], num_partitions=1, replication_factor=1, config={"cleanup.policy": "delete"}),
        NewTopic(topics["deadletter"], num_partitions=1, replication_factor=1, config={"cleanup.policy": "delete"}),
    ] + ([NewTopic(topics["accounting"], num_partitions=1, replication_factor=1, config={"cleanup.policy": "delete"})]
         if topics.get("accounting") else [])


def ensure_topics(conf: dict[str, Any], specs: list[NewTopic], timeout_s: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet. Returns the names created."""
    admin = AdminClient(conf)
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        msg = f"cannot list topics at {conf.get('bootstrap.servers')}: {exc}; is the broker running?"
        raise BrokerError(msg) from exc
    missing = [s for s in specs if s.topic not in existing]
    created: list[str] = []
    if not missing:
        return created
    for name, fut in admin.create_topics(missing, operation_timeout=timeout_s).items():
        try:
            fut.result(timeout_s)
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" in str(exc) or "already exists" in str(exc):
                continue
            msg = f"cannot create topic {name}: {exc}"
            raise BrokerError(msg) from exc
    return created
