"""The node client's two Kafka libraries: confluent-kafka (librdkafka, the default) or kafka-python.

``Reporter`` and ``DirectiveListener`` speak the part of confluent-kafka's API they need; with
``client="kafka-python"`` they get adapters over kafka-python (pure Python: no native wheel) that
speak the same part. Nothing here imports confluent-kafka unless it is chosen, so a node can run
the client with kafka-python alone.

Both libraries place a node's events on the same partition: kafka-python is given librdkafka's
default partitioner (CRC-32 of the key modulo the partition count), so a node keeps one partition
whichever library it uses.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from safepoint.errors import BrokerError, ConfigError

__all__ = [
    "CLIENTS",
    "CLIENT_ERRORS",
    "FAILOVER_CONF",
    "CONFLUENT",
    "GROUP_AUTHORIZATION_FAILED",
    "KAFKA_PYTHON",
    "PARTITION_EOF",
    "RECEIVE_MESSAGE_MAX_BYTES",
    "ClientError",
    "assign_from_beginning",
    "check_client",
    "consumer_conf",
    "crc32_partition",
    "make_client",
    "end_offsets",
    "known_ends",
    "make_consumer",
    "read_positions",
    "set_paused",
    "watermarks",
]

CONFLUENT = "confluent"
KAFKA_PYTHON = "kafka-python"
CLIENTS = (CONFLUENT, KAFKA_PYTHON)
PARTITION_EOF = -191
"""librdkafka's ``RD_KAFKA_RESP_ERR__PARTITION_EOF``: the error code of an end-of-partition event."""
GROUP_AUTHORIZATION_FAILED = 30
"""A broker with ACLs refused the lookup of a consumer's group. librdkafka asks for the coordinator of
the ``group.id`` that confluent-kafka requires, though the project's consumers only assign partitions
and never commit: their principals need no group ACL, and they read on (it is logged at debug level)."""


FAILOVER_CONF: dict[str, Any] = {"socket.timeout.ms": 10_000, "topic.metadata.refresh.interval.ms": 10_000}
"""What every safepoint client of librdkafka sets unless its settings say otherwise, so that a broker cut
off from the network (or frozen) while it leads a partition holds its readers and writers back for
seconds, not minutes. librdkafka waits ``socket.timeout.ms`` (60 s by default) for an answer from a
broker whose connection stays open but silent, and learns of the partition's new leader from metadata
it asks for after such a failure or every ``topic.metadata.refresh.interval.ms`` (5 min): with the
defaults, the job's read tasks, its sink and the nodes' clients waited on the cut-off leader and no
directive came for two minutes (tests/integration/test_container_faults.py); with these, within 15 s of
the cut. A request on a healthy network answers in well under 10 s (a fetch waits ``fetch.wait.max.ms``
more); a metadata request every 10 s is one small round trip per client."""

RECEIVE_MESSAGE_MAX_BYTES = 1_000_000_000
"""The consumer's ``receive.message.max.bytes``: the embedded broker ignores fetch size limits and
may answer one fetch with the whole backlog (a directive's ``basis`` names every node)."""


def consumer_conf(bootstrap: str, client_id: str, logger: str, kafka_conf: Mapping[str, Any] | None) -> dict[str, Any]:
    """A consumer that reads a compacted topic from the beginning with ``assign()`` only."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        # librdkafka wants a group.id even for a consumer that only assign()s; it never joins
        # the group and never commits offsets.
        "group.id": f"{client_id}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
        "client.id": client_id,
        "logger": logging.getLogger(logger),
        **FAILOVER_CONF,
    }
    conf.update(kafka_conf or {})
    return conf


class ClientError(Exception):
    """A kafka-python failure, in the place where confluent-kafka raises ``KafkaException``."""


def _confluent_errors() -> tuple[type[BaseException], ...]:
    try:
        from confluent_kafka import KafkaException
    except ImportError:  # a node with kafka-python only
        return (ClientError,)
    return (KafkaException, ClientError)


CLIENT_ERRORS: tuple[type[BaseException], ...] = _confluent_errors()
"""What either library raises for a broker or client failure (``except CLIENT_ERRORS``)."""


def check_client(name: str) -> str:
    if name not in CLIENTS:
        msg = f"unknown Kafka client {name!r}: use one of {', '.join(CLIENTS)}"
        raise ConfigError(msg)
    return name


# -- configuration: librdkafka's dotted keys -> kafka-python's arguments ------------------------

_COMMON = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "request.timeout.ms": "request_timeout_ms",
    "socket.timeout.ms": "request_timeout_ms",  # FAILOVER_CONF's, as kafka-python names them
    "topic.metadata.refresh.interval.ms": "metadata_max_age_ms",
}
_PRODUCER = {**_COMMON, "acks": "acks", "linger.ms": "linger_ms", "enable.idempotence": "enable_idempotence",
             "compression.type": "compression_type", "retries": "retries"}
_CONSUMER = {**_COMMON, "auto.offset.reset": "auto_offset_reset", "receive.message.max.bytes": "fetch_max_bytes"}
_DROPPED = ("logger", "error_cb", "group.id", "enable.auto.commit", "enable.auto.offset.store", "enable.partition.eof")
"""librdkafka keys with no kafka-python meaning here (the adapters never join a group or commit)."""


def _translate(conf: Mapping[str, Any], table: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if key in _DROPPED:
            continue
        arg = table.get(key)
        if arg is None:
            msg = (f"Kafka setting {key!r} has no kafka-python equivalent in safepoint's adapter "
                   f"(supported: {', '.join(sorted(table))}); remove it or use client = \"confluent\"")
            raise ConfigError(msg)
        if isinstance(value, str) and value.isdigit() and arg.endswith(("_ms", "retries")):
            value = int(value)
        out[arg] = value
    return out


def crc32_partition(key: bytes | None, partitions: Iterable[int]) -> int:
    """librdkafka's default ``consistent_random`` partitioner: CRC-32 of the key (random without one)."""
    ordered = sorted(partitions)
    if key is None:
        import random

        return random.choice(ordered)  # noqa: S311 - load spreading, not security
    return ordered[zlib.crc32(key) % len(ordered)]


