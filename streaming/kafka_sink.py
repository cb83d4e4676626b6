"""The sink half of the ``safepoint_kafka`` format: rows with ``topic``, ``key``, ``value``
(strings) produced by an idempotent producer (``connectors/kafka/producer.py``). A task waits for every
delivery before it reports success; a failed delivery fails the task so Spark retries it
(at-least-once), and a producer that died for good is rebuilt and the unconfirmed rows sent again.

Options: ``bootstrap.servers``, any ``kafka.<librdkafka key>``, ``flushTimeoutSeconds``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from safepoint.connectors.kafka.clients import CONFLUENT, FAILOVER_CONF
from safepoint.connectors.kafka.producer import BOOTSTRAP_SERVERS, Deliveries, ProducerSlot, is_fatal_exception, producer_conf
from safepoint.gcfreeze import freeze_once

__all__ = ["KafkaStreamWriter", "Outbox", "client_conf", "deliver"]

log = logging.getLogger(__name__)

_DELIVERY_POLL_S = 0.1
_MAX_PRODUCER_REBUILDS = 3
_SINK_LINGER_MS = 5

# Producers live per Python worker process, keyed by their configuration; never pickled.
_SLOTS: dict[str, ProducerSlot] = {}


def client_conf(options: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka settings from a data source's options: ``bootstrap.servers`` and ``kafka.*``, over the
    project's ``FAILOVER_CONF`` (the source's consumers and admin, the sink's producer)."""
    conf: dict[str, Any] = {**FAILOVER_CONF, BOOTSTRAP_SERVERS: options[BOOTSTRAP_SERVERS]}
    for k, v in options.items():
        if k.startswith("kafka."):
            conf[k[len("kafka.") :]] = v
    return conf


def _slot(options: Mapping[str, str]) -> ProducerSlot:
    conf = producer_conf(client_conf(options), linger_ms=_SINK_LINGER_MS)
    tag = json.dumps(conf, sort_keys=True)
    slot = _SLOTS.get(tag)
    if slot is None:
        slot = _SLOTS[tag] = ProducerSlot(CONFLUENT, conf)
    return slot


def deliver(options: Mapping[str, str], rows: list[tuple[str, Any, Any]], flush_timeout_s: float = 60.0) -> int:
    """Produce ``rows`` (topic, key, value) in order and wait for every delivery; return how many
    (an ``Outbox`` given them all at once)."""
    if not rows:
        return 0
    outbox = Outbox(options, flush_timeout_s)
    for topic, key, value in rows:
        outbox.send(topic, key, value)
    return outbox.wait()


class Outbox:
    """Rows produced as they come (``send``: no wait) and confirmed together (``wait``). The job's
    operator sends each output the moment the batch logic emits it, so a directive leaves while the
    rest of the batch is still being worked through, and waits for every delivery when its task
    ends, before Spark commits the task's state: at-least-once, as the sink.

    ``wait`` polls for the delivery reports until the flush timeout (``poll()``, not ``flush()``). A
    fatal producer error drops the producer and sends again, on a new one, every row whose delivery
    was not confirmed (at most ``_MAX_PRODUCER_REBUILDS`` times); any other failure raises, so that
    Spark retries the task. The sink's tasks send this way too (``deliver``)."""

    def __init__(self, options: Mapping[str, str], flush_timeout_s: float = 60.0) -> None:
        from confluent_kafka import KafkaException

        freeze_once()
        self.errors = (KafkaException, BufferError, SystemError)
        """What ``produce``/``poll`` raise when the producer cannot take a row (dead, queue full)."""
        self.slot = _slot(options)
        self.flush_timeout_s = flush_timeout_s
        self.rows: list[tuple[str, Any, Any]] = []
        self.deliveries = Deliveries()
        self.error: BaseException | None = None
        """What the producer raised while sending (later rows wait for ``wait``)."""

    def send(self, topic: str, key: Any, value: Any) -> None:
        i = len(self.rows)
        self.rows.append((topic, key, value))
        if self.error is None:
            try:
                _produce(self.slot.producer, self.deliveries, i, topic, key, value)
            except self.errors as exc:
                self.error = exc

    def wait(self) -> int:
        """Wait for the delivery of every row sent since the last ``wait``; return how many."""
        rows, deliveries, error = self.rows, self.deliveries, self.error
        self.rows, self.deliveries, self.error = [], Deliveries(), None
        if not rows:
            return 0
        slot = self.slot
        pending = list(range(len(rows)))
        rebuilds = 0
        while True:
            if error is None:
                try:
                    _await(slot.producer, deliveries, len(pending), self.flush_timeout_s)
                except self.errors as exc:
                    error = exc
            delivered = deliveries.reports
            fatal = (error is not None and is_fatal_exception(error)) or deliveries.fatal
            if fatal and rebuilds < _MAX_PRODUCER_REBUILDS:
                slot.rebuild()
                rebuilds += 1
                pending = [i for i in pending if i not in delivered or delivered[i] is not None]
                log.warning("the Kafka producer failed fatally (%s); sending %d message(s) again on a new one",
                            error or "delivery error", len(pending))
                deliveries, error = Deliveries(), None
                try:
                    producer = slot.producer
                    for i in pending:
                        _produce(producer, deliveries, i, *rows[i])
                except self.errors as exc:
                    error = exc
                continue
            if error is not None:
                slot.drop()
                msg = f"producing to Kafka failed: {error}"
                raise RuntimeError(msg) from error
            failures = [f"{rows[i][0]}: {err}" for i, err in delivered.items() if err is not None]
            remaining = len(pending) - len(delivered)
            if remaining or failures:
                slot.drop()
                msg = f"{len(failures)} deliveries failed, {remaining} unflushed: {failures[:3]}"
                raise RuntimeError(msg)
            return len(rows)


def _produce(producer: Any, deliveries: Deliveries, i: int, topic: str, key: Any, value: Any) -> None:
    """Produce row ``i`` with its delivery report, and serve the reports already in."""
    producer.produce(topic, value=value, key=key, on_delivery=deliveries.callback(i))
    producer.poll(0)


def _await(producer: Any, deliveries: Deliveries, count: int, flush_timeout_s: float) -> None:
    """Poll until ``count`` delivery reports came in or the flush timeout has passed."""
    deadline = time.monotonic() + flush_timeout_s
    while len(deliveries.reports) < count and time.monotonic() < deadline:
        producer.poll(_DELIVERY_POLL_S)


class KafkaWriterCommit(WriterCommitMessage):
    def __init__(self, count: int) -> None:
        self.count = count


class KafkaStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        # Spark lower-cases a Python data source's option keys
        self.flush_timeout_s = float(self.options.get("flushtimeoutseconds", self.options.get("flushTimeoutSeconds", "60")))

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        """Produce the task's rows and wait for every delivery (see ``deliver``)."""
        rows = [(row["topic"], row["key"], row["value"]) for row in iterator]
        return KafkaWriterCommit(deliver(self.options, rows, self.flush_timeout_s))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Each task flushed its own messages before reporting success."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("batch %s aborted; Spark will retry it (outputs may repeat: consumers dedupe by seq)", batchId)
