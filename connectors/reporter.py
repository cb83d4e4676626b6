"""The node side of safepoint: what a database node embeds to report its readers and transactions.

A :class:`Reporter` publishes the contract's node events (``reader_open``, ``reader_close``,
``tx_begin``, ``tx_prepare``, ``tx_end``, ``heartbeat``, ``snapshot``) to the events topic, keyed
by the node id so that one node's events keep their order::

    with Reporter("kafka:9092", "n1", cluster="c1", mvcc_clock=db.now) as reporter:
        with reporter.reader(read_ts, label="report-job") as r:
            ...  # read at r.read_ts
        with reporter.transaction(begin_ts) as tx:
            ...  # commits on normal exit, aborts on an exception

Guarantees:

* ``seq`` is strictly increasing within one incarnation, and the events reach the partition in
  ``seq`` order: the sequence number is taken and the message handed to the producer under one
  lock, whatever the number of threads.
* ``incarnation`` grows at each process start (see :func:`default_incarnation`).
* A reader or transaction below the last safe point this node learnt of (see
  :meth:`Reporter.observe_safe_ts`, fed by :class:`~safepoint.connectors.listener.DirectiveListener`)
  is refused with :class:`~safepoint.errors.ReaderRefused` and nothing is published.
* A failed delivery is logged and counted, and the next heartbeat tick publishes a ``snapshot``
  so the job's view of the active set is repaired. The idempotent producer is recreated when it
  hits a fatal error (after a broker crash it fails with ``OUT_OF_ORDER_SEQUENCE_NUMBER``).

Forced expiry (the job's ``expire`` directives) is applied by :meth:`Reporter.expire` at the
handles' operation boundaries: see ``connectors/expiry.py``. The handles are in
``connectors/handles.py``, the incarnation in ``connectors/incarnation.py`` and the producer's
side (seq, delivery, repair) in ``connectors/sender.py``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from safepoint.connectors.admission import Admission
from safepoint.connectors.expiry import ExpiryMixin
from safepoint.connectors.handles import (
    ExpireCallback,
    Handle,
    Reader,
    Transaction,
    check_id,
    check_ts,
)
from safepoint.connectors.heartbeat import Figures, start_heartbeats
from safepoint.connectors.incarnation import MAX_INCARNATION, default_incarnation, wall_clock_ms
from safepoint.connectors.kafka.clients import CONFLUENT, check_client
from safepoint.connectors.kafka.producer import BOOTSTRAP_SERVERS, producer_conf
from safepoint.connectors.registration import HoldsMixin, LazyRegistration
from safepoint.connectors.sender import ReporterStats, Sender
from safepoint.errors import ClientClosed

if TYPE_CHECKING:
    from safepoint.settings import Settings

__all__ = [
    "DEFAULT_EVENTS_TOPIC",
    "ExpireCallback",
    "Handle",
    "Reporter",
    "ReporterStats",
    "Reader",
    "Transaction",
    "default_incarnation",
    "wall_clock_ms",
]

log = logging.getLogger("safepoint.reporter")

DEFAULT_EVENTS_TOPIC = "safepoint.events"

SNAPSHOT_PART_BYTES = 500_000
"""A snapshot part's size: half of the broker's default message limit (1 MB) and of the job's
``max_message_bytes``, with room for the event's own fields."""


def snapshot_parts(readers: list[dict[str, Any]], txs: list[dict[str, Any]], part_bytes: int
                   ) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """The snapshot's readers and transactions cut into parts of at most about ``part_bytes`` of JSON
    each (one part when they fit: the usual snapshot)."""
    parts: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [([], [])]
    size = 0
    for index, entries in ((0, readers), (1, txs)):
        for entry in entries:
            n = len(json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode("utf-8")) + 1
            if size + n > part_bytes and (parts[-1][0] or parts[-1][1]):
                parts.append(([], []))
                size = 0
            parts[-1][index].append(entry)
            size += n
    return parts