def _crc32_partitioner() -> Any:
    """``crc32_partition`` as a kafka-python ``Partitioner``."""
    from kafka.partitioner import Partitioner

    class Crc32Partitioner(Partitioner):  # type: ignore[misc]
        def partition(self, topic: str, key: Any, serialized_key: bytes | None, value: Any,
                      serialized_value: bytes | None, cluster: Any) -> int:
            partitions = cluster.partitions_for_topic(topic)
            if not partitions:
                msg = f"topic {topic} is not in the cluster metadata"
                raise ValueError(msg)
            return crc32_partition(serialized_key, partitions)

    return Crc32Partitioner()


# -- kafka-python adapters ------------------------------------------------------------------------


class _Error:
    """A kafka-python failure in the shape of confluent-kafka's ``KafkaError``."""

    __slots__ = ("_code", "_text")

    def __init__(self, code: int, text: str) -> None:
        self._code, self._text = code, text

    def code(self) -> int:
        return self._code

    def fatal(self) -> bool:
        return False

    def __str__(self) -> str:
        return self._text


class _Record:
    """A consumed record (or an end-of-partition event) in the shape of confluent-kafka's ``Message``."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_error")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None = None, value: bytes | None = None,
                 error: _Error | None = None) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._error = key, value, error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> _Error | None:
        return self._error


PRODUCER, CONSUMER = "producer", "consumer"


def _wrap(what: str, conf: Mapping[str, Any], exc: Exception) -> BrokerError:
    msg = f"cannot create the kafka-python {what} for {conf.get('bootstrap.servers')}: {exc}"
    return BrokerError(msg)


class PyProducer:
    """confluent-kafka's ``Producer`` calls the reporter makes, over ``kafka.KafkaProducer``:
    ``produce`` queues, delivery reports are served by ``poll`` in the caller's thread."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        from kafka import KafkaProducer

        kwargs = _translate(conf, _PRODUCER)
        kwargs.setdefault("max_block_ms", 1_000)  # a full queue or missing metadata: BufferError, retried
        try:
            self._producer = KafkaProducer(partitioner=_crc32_partitioner(), **kwargs)
        except Exception as exc:  # noqa: BLE001 - kafka-python raises its own errors and ValueError
            raise _wrap(PRODUCER, conf, exc) from exc
        self._reports: collections.deque[tuple[Callable[..., Any] | None, _Error | None, _Record]] = collections.deque()
        self._ready = threading.Condition()
        self._pending = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                on_delivery: Callable[..., Any] | None = None, headers: list[tuple[str, bytes]] | None = None) -> None:
        from kafka.errors import KafkaError, KafkaTimeoutError

        try:
            future = self._producer.send(topic, value=value, key=key, headers=headers)
        except KafkaTimeoutError as exc:
            raise BufferError(str(exc)) from exc
        except KafkaError as exc:
            raise ClientError(str(exc)) from exc
        with self._ready:
            self._pending += 1

        def done(result: Any) -> None:
            report: tuple[Callable[..., Any] | None, _Error | None, _Record]
            if isinstance(result, BaseException):
                report = (on_delivery, _Error(-1, f"{type(result).__name__}: {result}"), _Record(topic, -1, -1, key, value))
            else:
                report = (on_delivery, None, _Record(topic, result.partition, result.offset, key, value))
            with self._ready:
                self._reports.append(report)
                self._ready.notify_all()

        future.add_both(done)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve the delivery reports that are in (waiting up to ``timeout`` s for the first)."""
        with self._ready:
            if not self._reports and timeout > 0:
                self._ready.wait(timeout)
            reports = list(self._reports)
            self._reports.clear()
            self._pending -= len(reports)
        for callback, err, record in reports:
            if callback is not None:
                callback(err, record)
        return len(reports)

    def flush(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        while len(self) and time.monotonic() < deadline:
            self.poll(min(0.1, max(0.0, deadline - time.monotonic())))
        return len(self)

    def purge(self) -> None:
        """kafka-python cannot drop queued records; they are delivered or fail on their own."""

    def close(self, timeout: float = 5.0) -> None:
        self._producer.close(timeout=timeout)
        self.poll(0)

    def __len__(self) -> int:
        with self._ready:
            return self._pending


class PyConsumer:
    """confluent-kafka's ``Consumer`` calls the listener makes, over ``kafka.KafkaConsumer``
    (no group, no commits). End-of-partition events are emitted once per assigned partition, when
    its position reaches the end it had when it was assigned: the backlog is read."""

    def __init__(self, conf: Mapping[str, Any]) -> None:
        from kafka import KafkaConsumer

        kwargs = _translate(conf, _CONSUMER)
        try:
            self._consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, **kwargs)
        except Exception as exc:  # noqa: BLE001 - kafka-python raises its own errors and ValueError
            raise _wrap(CONSUMER, conf, exc) from exc
        self._buffer: collections.deque[_Record] = collections.deque()
        self._backlog_ends: dict[Any, int] = {}

    def list_topics(self, topic: str, timeout: float = 5.0) -> SimpleNamespace:
        from kafka.errors import KafkaError

        try:
            parts = self._consumer.partitions_for_topic(topic)
        except KafkaError as exc:
            raise ClientError(str(exc)) from exc
        topics = {topic: SimpleNamespace(error=None, partitions={p: None for p in sorted(parts)})} if parts else {}
        return SimpleNamespace(topics=topics)

    def assign_from_beginning(self, topic: str, partitions: Iterable[int]) -> None:
        from kafka import TopicPartition

        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        self._consumer.seek_to_beginning(*tps)
        self._backlog_ends = dict(self._consumer.end_offsets(tps))

    def poll(self, timeout: float = 1.0) -> _Record | None:
        from kafka.errors import KafkaError

        if not self._buffer:
            try:
                batches = self._consumer.poll(timeout_ms=int(max(0.0, timeout) * 1000), max_records=500)
            except KafkaError as exc:
                raise ClientError(str(exc)) from exc
            for tp, records in batches.items():
                self._buffer.extend(_Record(tp.topic, tp.partition, r.offset, r.key, r.value) for r in records)
            for tp in [tp for tp, end in self._backlog_ends.items() if self._consumer.position(tp) >= end]:
                del self._backlog_ends[tp]
                self._buffer.append(_Record(tp.topic, tp.partition, -1, error=_Error(PARTITION_EOF, "end of partition")))
        return self._buffer.popleft() if self._buffer else None

    def _tps(self, topic: str, partitions: Iterable[int]) -> list[Any]:
        from kafka import TopicPartition

        return [TopicPartition(topic, p) for p in sorted(partitions)]

    def set_paused(self, topic: str, partitions: Iterable[int], paused: bool) -> None:
        tps = self._tps(topic, partitions)  # kafka-python fetches from where it stood after a resume
        (self._consumer.pause if paused else self._consumer.resume)(*tps)

    def positions(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """The offset each partition is read up to by the caller: records this wrapper holds in its
        buffer are not read yet (kafka-python's own position is past its whole last batch)."""
        out = {tp.partition: int(self._consumer.position(tp)) for tp in self._tps(topic, partitions)}
        for rec in self._buffer:
            if rec.topic() == topic and rec.partition() in out and rec.offset() >= 0:
                out[rec.partition()] = min(out[rec.partition()], rec.offset())
        return out

    def ends(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        from kafka.errors import KafkaError

        try:
            return {tp.partition: int(end) for tp, end in self._consumer.end_offsets(self._tps(topic, partitions)).items()}
        except KafkaError as exc:
            raise ClientError(str(exc)) from exc

    def known_ends(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        """Each partition's end as the last fetch response said it (no request; unknown ones left out)."""
        out = {}
        for tp in self._tps(topic, partitions):
            high = self._consumer.highwater(tp)
            if high is not None:
                out[tp.partition] = int(high)
        return out

    def close(self) -> None:
        self._consumer.close()


# -- the factories ------------------------------------------------------------------------------


def make_consumer(client: str, conf: Mapping[str, Any]) -> Any:
    """A consumer of the chosen library (confluent-kafka's ``Consumer`` or ``PyConsumer``); producers
    come from ``connectors/kafka/producer.py``."""
    return make_client(client, conf, CONSUMER)


def make_client(client: str, conf: Mapping[str, Any], what: str) -> Any:
    """A ``PRODUCER`` or ``CONSUMER`` of the chosen library, with one clear error when it cannot be made."""
    if check_client(client) == KAFKA_PYTHON:
        return (PyProducer if what == PRODUCER else PyConsumer)(conf)
    import confluent_kafka

    try:
        return getattr(confluent_kafka, what.capitalize())(dict(conf))
    except confluent_kafka.KafkaException as exc:
        msg = f"cannot create the Kafka {what} for {conf.get('bootstrap.servers')}: {exc}"
        raise BrokerError(msg) from exc


def assign_from_beginning(consumer: Any, topic: str, partitions: Iterable[int]) -> None:
    """Assign every given partition of ``topic`` from its first offset, either library."""
    if isinstance(consumer, PyConsumer):
        consumer.assign_from_beginning(topic, partitions)
        return
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)])


