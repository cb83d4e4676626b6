"""Creating the job's topics, idempotently, with the cleanup policy of the contract; the events
topic's record times stamped by the broker (``LogAppendTime``: the log's clock, ``core/clock.py``)."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from safepoint.errors import BrokerError

__all__ = ["LIBRDKAFKA_LOGGER", "LOG_APPEND_TIME", "TIMESTAMP_LOG_APPEND_TIME", "REACH_TIMEOUT_S", "check_reachable", "ensure_topics", "quiet",
           "timestamp_type", "topic_ends", "topic_specs"]

LOG_APPEND_TIME = "LogAppendTime"
TIMESTAMP_TYPE = "message.timestamp.type"
TIMESTAMP_LOG_APPEND_TIME = 2
"""librdkafka's timestamp type of a record stamped by the broker (``LogAppendTime``): the log's own
clock, which no producer can move (``core/clock.py``); readers take a record's time only then."""


BROKER_DEFAULT = -1
"""The replication factor of a topic the project makes: the broker's own ``default.replication.factor``
(its ``min.insync.replicas`` likewise), so a cluster of three keeps three copies and one broker
alone keeps one."""


def topic_specs(topics: dict[str, str], events_partitions: int, log_append_time: bool = True) -> list[NewTopic]:
    """The contract's topics: events and, where set, control (delete; their records stamped by the
    broker, unless ``log_append_time`` is False: then they keep the times their producers give, as a
    log written by a test with its events' own times does; the control topic has one partition:
    its events are few, and a cluster's are ordered), directives (compact), alerts and dead letters
    (delete), and where set the accounting (delete) and status (compact) topics. Each is replicated
    as the broker's defaults say (``BROKER_DEFAULT``)."""
    events = {"cleanup.policy": "delete", **({TIMESTAMP_TYPE: LOG_APPEND_TIME} if log_append_time else {})}
    delete, compact = {"cleanup.policy": "delete"}, {"cleanup.policy": "compact"}

    def one(name: str, config: dict[str, str]) -> NewTopic:
        return NewTopic(name, num_partitions=1, replication_factor=BROKER_DEFAULT, config=config)

    return [
        NewTopic(topics["events"], num_partitions=events_partitions, replication_factor=BROKER_DEFAULT, config=events),
        one(topics["directives"], compact),
        one(topics["alerts"], delete),
        one(topics["deadletter"], delete),
    ] + ([one(topics["control"], events)] if topics.get("control") else []) + (
        [one(topics["accounting"], delete)] if topics.get("accounting") else []) + (
        [one(topics["status"], compact)] if topics.get("status") else [])


REACH_TIMEOUT_S = 10.0
"""How long a command tries to reach the broker before it gives up with one line."""
LIBRDKAFKA_LOGGER = "safepoint.librdkafka"
"""The Python logger that takes librdkafka's own log lines from the command-line clients (the CLI
shows them with ``-v`` only: an unreachable broker otherwise prints one FAIL line per retry)."""


def quiet(conf: dict[str, Any]) -> dict[str, Any]:
    """``conf`` with librdkafka's log lines sent to ``LIBRDKAFKA_LOGGER`` instead of stderr."""
    return conf if "logger" in conf else {**conf, "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}


def _unreachable(conf: dict[str, Any], timeout_s: float, exc: Exception) -> BrokerError:
    msg = (f"cannot reach the Kafka broker at {conf.get('bootstrap.servers')} (tried for {timeout_s:.0f} s: {exc}); "
           "check --bootstrap and that the broker runs")
    return BrokerError(msg)


def check_reachable(conf: dict[str, Any], timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise ``BrokerError`` (one line) unless the broker answers a metadata request in time."""
    try:
        AdminClient(quiet(conf)).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise _unreachable(conf, timeout_s, exc) from exc


def topic_ends(conf: dict[str, Any], topic: str, timeout_s: float = REACH_TIMEOUT_S) -> dict[int, int]:
    """The end offset (high watermark) of every partition of ``topic``; {} when it does not exist."""
    from confluent_kafka import Consumer

    from safepoint.connectors.kafka.clients import watermarks

    consumer = Consumer(quiet({**conf, "group.id": "safepoint-topic-ends", "enable.auto.commit": False}))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {p: watermarks(consumer, topic, p, timeout_s)[1] for p in sorted(meta.partitions)}
    except KafkaException as exc:
        raise _unreachable(conf, timeout_s, exc) from exc
    finally:
        consumer.close()


def timestamp_type(conf: dict[str, Any], topic: str, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """The topic's ``message.timestamp.type`` (``CreateTime`` or ``LogAppendTime``); None when the
    broker does not say."""
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    admin = AdminClient(quiet(conf))
    try:
        for fut in admin.describe_configs([ConfigResource("topic", topic)]).values():
            entry = fut.result(timeout_s).get(TIMESTAMP_TYPE)
            return None if entry is None else str(entry.value)
    except KafkaException:
        return None
    return None


def ensure_topics(conf: dict[str, Any], specs: list[NewTopic], timeout_s: float = REACH_TIMEOUT_S) -> list[str]:
    """Create the topics that do not exist yet. Returns the names created."""
    admin = AdminClient(quiet(conf))
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise _unreachable(conf, timeout_s, exc) from exc
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
            if "AUTHORIZATION_FAILED" in str(exc):
                msg = (f"cannot create topic {name}: the broker refused it to {conf.get('sasl.username') or 'this principal'} "
                       "(no CREATE on the topic or the cluster); create the topic beforehand as an administrator, or grant "
                       "CREATE (the security page, Kafka ACLs)")
            else:
                msg = f"cannot create topic {name}: {exc}"
            raise BrokerError(msg) from exc
    _wait_led(conf, created, timeout_s)
    return created


def _wait_led(conf: dict[str, Any], names: list[str], timeout_s: float) -> None:
    """Wait until every partition of the topics ``names`` answers an offsets request: a broker takes
    up the leadership of a topic just made a moment after it said the topic exists (Apache Kafka
    answers ``NOT_LEADER_FOR_PARTITION`` meanwhile)."""
    if not names:
        return
    from confluent_kafka import Consumer

    from safepoint.connectors.kafka.clients import watermarks

    consumer = Consumer(quiet({**conf, "group.id": "safepoint-topic-ends", "enable.auto.commit": False}))
    try:
        for name in names:
            meta = consumer.list_topics(name, timeout=timeout_s).topics.get(name)
            for p in sorted(meta.partitions if meta is not None else ()):
                watermarks(consumer, name, p, timeout_s)
    except KafkaException as exc:
        msg = f"the topics {', '.join(names)} were made but do not answer yet: {exc}"
        raise BrokerError(msg) from exc
    finally:
        consumer.close()
