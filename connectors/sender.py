"""One node's ordered, keyed publishing: the reporter's producer and what it learns from it.

``Sender`` hands each serialised event to the producer (waiting while its queue is full, up to
``produce_timeout_s``), counts deliveries and failures, and notes when the job's view needs a
repair snapshot (a failed delivery) or the producer must be rebuilt (a fatal error: after a broker
crash the idempotent producer fails with ``OUT_OF_ORDER_SEQUENCE_NUMBER`` and never sends again).
The ``Reporter`` decides when to repair; the sender only knows the producer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from safepoint.connectors.kafka.clients import CLIENT_ERRORS
from safepoint.connectors.kafka.producer import ProducerSlot, is_fatal
from safepoint.core.ids import CLUSTER_HEADER
from safepoint.core.signing import sign_node
from safepoint.errors import BrokerError

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

__all__ = ["ReporterStats", "Sender"]

log = logging.getLogger("safepoint.reporter")


@dataclass(frozen=True, slots=True)
class ReporterStats:
    """Counters of one reporter (since it was made)."""

    sent: int
    """Events handed to the producer."""
    delivered: int
    """Events the broker acknowledged."""
    delivery_failures: int
    """Events that could not be delivered (each is logged; a snapshot repairs the job's view)."""
    producer_restarts: int
    """Times the producer was recreated after a fatal error."""
    repair_snapshots: int
    """Snapshots published to repair the job's view after failures."""
    expired: int = 0
    """Expire directives applied to an open reader or transaction (a graceful one escalated to hard counts twice)."""
    expiries_ignored: int = 0
    """Expire directives that were no-ops: unknown or already-closed id, another node, a prepared
    transaction, a repeat, or a directive older than the handle it names."""
    expire_callback_failures: int = 0
    """Exceptions raised by an ``on_expire`` callback (logged; the expiry still applies)."""
    admission_throttled: int = 0
    """Long snapshots throttled in the ``warning`` band (``connectors/admission.py``)."""
    admission_refused: int = 0
    """Long snapshots refused in the ``critical`` band."""


class Sender:
    """The producer of one node's events (``topic``, keyed by the node id)."""

    def __init__(self, node: str, cluster: str, incarnation: int, topic: str, bootstrap: str, client: str,
                 conf: Mapping[str, Any], produce_timeout_s: float, wall_clock: Callable[[], int],
                 node_key: str | None = None) -> None:
        self.node = node
        self.node_key = node_key
        """The node's own key (``safepoint node-key``): every event is signed with it (``core/signing.py``)."""
        self.cluster = cluster
        self.incarnation = incarnation
        self.wall_clock = wall_clock
        self.seq = 0
        """The ``seq`` the next event carries."""
        self.last_wall = 0
        """The ``wall_ms`` of the last event sent."""
        self.topic = topic
        self.bootstrap = bootstrap
        self.key = node.encode("utf-8")
        self.headers = [(CLUSTER_HEADER, cluster.encode("utf-8"))]
        """Every record's headers: its cluster, which the job routes it by without reading it."""
        self.produce_timeout_s = produce_timeout_s
        self.fatal = False
        """The producer hit a fatal error: rebuild it before the next send."""
        self.needs_snapshot = False
        """A delivery failed or the producer was rebuilt: the job's view needs a snapshot."""
        self.sent = 0
        self.delivered = 0
        self.failures = 0
        self.restarts = 0
        self.stats_lock = threading.Lock()  # delivery reports may run in any thread that polls
        self._last_failure_log = 0.0
        self.slot = ProducerSlot(client, {**conf, "error_cb": self.on_error})
        self.slot.producer  # noqa: B018 - made now: a configuration error surfaces here, not at the first event

    def send(self, event_type: str, fields: dict[str, Any]) -> int:
        """Stamp, serialise and hand one event to the producer; call with the reporter's lock held.
        Returns its ``seq``.

        The seq is taken and the message queued under the same lock, so the partition sees the
        events in seq order. A seq is never reused, even if its event cannot be queued (gaps are
        allowed).
        """
        if self.fatal:
            self.recreate()
        seq = self.seq
        wall = self.wall_clock()
        event: dict[str, Any] = {"v": 1, "type": event_type, "cluster": self.cluster, "wall_ms": wall, "node": self.node,
                                 "incarnation": self.incarnation, "seq": seq, **fields}
        if self.node_key:
            event["sig"] = sign_node(event, self.node_key)
        value = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        self.seq = seq + 1
        self.last_wall = wall
        self.produce(value)
        return seq

    def drain(self, timeout_s: float, repair: Callable[[], None] | None) -> int:
        """Serve delivery reports until the producer's queue is empty or ``timeout_s`` passes; the
        number still queued. ``repair`` runs once, first, when the job's view needs it.

        This polls instead of calling ``Producer.flush()``: confluent-kafka 2.16's flush keeps
        serving callbacks after a fatal error has been raised in it (the idempotent producer's
        OUT_OF_ORDER_SEQUENCE_NUMBER after a broker crash), so they run with the exception pending
        and fail with ``SystemError``. ``poll()`` stops at the fatal error and raises it cleanly.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if repair is not None and (self.fatal or self.needs_snapshot):
                repair()
                repair = None  # once per call: a failing broker must not turn flush() into a snapshot loop
            producer = self.producer
            queued = len(producer)
            left = deadline - time.monotonic()
            if queued == 0 or left <= 0:
                return queued
            try:
                producer.poll(min(0.1, left))
            except CLIENT_ERRORS as exc:
                self.note_exception(exc)

    def close(self, remaining: int, timeout_s: float) -> None:
        """Close the producer; ``remaining`` events still queued after ``timeout_s`` of draining are
        purged (and logged: they were never delivered)."""
        producer = self.producer
        if remaining:
            log.warning("reporter %s: %d event(s) were not delivered within %.1f s of close(); is %s reachable?",
                        self.node, remaining, timeout_s, self.bootstrap)
            with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
                producer.purge()
                producer.poll(0)
        with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
            producer.close()

    def produce(self, value: bytes) -> None:
        """Hand one event to the producer; call with the reporter's lock held (events reach the
        partition in the order they are handed over). A full queue is waited out up to
        ``produce_timeout_s``; a fatal error rebuilds the producer once and sends again."""
        deadline = time.monotonic() + self.produce_timeout_s
        recreated = False
        while True:
            try:
                self.producer.produce(self.topic, value=value, key=self.key, headers=self.headers,
                                      on_delivery=self.on_delivery)
                break
            except BufferError:
                if time.monotonic() >= deadline:
                    msg = (
                        f"the reporter's send queue stayed full for {self.produce_timeout_s:.0f} s; "
                        f"is the broker at {self.bootstrap} reachable?"
                    )
                    raise BrokerError(msg) from None
                try:
                    self.producer.poll(0.05)
                except CLIENT_ERRORS as exc:
                    self.note_exception(exc)
                    if self.fatal and not recreated:
                        self.recreate()
                        recreated = True
            except CLIENT_ERRORS as exc:
                if is_fatal(exc.args[0] if exc.args else None) and not recreated:
                    self.fatal = True
                    self.recreate()
                    recreated = True
                    continue
                msg = f"cannot publish to {self.topic} at {self.bootstrap}: {exc}"
                raise BrokerError(msg) from exc
        try:
            self.producer.poll(0)
        except CLIENT_ERRORS as exc:
            self.note_exception(exc)
        self.sent += 1

    @property
    def producer(self) -> Any:
        return self.slot.producer

    def recreate(self) -> None:
        """Replace a producer that hit a fatal error; call with the lock held. The purged
        messages' delivery reports count as failures."""
        log.warning("reporter %s: the producer hit a fatal error; recreating it and publishing a snapshot", self.node)
        self.slot.rebuild()
        self.fatal = False
        self.needs_snapshot = True
        self.restarts += 1

    def note_exception(self, exc: BaseException) -> None:
        err = exc.args[0] if exc.args else None
        if is_fatal(err):
            self.fatal = True
            self.needs_snapshot = True
        log.warning("reporter %s: producer error: %s", self.node, exc)

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        with self.stats_lock:
            if err is None:
                self.delivered += 1
                return
            self.failures += 1
            failures = self.failures
            now = time.monotonic()
            quiet = now - self._last_failure_log < 5.0
            if not quiet:
                self._last_failure_log = now
        self.needs_snapshot = True
        if is_fatal(err):
            self.fatal = True
        if not quiet:
            log.warning(
                "reporter %s: an event was not delivered to %s (%s); %d failure(s) so far; a snapshot will repair the job's view",
                self.node,
                self.topic,
                err,
                failures,
            )

    def on_error(self, err: KafkaError) -> None:
        if is_fatal(err):
            self.fatal = True
            self.needs_snapshot = True
            log.error("reporter %s: fatal producer error: %s", self.node, err)
        else:
            log.debug("reporter %s: producer error: %s", self.node, err)