def set_paused(consumer: Any, topic: str, positions: Mapping[int, int], paused: bool) -> None:
    """Stop (or restart, at ``positions``) fetching the partitions of ``topic``, either library.
    confluent-kafka's consumer drops its assignment and is assigned again (its pause and resume
    left librdkafka seconds late, or not fetching at all, after a resume on the embedded broker)."""
    if isinstance(consumer, PyConsumer):
        consumer.set_paused(topic, positions, paused)
        return
    from confluent_kafka import TopicPartition

    if paused:
        consumer.unassign()
    else:
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in sorted(positions.items())])


LEADER_MOVING = frozenset({"NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART",
                           "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE",
                           "_TRANSPORT", "_TIMED_OUT", "_DESTROY_BROKER", "_UNKNOWN_PARTITION"})
"""The errors of an offsets request while a partition's leader moves (a broker died, an election, a
topic just made whose leaders the broker has not taken up yet; ``_DESTROY_BROKER``: librdkafka dropped
the dead broker's connection under the request; ``_UNKNOWN_PARTITION``: the metadata of a broker
shutting down, Apache Kafka's last answer before a clean stop, left the partition out of librdkafka's
view): asked again until the deadline, as is any error librdkafka calls retriable."""


def watermarks(consumer: Any, topic: str, partition: int, timeout_s: float = 5.0) -> tuple[int, int]:
    """A partition's (first, end) offsets asked of its leader now (a confluent-kafka consumer). While
    the leader moves (``LEADER_MOVING``), asked again until ``timeout_s`` pass; then, or on any
    other error, the ``KafkaException`` is raised."""
    from confluent_kafka import KafkaException, TopicPartition

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                    timeout=max(0.5, deadline - time.monotonic()), cached=False)
            return int(lo), int(hi)
        except KafkaException as exc:
            err = exc.args[0]
            if not (err.retriable() or err.name() in LEADER_MOVING) or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def end_offsets(consumer: Any, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """Each partition's end offset, asked of the broker now (no fetch), either library."""
    if isinstance(consumer, PyConsumer):
        return consumer.ends(topic, partitions)
    return {p: watermarks(consumer, topic, p)[1] for p in sorted(partitions)}


def known_ends(consumer: Any, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """Each partition's end offset as the consumer's last fetch response carried it, without a
    request (partitions not fetched yet are left out), either library."""
    if isinstance(consumer, PyConsumer):
        return consumer.known_ends(topic, partitions)
    from confluent_kafka import TopicPartition

    out = {}
    for p in partitions:
        high = int(consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1])
        if high >= 0:
            out[p] = high
    return out


def read_positions(consumer: Any, topic: str, partitions: Iterable[int], seen: Mapping[int, int]) -> dict[int, int]:
    """The offset each partition is read up to: ``seen`` (the next offsets the caller tracked from
    what it read) with confluent-kafka, the consumer's own positions with kafka-python; before a
    partition's first record, its first offset (which compaction may have moved on)."""
    if isinstance(consumer, PyConsumer):
        return consumer.positions(topic, partitions)
    return {p: seen[p] if p in seen else watermarks(consumer, topic, p)[0] for p in sorted(partitions)}