class Reporter(ExpiryMixin, HoldsMixin):
    """Publishes one database node's events. Thread-safe; see the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        node: str,
        *,
        mvcc_clock: Callable[[], int],
        cluster: str = "default",
        incarnation: int | None = None,
        topic: str = DEFAULT_EVENTS_TOPIC,
        heartbeat_interval_s: float | None = 1.0,
        figures: Callable[[], Mapping[str, Any]] | None = None,
        kafka_conf: Mapping[str, Any] | None = None,
        wall_clock: Callable[[], int] = wall_clock_ms,
        state_dir: str | os.PathLike[str] | None = None,
        produce_timeout_s: float = 30.0,
        on_expire: ExpireCallback | None = None,
        client: str = CONFLUENT,
        retention: int | None = None,
        long_per_s: float = 1.0,
        long_read_after: int | None = None,
        snapshot_part_bytes: int = SNAPSHOT_PART_BYTES,
        node_key: str | None = None,
        observer: bool = False,
    ) -> None:
        """Connect the producer and start the heartbeat thread.

        ``mvcc_clock`` returns the node's current MVCC time (heartbeats' ``mvcc_now``, snapshots'
        ``cut``, and the ``read_ts``/``begin_ts`` of readers and transactions opened without one).
        ``figures`` returns any of ``pinned_bytes``, ``debt_bytes``, ``groups`` (a list of
        ``{"group", "leader", "published_min_tx_time"}``) and ``history_above`` (``(ts, bytes)``
        pairs: the bytes of history only a read below ``ts`` needs, from which the job tells what
        each hold costs) for each heartbeat. ``incarnation``
        defaults to :func:`default_incarnation` (``state_dir`` makes it survive clock steps).
        ``heartbeat_interval_s`` of ``None`` or ``0`` starts no thread: call :meth:`heartbeat`.
        ``wall_clock`` returns milliseconds since the epoch (injectable for tests).
        ``on_expire(handle, directive)`` is called when a reader or transaction without its own
        ``on_expire`` is expired (see :meth:`expire`). ``client`` is the Kafka library:
        ``"confluent"`` (confluent-kafka, the default) or ``"kafka-python"`` (pure Python, for
        nodes where librdkafka's wheel cannot be installed; ``kafka_conf`` keys are translated).
        ``retention`` (MVCC units, at most the job's ``retention``) turns on lazy registration:
        only the readers and transactions that can hold history back are published
        (``connectors/lazy.py``); None publishes every one. ``long_per_s`` and ``long_read_after``
        tune the admission control of long snapshots under pressure (``connectors/admission.py``):
        how many a second the ``warning`` band admits, and how far below ``mvcc_now`` (MVCC units)
        a reader or transaction not declared long counts as long (None: only declared ones).
        ``snapshot_part_bytes``: a snapshot larger than this goes out in parts of about this size
        (below the broker's and the job's message limits), which the job applies as one.
        ``node_key``: the node's own key (``safepoint node-key CLUSTER NODE`` prints it from the
        job's ``node_key_secret``): every event is signed with it, and a job with the secret refuses
        this node's events without it.
        ``observer=True``: the reporter reports holds it observes in an engine (an agent's, such as
        ``safepoint agent postgres``) rather than holds it admits: a hold below the known safe point is
        published all the same (it exists already: refusing it would hide it), the admission control
        never throttles, and a hard expiry does not release a hold (it ends when the engine ends it;
        ``on_expire`` is where the agent ends it).
        """
        if snapshot_part_bytes < 10_000:
            msg = f"snapshot_part_bytes must be at least 10000, got {snapshot_part_bytes}"
            raise ValueError(msg)
        self._part_bytes = snapshot_part_bytes
        self._observer = bool(observer)
        self.node = check_id("node", node)
        self.cluster = check_id("cluster", cluster)
        self.topic = topic
        self.bootstrap = bootstrap
        if incarnation is None:
            incarnation = default_incarnation(node, cluster, state_dir, wall_clock)
        elif not isinstance(incarnation, int) or not 0 <= incarnation <= MAX_INCARNATION:
            msg = f"incarnation must be an int in 0..2**53-1, got {incarnation!r}"
            raise ValueError(msg)
        self.incarnation: int = incarnation
        self._mvcc_clock = mvcc_clock
        self._figures = Figures(figures, node)
        self._wall_clock = wall_clock
        self._produce_timeout_s = produce_timeout_s
        self._client = check_client(client)
        self._conf: dict[str, Any] = producer_conf({
            BOOTSTRAP_SERVERS: bootstrap,
            "acks": "all",
            "client.id": f"safepoint-reporter-{node}",
            "logger": logging.getLogger("safepoint.reporter.librdkafka"),
            **(kafka_conf or {}),
        }, linger_ms=5)

        self._lock = threading.RLock()
        self._safe_ts: int | None = None
        self._ns_bounds: tuple[int, dict[str, int]] | None = None
        """The newest directive's ``namespace_safe_ts`` and ``namespaces``, or None."""
        self._readers: dict[str, Reader] = {}
        self._txs: dict[str, Transaction] = {}
        self._closed = False
        self._closing = False
        self._repairs = 0
        self._on_expire = on_expire
        self._lazy = LazyRegistration(self.node, retention)
        self._admission = Admission(self.node, long_per_s, long_read_after)
        self._expired = 0
        self._expiries_ignored = 0
        self._expire_callback_failures = 0
        self._sender = Sender(self.node, self.cluster, incarnation, topic, bootstrap, self._client, self._conf,
                              produce_timeout_s, wall_clock, node_key)

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_interval_s:
            self._thread = start_heartbeats(self, float(heartbeat_interval_s), self._stop)

    @classmethod
    def from_settings(cls, settings: Settings, node: str, *, mvcc_clock: Callable[[], int], **kwargs: Any) -> Reporter:
        """A reporter for the deployment ``settings`` describe (bootstrap, events topic, extra Kafka keys)."""
        conf = settings.librdkafka()
        conf.update(kwargs.pop("kafka_conf", None) or {})
        kwargs.setdefault("client", settings.client)
        return cls(
            conf.pop("bootstrap.servers"),
            node,
            mvcc_clock=mvcc_clock,
            topic=kwargs.pop("topic", settings.events_topic),
            kafka_conf=conf,
            **kwargs,
        )

    # -- public API ------------------------------------------------------------------------
    def reader(
        self,
        read_ts: int | None = None,
        *,
        label: str | None = None,
        groups: Sequence[str] | None = None,
        namespace: str | None = None,
        reader_id: str | None = None,
        on_expire: ExpireCallback | None = None,
        long: bool = False,
    ) -> Reader:
        """A reader handle: ``with reporter.reader(ts) as r`` publishes open and close.

        Without ``read_ts`` the reader reads at ``mvcc_clock()``, taken under the reporter's lock,
        so no heartbeat with a later ``mvcc_now`` can overtake its ``reader_open``.
        ``on_expire(reader, directive)`` overrides the reporter's callback for this reader.
        ``long=True`` declares a long snapshot: under pressure opening it may raise
        ``AdmissionThrottled`` (warning band) or ``AdmissionRefused`` (critical band).
        """
        return Reader(self, read_ts, reader_id, label, groups, namespace, on_expire, long)

    def transaction(
        self,
        begin_ts: int | None = None,
        *,
        label: str | None = None,
        groups: Sequence[str] | None = None,
        namespace: str | None = None,
        tx_id: str | None = None,
        on_expire: ExpireCallback | None = None,
        long: bool = False,
    ) -> Transaction:
        """A transaction handle: ``with reporter.transaction(ts) as tx`` publishes begin and end.

        ``on_expire(tx, directive)`` overrides the reporter's callback for this transaction;
        ``long=True`` declares it long (see :meth:`reader`).
        """
        return Transaction(self, begin_ts, tx_id, label, groups, namespace, on_expire, long)

    def observe_band(self, band: str) -> None:
        """The node's pinned-bytes band, as the job's newest ``band`` directive says (a
        ``DirectiveListener`` with ``reporter=`` calls this): admission of long snapshots follows it."""
        self._admission.observe(band)

    def observe_emergency(self, active: bool) -> None:
        """Whether the cluster is in emergency, as the newest compaction directive says: long
        snapshots are then refused in the warning band too (``connectors/admission.py``)."""
        self._admission.observe_emergency(active)

    @property
    def band(self) -> str:
        """The node's band as last observed (``normal`` until the job says otherwise)."""
        return self._admission.band

    def observe_safe_ts(self, safe_ts: int, retention: int | None = None, namespace_safe_ts: int | None = None,
                        namespaces: Mapping[str, int] | None = None) -> None:
        """Record the cluster's safe point (from a directive; it only moves forward), the namespaces'
        bounds when the cluster has namespaced holds, and the job's ``retention`` the directive
        announces (lazy registration checks its own against it)."""
        check_ts("safe_ts", safe_ts)
        with self._lock:
            if self._safe_ts is None or safe_ts > self._safe_ts:
                self._safe_ts = safe_ts
            if namespace_safe_ts is not None:
                self._ns_bounds = (namespace_safe_ts, dict(namespaces or {}))
            if retention is not None and self._lazy.job_retention(retention) and not self._closed:
                self._publish_waiting(None)

    @property
    def safe_ts(self) -> int | None:
        """The newest safe point this node learnt of, or None."""
        return self._safe_ts

    def find(self, *, reader_id: str | None = None, tx_id: str | None = None) -> Handle | None:
        """The open reader (by ``reader_id``) or transaction (by ``tx_id``) of this reporter, or None."""
        with self._lock:
            if reader_id is not None:
                return self._readers.get(reader_id)
            if tx_id is not None:
                return self._txs.get(tx_id)
            return None

    @property
    def active_readers(self) -> list[Reader]:
        with self._lock:
            return list(self._readers.values())

    @property
    def active_transactions(self) -> list[Transaction]:
        with self._lock:
            return list(self._txs.values())

    @property
    def client(self) -> str:
        """The Kafka library this reporter uses: ``"confluent"`` or ``"kafka-python"``."""
        return self._client

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def seq(self) -> int:
        """The ``seq`` the next event will carry."""
        return self._sender.seq

    def stats(self) -> ReporterStats:
        sender = self._sender
        with self._lock, sender.stats_lock:
            return ReporterStats(sender.sent, sender.delivered, sender.failures, sender.restarts, self._repairs,
                                 self._expired, self._expiries_ignored, self._expire_callback_failures,
                                 self._admission.throttled, self._admission.refused)

    def heartbeat(self) -> int:
        """Publish one heartbeat now (the thread does this every interval). Returns its seq.

        A pending repair snapshot (after a failed delivery) is published first.
        """
        figures = self._figures.read()
        with self._lock:
            if self._sender.fatal or self._sender.needs_snapshot:
                self._repair()
            event: dict[str, Any] = {"mvcc_now": check_ts("mvcc_now", self._mvcc_clock())}
            bound = self._lazy.heartbeat_bound(event["mvcc_now"])
            if bound is not None:
                self._publish_waiting(bound)
            event["active_readers"] = len(self._readers)
            event["active_txs"] = len(self._txs)
            if self._admission.throttled or self._admission.refused:
                event["admission_throttled"] = self._admission.throttled
                event["admission_refused"] = self._admission.refused
            event.update(figures)
            return self._send("heartbeat", event)

    def snapshot(self) -> int:
        """Publish the node's complete active set (it replaces what the job holds). Returns its seq."""
        with self._lock:
            return self._publish_snapshot()

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait until every event is delivered or ``timeout_s`` passes. Returns the number still queued.

        If deliveries failed meanwhile (or the producer hit a fatal error and was recreated), a
        snapshot is published first, so that on return the job can see the node's current state.
        """
        return self._drain(timeout_s, repair=True)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the heartbeat, flush (up to ``timeout_s``) and close the producer. Idempotent.

        Readers and transactions still open are not closed: a reporter is closed when the node
        process ends, and the next incarnation drops them.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        remaining = self._drain(timeout_s, repair=True)
        with self._lock:
            self._closed = True
        self._sender.close(remaining, timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reporter(node={self.node!r}, cluster={self.cluster!r}, incarnation={self.incarnation}, seq={self.seq})"

    # -- handles call these ------------------------------------------------------------
    # -- sending -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            msg = f"reporter of node {self.node} is closed; make a new Reporter"
            raise ClientClosed(msg)

    def _publish_snapshot(self) -> int:
        """Publish the active set, in parts when it is larger than ``snapshot_part_bytes`` (each part
        takes the next seq, under the lock, so nothing comes between them); call with the lock held.
        Returns the seq of its last part."""
        cut = check_ts("mvcc_clock()", self._mvcc_clock())
        readers = [r._entry() for r in self._readers.values()]
        txs = [t._entry() for t in self._txs.values()]
        parts = snapshot_parts(readers, txs, self._part_bytes)
        seq = -1
        for k, (part_readers, part_txs) in enumerate(parts):
            event: dict[str, Any] = {"cut": cut, "readers": part_readers, "txs": part_txs}
            if len(parts) > 1:
                event.update(part=k, parts=len(parts))
            seq = self._send("snapshot", event)
        self._sender.needs_snapshot = False
        for h in (*self._readers.values(), *self._txs.values()):
            h._published = True  # named in the snapshot: its end is published from now on
        return seq

    def _send(self, event_type: str, fields: dict[str, Any]) -> int:
        """Publish one event; call with the lock held (see ``Sender.send``)."""
        self._check_open()
        return self._sender.send(event_type, fields)

    def _drain(self, timeout_s: float, repair: bool) -> int:
        """Serve delivery reports until the queue is empty or ``timeout_s`` passes (``Sender.drain``);
        with ``repair``, first rebuild a failed producer and republish the active set (once)."""

        def repair_once() -> None:
            with self._lock:
                if not self._closed:
                    self._repair()

        return self._sender.drain(timeout_s, repair_once if repair else None)

    def _repair(self) -> None:
        """Recreate a failed producer and republish the active set; call with the lock held."""
        if self._sender.fatal:
            self._sender.recreate()
        if self._sender.needs_snapshot:
            self._repairs += 1
            self._publish_snapshot()
