"""One way to make, watch and rebuild a Kafka producer: for the job's sink, the node's
``Reporter`` and the simulator.

- ``producer_conf`` fills in the defaults every safepoint producer uses (idempotent, a short
  linger) under named keys; an explicit setting wins.
- ``make_producer`` creates one of the chosen library (confluent-kafka's ``Producer``, or
  kafka-python through ``clients.PyProducer``), with one clear error when it cannot.
- ``Deliveries`` is the delivery callback: it records each message's report.
- ``is_fatal`` says when a producer is dead for good and must be rebuilt: librdkafka's idempotent
  producer fails with ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (or ``_FATAL``) once a broker lost
  acknowledged data, and never sends again.
- ``ProducerSlot`` holds one producer and rebuilds it on demand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from safepoint.connectors.kafka.clients import CLIENT_ERRORS, FAILOVER_CONF, PRODUCER, check_client, make_client

__all__ = [
    "BOOTSTRAP_SERVERS",
    "ENABLE_IDEMPOTENCE",
    "LINGER_MS",
    "Deliveries",
    "ProducerSlot",
    "is_fatal",
    "is_fatal_exception",
    "make_producer",
    "producer_conf",
]

BOOTSTRAP_SERVERS = "bootstrap.servers"
ENABLE_IDEMPOTENCE = "enable.idempotence"
LINGER_MS = "linger.ms"


def producer_conf(conf: Mapping[str, Any], *, linger_ms: int) -> dict[str, Any]:
    """``conf`` with safepoint's producer defaults: idempotent, ``linger_ms`` of batching, a leader that
    went silent left within seconds (``clients.FAILOVER_CONF``)."""
    return {ENABLE_IDEMPOTENCE: True, LINGER_MS: linger_ms, **FAILOVER_CONF, **conf}


def make_producer(client: str, conf: Mapping[str, Any]) -> Any:
    """A producer of the chosen library (confluent-kafka's ``Producer`` or ``PyProducer``)."""
    return make_client(client, conf, PRODUCER)


def is_fatal(err: object) -> bool:
    """A librdkafka error after which the producer must be rebuilt (kafka-python's: never)."""
    try:
        from confluent_kafka import KafkaError
    except ImportError:  # a node with kafka-python only
        return False
    return isinstance(err, KafkaError) and (
        bool(err.fatal()) or err.code() in (KafkaError._FATAL, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER))


def is_fatal_exception(exc: BaseException) -> bool:
    """An exception from ``produce``/``poll``/``flush`` that means the producer is dead.
    confluent-kafka 2.16's ``flush()`` can raise ``SystemError`` in that state; ``poll()`` and
    ``produce()`` raise ``KafkaException`` carrying the fatal error."""
    if isinstance(exc, SystemError):
        return True
    return is_fatal(exc.args[0] if exc.args else None)


class Deliveries:
    """A delivery callback that keeps every report: ``callback(i)`` for message ``i`` (or the
    shared ``on_delivery`` when only the count of failures matters)."""

    def __init__(self) -> None:
        self.reports: dict[int, Any] = {}
        """message index -> its delivery error (None: delivered)."""
        self.failures = 0
        self.fatal = False

    def callback(self, i: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            self.reports[i] = err
            self._count(err)

        return on_delivery

    def on_delivery(self, err: Any, msg: Any) -> None:
        self._count(err)

    def _count(self, err: Any) -> None:
        if err is not None:
            self.failures += 1
            if is_fatal(err):
                self.fatal = True


class ProducerSlot:
    """One producer for a client and configuration, made when first used and rebuilt on demand."""

    def __init__(self, client: str, conf: Mapping[str, Any]) -> None:
        self.client = check_client(client)
        self.conf = dict(conf)
        self._producer: Any = None
        self.rebuilds = 0

    @property
    def producer(self) -> Any:
        if self._producer is None:
            self._producer = make_producer(self.client, self.conf)
        return self._producer

    def rebuild(self) -> Any:
        """Drop the current producer and make a new one. The old one's queue is purged (a dead
        producer never sends again) and its delivery reports are served once more, so each purged
        message reaches its callback as a failure."""
        old, self._producer = self._producer, None
        if old is not None:
            with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
                old.purge()
            for _ in range(10):
                with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
                    if not old.poll(0):
                        break
        self.rebuilds += 1
        return self.producer

    def drop(self) -> None:
        """Forget the producer without a new one (the next use makes one)."""
        self._producer = None
