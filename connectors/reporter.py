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

Forced expiry (the job's ``expire`` directives, applied by :meth:`Reporter.expire`, which
:class:`~safepoint.connectors.listener.DirectiveListener` calls when made with ``reporter=``): the
database calls ``check()`` on the handle at its operation boundaries; an expired reader or
transaction raises :class:`~safepoint.errors.ReaderExpired` there (and at ``prepare()`` and at
commit), never in the middle of an operation::

    def cancel(handle, directive):            # optional: stop the running work at once
        db.cancel_queries_of(handle)

    listener = DirectiveListener("kafka:9092", reporter=reporter)   # polled or started elsewhere
    with reporter.reader(ts, on_expire=cancel) as r:
        for batch in scan:
            r.check()                          # ReaderExpired: retry with a fresh snapshot
            ...
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self
from urllib.parse import quote

from safepoint.connectors.clients import CLIENT_ERRORS, CONFLUENT, check_client, is_fatal, make_producer
from safepoint.errors import BrokerError, ClientClosed, ReaderExpired, ReaderRefused, SafepointError

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

    from safepoint.connectors.listener import ExpireDirective
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
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_MAX_INCARNATION = 2**53 - 1  # the schema's bound: exact in every JSON reader
_FIGURE_KEYS = ("groups", "pinned_bytes", "debt_bytes", "active_readers", "active_txs")

Outcome = Literal["commit", "abort"]


def wall_clock_ms() -> int:
    """The default wall clock: milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


# -- incarnation -------------------------------------------------------------------------

_issued_lock = threading.Lock()
_issued: dict[tuple[str, str], int] = {}


def default_incarnation(
    node: str,
    cluster: str = "default",
    state_dir: str | os.PathLike[str] | None = None,
    wall_clock: Callable[[], int] = wall_clock_ms,
) -> int:
    """An incarnation number that grows at every process start of ``node``.

    Without ``state_dir`` it is the wall clock in milliseconds at start: it grows across restarts
    as long as the clock does not step back by more than the restart takes. With ``state_dir`` the
    last number is persisted in ``<state_dir>/<cluster>.<node>.incarnation`` and the new one is
    ``max(last + 1, wall clock ms)``: it grows even if the clock steps back (the file remembers) and
    even if the file is lost or corrupt (the clock does). Within one process, two reporters of the
    same node never get the same number.
    """
    candidate = wall_clock()
    if state_dir is not None:
        candidate = _persisted_incarnation(Path(state_dir), cluster, node, candidate)
    with _issued_lock:
        previous = _issued.get((cluster, node))
        if previous is not None and candidate <= previous:
            candidate = previous + 1
        _issued[(cluster, node)] = candidate
    if not 0 <= candidate <= _MAX_INCARNATION:
        msg = f"incarnation {candidate} is outside 0..2**53-1; check the wall clock or the state file in {state_dir}"
        raise SafepointError(msg)
    return candidate


def _persisted_incarnation(state_dir: Path, cluster: str, node: str, now_ms: int) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{quote(cluster, safe='')}.{quote(node, safe='')}"
    path = state_dir / f"{stem}.incarnation"
    lock_path = state_dir / f"{stem}.incarnation.lock"
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            last = int(path.read_text(encoding="ascii").strip())
        except FileNotFoundError:
            last = -1
        except (ValueError, OSError) as exc:
            log.warning("incarnation file %s is unreadable (%s); falling back to the wall clock", path, exc)
            last = -1
        value = max(last + 1, now_ms)
        tmp = path.with_suffix(".incarnation.tmp")
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{value}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # make the rename durable where the platform allows it
            dir_fd = os.open(state_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    return value


# -- handles -----------------------------------------------------------------------------


def _check_ts(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        msg = f"{name} must be an int (an MVCC timestamp), got {type(value).__name__}"
        raise TypeError(msg)
    if not _INT64_MIN <= value <= _INT64_MAX:
        msg = f"{name} {value} does not fit in a signed 64-bit integer"
        raise ValueError(msg)
    return value


def _check_id(name: str, value: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 256:
        msg = f"{name} must be a non-empty string of at most 256 characters, got {value!r}"
        raise ValueError(msg)
    return value


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class _Handle:
    """What readers and transactions share: the reporter, the optional fields, the expiry."""

    __slots__ = ("_reporter", "label", "groups", "namespace", "opened_wall_ms", "_state", "_on_expire", "_expiry")

    def __init__(
        self,
        reporter: Reporter,
        label: str | None,
        groups: Sequence[str] | None,
        namespace: str | None,
        on_expire: ExpireCallback | None,
    ) -> None:
        self._reporter = reporter
        self.label = label
        self.groups = list(groups) if groups is not None else None
        self.namespace = namespace
        self.opened_wall_ms: int | None = None
        self._state = "new"
        self._on_expire = on_expire
        self._expiry: ExpireDirective | None = None

    @property
    def expired(self) -> bool:
        """True once the safe-point service expired this handle (see :meth:`Reporter.expire`)."""
        return self._expiry is not None

    @property
    def expiry(self) -> ExpireDirective | None:
        """The expire directive that applies to this handle (the hard one after an escalation), or None."""
        return self._expiry

    def _base_entry(self, id_key: str, ident: str, ts_key: str, ts: int | None) -> dict[str, Any]:
        """The handle as it appears in a snapshot's readers or txs."""
        entry: dict[str, Any] = {id_key: ident, ts_key: ts}
        _add_optional(entry, self.label, self.namespace, self.groups)
        if self.opened_wall_ms is not None:
            entry["opened_wall_ms"] = self.opened_wall_ms
        return entry


class Reader(_Handle):
    """One snapshot reader. ``with`` publishes ``reader_open`` on enter and ``reader_close`` on exit.

    Made by :meth:`Reporter.reader`; :meth:`open` and :meth:`close` do the same without ``with``.
    """

    __slots__ = ("reader_id", "read_ts")

    def __init__(
        self,
        reporter: Reporter,
        read_ts: int | None,
        reader_id: str,
        label: str | None,
        groups: Sequence[str] | None,
        namespace: str | None,
        on_expire: ExpireCallback | None = None,
    ) -> None:
        super().__init__(reporter, label, groups, namespace, on_expire)
        self.read_ts: int | None = read_ts
        self.reader_id = reader_id
        # _state: new -> open -> closed | expired (released because of an expiry)

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    def check(self) -> None:
        """An operation boundary: raise :class:`~safepoint.errors.ReaderExpired` if the reader was expired.

        The database calls this between the operations it runs at ``read_ts``. After a graceful
        expiry the first call releases the reader (``reader_close`` is published) and raises; after
        a hard expiry the reporter has already released it. Every later call raises too.
        """
        self._reporter._enforce_expiry(self)

    def open(self) -> Self:
        """Publish ``reader_open``. Raises ReaderRefused below the known safe point (nothing published)."""
        if self._state != "new":
            msg = f"reader {self.reader_id} was already opened; make a new one with reporter.reader()"
            raise SafepointError(msg)
        self._reporter._open_reader(self)
        self._state = "open"
        return self

    def close(self) -> None:
        """Publish ``reader_close``. Idempotent; never raises for a reporter closed meanwhile."""
        with self._reporter._lock:
            if self._state != "open":
                return
            self._state = "closed"
            self._reporter._close_hold("reader", self.reader_id)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        """Publish ``reader_close``. A block left by an exception keeps that exception; a block left
        normally raises ReaderExpired if the reader's snapshot was released by an expiry before the
        end of the block (a hard expiry, or a graceful one already enforced by :meth:`check`): what
        it read after that point is not protected from compaction."""
        self.close()
        if et is None and self._state == "expired":
            raise self._reporter._expired_error(self)

    def _entry(self) -> dict[str, Any]:
        return self._base_entry("reader_id", self.reader_id, "read_ts", self.read_ts)

    def __repr__(self) -> str:
        return f"Reader({self.reader_id!r}, read_ts={self.read_ts}, {self._state})"

    @property
    def _kind(self) -> Literal["reader", "tx"]:
        return "reader"

    @property
    def _ident(self) -> str:
        return self.reader_id

    @property
    def _ts(self) -> int | None:
        return self.read_ts


class Transaction(_Handle):
    """One read-write transaction. ``with`` publishes ``tx_begin``, then ``tx_end`` on exit.

    On a normal exit the outcome is ``commit``, on an exception ``abort``, unless :meth:`end` was
    called first. A *prepared* transaction (see :meth:`prepare`) left by an exception is in doubt:
    its decision belongs to the coordinator, so no ``tx_end`` is published and it stays held
    (and in :meth:`Reporter.snapshot`) until :meth:`end` is called with the decision.
    """

    __slots__ = ("tx_id", "begin_ts", "coordinator", "participants", "outcome", "commit_ts")

    def __init__(
        self,
        reporter: Reporter,
        begin_ts: int | None,
        tx_id: str,
        label: str | None,
        groups: Sequence[str] | None,
        namespace: str | None,
        on_expire: ExpireCallback | None = None,
    ) -> None:
        super().__init__(reporter, label, groups, namespace, on_expire)
        self.begin_ts: int | None = begin_ts
        self.tx_id = tx_id
        self.coordinator: str | None = None
        self.participants: list[str] | None = None
        self.outcome: Outcome | None = None
        self.commit_ts: int | None = None
        # _state: new -> open [-> prepared] -> ended | expired (aborted because of an expiry)

    @property
    def is_open(self) -> bool:
        return self._state in ("open", "prepared")

    @property
    def prepared(self) -> bool:
        return self._state == "prepared"

    def check(self) -> None:
        """An operation boundary: raise :class:`~safepoint.errors.ReaderExpired` if the transaction was expired.

        The database calls this between the transaction's operations. After a graceful expiry the
        first call aborts the transaction (``tx_end`` with ``abort`` is published) and raises; after
        a hard expiry the reporter has already aborted it. Every later call raises too.
        """
        self._reporter._enforce_expiry(self)

    def begin(self) -> Self:
        """Publish ``tx_begin``. Raises ReaderRefused below the known safe point (nothing published)."""
        if self._state != "new":
            msg = f"transaction {self.tx_id} was already begun; make a new one with reporter.transaction()"
            raise SafepointError(msg)
        self._reporter._open_tx(self)
        self._state = "open"
        return self

    def prepare(self, coordinator: str, participants: Iterable[str]) -> None:
        """Publish ``tx_prepare``: two-phase commit, prepared, decision unknown (in doubt).

        A cancel point: an expired transaction is aborted and raises ReaderExpired instead.
        """
        _check_id("coordinator", coordinator)
        parts = [_check_id("participant", p) for p in participants]
        with self._reporter._lock:
            if self._expiry is not None:
                self._reporter._enforce_expiry(self)
            if self._state != "open":
                msg = f"transaction {self.tx_id} cannot be prepared: it is {self._state}"
                raise SafepointError(msg)
            self._reporter._prepare_tx(self, coordinator, parts)
            self.coordinator = coordinator
            self.participants = parts
            self._state = "prepared"

    def end(self, outcome: Outcome = "commit", commit_ts: int | None = None) -> None:
        """Publish ``tx_end`` with the decision. Idempotent once ended.

        The commit boundary is a cancel point: on an expired transaction ``end("commit")``
        publishes ``abort`` instead (if the reporter has not already) and raises ReaderExpired;
        ``end("abort")`` publishes the abort and returns.
        """
        if outcome not in ("commit", "abort"):
            msg = f"outcome must be 'commit' or 'abort', got {outcome!r}"
            raise ValueError(msg)
        if commit_ts is not None:
            _check_ts("commit_ts", commit_ts)
        with self._reporter._lock:
            if self._expiry is not None:
                if outcome == "commit":
                    self._reporter._enforce_expiry(self)
                self._reporter._release_expired(self)
                return
            if self._state not in ("open", "prepared"):
                if self._state == "new":
                    msg = f"transaction {self.tx_id} was never begun"
                    raise SafepointError(msg)
                return
            self._state = "ended"
            self.outcome = outcome
            self.commit_ts = commit_ts
            extra: dict[str, Any] = {"outcome": outcome}
            if commit_ts is not None:
                extra["commit_ts"] = commit_ts
            self._reporter._close_hold("tx", self.tx_id, extra)

    def __enter__(self) -> Self:
        return self.begin()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        """Commit on a normal exit, abort on an exception (see the class docstring).

        An expired transaction is aborted either way; a normal exit then raises ReaderExpired
        (the commit did not happen), an exception propagates unchanged.
        """
        if self._expiry is not None:
            self._reporter._release_expired(self)
            if et is None:
                raise self._reporter._expired_error(self)
            return
        if not self.is_open:
            return
        if et is None:
            self.end("commit")
        elif self._state == "prepared":
            log.warning(
                "prepared transaction %s left its block on %s without a decision; it stays held (in doubt) "
                "until tx.end(outcome) is called",
                self.tx_id,
                et.__name__,
            )
        else:
            self.end("abort")

    def _entry(self) -> dict[str, Any]:
        entry = self._base_entry("tx_id", self.tx_id, "begin_ts", self.begin_ts)
        if self._state == "prepared":
            entry["prepared"] = True
            entry["coordinator"] = self.coordinator
            entry["participants"] = list(self.participants or ())
        return entry

    def __repr__(self) -> str:
        return f"Transaction({self.tx_id!r}, begin_ts={self.begin_ts}, {self._state})"

    @property
    def _kind(self) -> Literal["reader", "tx"]:
        return "tx"

    @property
    def _ident(self) -> str:
        return self.tx_id

    @property
    def _ts(self) -> int | None:
        return self.begin_ts


Handle = Reader | Transaction
"""A reader or transaction handle."""

ExpireCallback = Callable[[Handle, "ExpireDirective"], object]
"""``on_expire(handle, directive)``: cancel the handle's running work now (see :meth:`Reporter.expire`)."""


def _add_optional(event: dict[str, Any], label: str | None, namespace: str | None, groups: list[str] | None) -> None:
    if groups is not None:
        event["groups"] = groups
    if namespace is not None:
        event["namespace"] = namespace
    if label is not None:
        event["label"] = label


# -- the reporter --------------------------------------------------------------------------


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


class Reporter:
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
    ) -> None:
        """Connect the producer and start the heartbeat thread.

        ``mvcc_clock`` returns the node's current MVCC time (heartbeats' ``mvcc_now``, snapshots'
        ``cut``, and the ``read_ts``/``begin_ts`` of readers and transactions opened without one).
        ``figures`` returns any of ``pinned_bytes``, ``debt_bytes`` and ``groups`` (a list of
        ``{"group", "leader", "published_min_tx_time"}``) for each heartbeat. ``incarnation``
        defaults to :func:`default_incarnation` (``state_dir`` makes it survive clock steps).
        ``heartbeat_interval_s`` of ``None`` or ``0`` starts no thread: call :meth:`heartbeat`.
        ``wall_clock`` returns milliseconds since the epoch (injectable for tests).
        ``on_expire(handle, directive)`` is called when a reader or transaction without its own
        ``on_expire`` is expired (see :meth:`expire`). ``client`` is the Kafka library:
        ``"confluent"`` (confluent-kafka, the default) or ``"kafka-python"`` (pure Python, for
        nodes where librdkafka's wheel cannot be installed; ``kafka_conf`` keys are translated).
        """
        self.node = _check_id("node", node)
        self.cluster = _check_id("cluster", cluster)
        self.topic = topic
        self.bootstrap = bootstrap
        if incarnation is None:
            incarnation = default_incarnation(node, cluster, state_dir, wall_clock)
        elif not isinstance(incarnation, int) or not 0 <= incarnation <= _MAX_INCARNATION:
            msg = f"incarnation must be an int in 0..2**53-1, got {incarnation!r}"
            raise ValueError(msg)
        self.incarnation: int = incarnation
        self._mvcc_clock = mvcc_clock
        self._figures = figures
        self._wall_clock = wall_clock
        self._produce_timeout_s = produce_timeout_s
        self._client = check_client(client)
        self._key = node.encode("utf-8")
        self._conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "client.id": f"safepoint-reporter-{node}",
            "logger": logging.getLogger("safepoint.reporter.librdkafka"),
        }
        self._conf.update(kafka_conf or {})
        self._conf["error_cb"] = self._on_error

        self._lock = threading.RLock()
        self._seq = 0
        self._safe_ts: int | None = None
        self._readers: dict[str, Reader] = {}
        self._txs: dict[str, Transaction] = {}
        self._closed = False
        self._closing = False
        self._fatal = False
        self._needs_snapshot = False
        self._warned_figures: set[str] = set()
        self._sent = 0
        self._delivered = 0
        self._failures = 0
        self._restarts = 0
        self._repairs = 0
        self._last_failure_log = 0.0
        self._last_wall = 0
        self._on_expire = on_expire
        self._expired = 0
        self._expiries_ignored = 0
        self._expire_callback_failures = 0
        self._stats_lock = threading.Lock()  # delivery reports may run in any thread that polls
        self._producer = self._new_producer()

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_interval_s:
            self._thread = threading.Thread(
                target=self._heartbeat_loop,
                args=(float(heartbeat_interval_s),),
                name=f"safepoint-heartbeat-{node}",
                daemon=True,
            )
            self._thread.start()

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
    ) -> Reader:
        """A reader handle: ``with reporter.reader(ts) as r`` publishes open and close.

        Without ``read_ts`` the reader reads at ``mvcc_clock()``, taken under the reporter's lock,
        so no heartbeat with a later ``mvcc_now`` can overtake its ``reader_open``.
        ``on_expire(reader, directive)`` overrides the reporter's callback for this reader.
        """
        if read_ts is not None:
            _check_ts("read_ts", read_ts)
        rid = _check_id("reader_id", reader_id) if reader_id is not None else _new_id("r")
        return Reader(self, read_ts, rid, label, groups, namespace, on_expire)

    def transaction(
        self,
        begin_ts: int | None = None,
        *,
        label: str | None = None,
        groups: Sequence[str] | None = None,
        namespace: str | None = None,
        tx_id: str | None = None,
        on_expire: ExpireCallback | None = None,
    ) -> Transaction:
        """A transaction handle: ``with reporter.transaction(ts) as tx`` publishes begin and end.

        ``on_expire(tx, directive)`` overrides the reporter's callback for this transaction.
        """
        if begin_ts is not None:
            _check_ts("begin_ts", begin_ts)
        tid = _check_id("tx_id", tx_id) if tx_id is not None else _new_id("t")
        return Transaction(self, begin_ts, tid, label, groups, namespace, on_expire)

    def observe_safe_ts(self, safe_ts: int) -> None:
        """Record the cluster's safe point (from a directive). It only moves forward."""
        _check_ts("safe_ts", safe_ts)
        with self._lock:
            if self._safe_ts is None or safe_ts > self._safe_ts:
                self._safe_ts = safe_ts

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

    def expire(self, directive: ExpireDirective) -> Handle | None:
        """Apply a forced-expiry directive (``"type": "expire"``) to the open handle it names.

        :class:`~safepoint.connectors.listener.DirectiveListener` calls this when it is made with
        ``reporter=``. Returns the handle, or None when the directive is a no-op (counted in
        :meth:`stats` as ``expiries_ignored``): another node or cluster, an id that is not open here
        (closed already, or opened by an earlier process), a directive older than the handle (its
        ``cluster_wall_ms`` is before the handle's open), a repeat, or a prepared transaction
        (never expired: its fate belongs to its coordinator; logged as a warning).

        The handle is marked expired and its ``on_expire(handle, directive)`` callback (else the
        reporter's) is called in this thread, so the node can cancel the running work at once. Then:

        * ``graceful``: the handle stays open (the job keeps protecting its snapshot) until the
          node's code reaches an operation boundary: :meth:`Reader.check` / :meth:`Transaction.check`,
          :meth:`Transaction.prepare` or a commit raise ReaderExpired, and release it (``reader_close``,
          or ``tx_end`` with ``abort``); a reader's block that ends normally just closes it.
        * ``hard``: the reporter releases it now (after the callback), so the job stops counting it;
          every later boundary raises ReaderExpired. A graceful expiry followed by a hard one
          escalates.
        """
        mode = directive.mode
        if mode not in ("graceful", "hard"):
            msg = f"expire directive seq {directive.seq}: mode must be 'graceful' or 'hard', got {mode!r}"
            raise ValueError(msg)
        kind: Literal["reader", "tx"] = "reader" if directive.reader_id is not None else "tx"
        ident = directive.reader_id if directive.reader_id is not None else directive.tx_id
        what = f"{'reader' if kind == 'reader' else 'transaction'} {ident}"
        with self._lock:
            if directive.cluster != self.cluster or directive.node != self.node:
                self._expiries_ignored += 1
                log.warning(
                    "reporter %s: expire directive seq %d names %s/%s, not this node (%s/%s); ignored",
                    self.node,
                    directive.seq,
                    directive.cluster,
                    directive.node,
                    self.cluster,
                    self.node,
                )
                return None
            handle: Handle | None = self._readers.get(ident or "") if kind == "reader" else self._txs.get(ident or "")
            wall = directive.cluster_wall_ms
            ignored: str | None = None
            level = logging.INFO
            if handle is None:
                ignored = "it is not open here (closed already, or opened by an earlier process)"
            elif wall is not None and handle.opened_wall_ms is not None and wall < handle.opened_wall_ms:
                ignored = f"the directive (cluster time {wall}) predates this {kind} (opened at {handle.opened_wall_ms})"
            elif isinstance(handle, Transaction) and handle.prepared:
                ignored = "it is prepared (in doubt); the job never expires a prepared transaction, its coordinator decides"
                level = logging.WARNING
            elif handle._expiry is not None and (handle._expiry.mode == "hard" or mode == "graceful"):
                ignored = f"it is already expired ({handle._expiry.mode})"
            if handle is None or ignored is not None:
                self._expiries_ignored += 1
                log.log(level, "reporter %s: expire directive seq %d for %s ignored: %s", self.node, directive.seq, what, ignored)
                return None
            handle._expiry = directive
            self._expired += 1
            callback = handle._on_expire or self._on_expire
        log.warning(
            "reporter %s: %s expired by the safe-point service (%s, directive seq %d): %s",
            self.node,
            what,
            mode,
            directive.seq,
            directive.reason,
            extra={  # the structured audit record of a forced expiry
                "safepoint": {
                    "event": "forced_expiry",
                    "cluster": self.cluster,
                    "node": self.node,
                    "kind": kind,
                    "id": ident,
                    "ts": handle._ts,
                    "label": handle.label,
                    "mode": mode,
                    "reason": directive.reason,
                    "seq": directive.seq,
                }
            },
        )
        if callback is not None:
            try:
                callback(handle, directive)
            except Exception:
                with self._lock:
                    self._expire_callback_failures += 1
                log.exception("reporter %s: on_expire failed for %s; the expiry still applies", self.node, what)
        if mode == "hard":
            self._release_expired(handle)
        return handle

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
        return self._seq

    def stats(self) -> ReporterStats:
        with self._lock, self._stats_lock:
            return ReporterStats(
                self._sent,
                self._delivered,
                self._failures,
                self._restarts,
                self._repairs,
                self._expired,
                self._expiries_ignored,
                self._expire_callback_failures,
            )

    def heartbeat(self) -> int:
        """Publish one heartbeat now (the thread does this every interval). Returns its seq.

        A pending repair snapshot (after a failed delivery) is published first.
        """
        figures = self._read_figures()
        with self._lock:
            if self._fatal or self._needs_snapshot:
                self._repair()
            event: dict[str, Any] = {"mvcc_now": _check_ts("mvcc_now", self._mvcc_clock())}
            event["active_readers"] = len(self._readers)
            event["active_txs"] = len(self._txs)
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
            producer = self._producer
        if remaining:
            log.warning(
                "reporter %s: %d event(s) were not delivered within %.1f s of close(); is %s reachable?",
                self.node,
                remaining,
                timeout_s,
                self.bootstrap,
            )
            with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
                producer.purge()
                producer.poll(0)
        with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
            producer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reporter(node={self.node!r}, cluster={self.cluster!r}, incarnation={self.incarnation}, seq={self.seq})"

    # -- handles call these ------------------------------------------------------------
    def _refuse_below_safe(self, what: str, ident: str, ts: int) -> None:
        safe = self._safe_ts
        if safe is not None and ts < safe:
            msg = (
                f"{what} {ident} at {ts} refused: it is below the cluster's safe point {safe}, so versions it "
                f"needs may already be compacted; retry with a timestamp >= {safe}"
            )
            raise ReaderRefused(msg)

    def _open_reader(self, reader: Reader) -> None:
        with self._lock:
            self._check_open()
            if reader.reader_id in self._readers:
                msg = f"reader id {reader.reader_id!r} is already open on node {self.node}; ids must be unique"
                raise SafepointError(msg)
            if reader.read_ts is None:
                reader.read_ts = _check_ts("mvcc_clock()", self._mvcc_clock())
            self._refuse_below_safe("reader", reader.reader_id, reader.read_ts)
            event: dict[str, Any] = {"reader_id": reader.reader_id, "read_ts": reader.read_ts}
            _add_optional(event, reader.label, reader.namespace, reader.groups)
            self._send("reader_open", event)
            reader.opened_wall_ms = self._last_wall
            self._readers[reader.reader_id] = reader

    def _open_tx(self, tx: Transaction) -> None:
        with self._lock:
            self._check_open()
            if tx.tx_id in self._txs:
                msg = f"transaction id {tx.tx_id!r} is already open on node {self.node}; ids must be unique"
                raise SafepointError(msg)
            if tx.begin_ts is None:
                tx.begin_ts = _check_ts("mvcc_clock()", self._mvcc_clock())
            self._refuse_below_safe("transaction", tx.tx_id, tx.begin_ts)
            event: dict[str, Any] = {"tx_id": tx.tx_id, "begin_ts": tx.begin_ts}
            _add_optional(event, tx.label, tx.namespace, tx.groups)
            self._send("tx_begin", event)
            tx.opened_wall_ms = self._last_wall
            self._txs[tx.tx_id] = tx

    def _prepare_tx(self, tx: Transaction, coordinator: str, participants: list[str]) -> None:
        with self._lock:
            self._check_open()
            self._send("tx_prepare", {"tx_id": tx.tx_id, "coordinator": coordinator, "participants": participants})

    def _close_hold(self, kind: Literal["reader", "tx"], ident: str, extra: dict[str, Any] | None = None) -> None:
        """Forget the hold locally and publish its end; a failure to publish is logged, never raised.

        (Closing runs in ``__exit__``; raising there would hide the caller's own exception. The
        job's view is repaired by the next heartbeat's snapshot.)
        """
        with self._lock:
            held = self._readers.pop(ident, None) if kind == "reader" else self._txs.pop(ident, None)
            if held is None or self._closed:
                return
            event: dict[str, Any] = {"reader_id": ident} if kind == "reader" else {"tx_id": ident}
            event.update(extra or {})
            try:
                self._send("reader_close" if kind == "reader" else "tx_end", event)
            except SafepointError as exc:
                self._needs_snapshot = True
                log.error("reporter %s: could not publish the end of %s %s: %s", self.node, kind, ident, exc)

    def _release_expired(self, handle: Handle) -> None:
        """Release an expired handle if it is still open: ``reader_close``, or ``tx_end`` abort."""
        with self._lock:
            if not handle.is_open:
                return
            handle._state = "expired"
            if isinstance(handle, Reader):
                self._close_hold("reader", handle.reader_id)
            else:
                handle.outcome = "abort"
                handle.commit_ts = None
                self._close_hold("tx", handle.tx_id, {"outcome": "abort"})

    def _enforce_expiry(self, handle: Handle) -> None:
        """The cancel point of an operation boundary: release an expired handle and raise ReaderExpired."""
        with self._lock:
            if handle._expiry is None:
                return
            self._release_expired(handle)
            raise self._expired_error(handle)

    def _expired_error(self, handle: Handle) -> ReaderExpired:
        directive = handle._expiry
        assert directive is not None
        is_reader = isinstance(handle, Reader)
        what = "reader" if is_reader else "transaction"
        ts_name = "read_ts" if is_reader else "begin_ts"
        label = f" ({handle.label})" if handle.label else ""
        outcome = "its snapshot is released" if is_reader else "it was aborted and did not commit"
        msg = (
            f"{what} {handle._ident}{label} at {ts_name} {handle._ts} on node {self.node} was expired by the "
            f"safe-point service ({directive.mode} expiry, directive seq {directive.seq}): {directive.reason}. "
            f"The operation is cancelled and {outcome}; retry it with a fresh snapshot "
            f"(a new {what} at the current time)"
        )
        return ReaderExpired(
            msg, kind=handle._kind, ident=handle._ident, mode=directive.mode, reason=directive.reason, seq=directive.seq
        )

    # -- sending -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            msg = f"reporter of node {self.node} is closed; make a new Reporter"
            raise ClientClosed(msg)

    def _publish_snapshot(self) -> int:
        """Publish the active set; call with the lock held."""
        cut = _check_ts("mvcc_clock()", self._mvcc_clock())
        event = {
            "cut": cut,
            "readers": [r._entry() for r in self._readers.values()],
            "txs": [t._entry() for t in self._txs.values()],
        }
        seq = self._send("snapshot", event)
        self._needs_snapshot = False
        return seq

    def _send(self, event_type: str, fields: dict[str, Any]) -> int:
        """Stamp, serialise and hand one event to the producer; call with the lock held.

        The seq is taken and the message queued under the same lock, so the partition sees the
        events in seq order.
        """
        self._check_open()
        if self._fatal:
            self._recreate_producer()
        seq = self._seq
        wall = self._wall_clock()
        event: dict[str, Any] = {
            "v": 1,
            "type": event_type,
            "cluster": self.cluster,
            "wall_ms": wall,
            "node": self.node,
            "incarnation": self.incarnation,
            "seq": seq,
        }
        event.update(fields)
        value = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        self._seq = seq + 1  # a seq is never reused, even if this event cannot be queued (gaps are allowed)
        self._last_wall = wall
        self._produce(value)
        self._sent += 1
        return seq

    def _produce(self, value: bytes) -> None:
        deadline = time.monotonic() + self._produce_timeout_s
        recreated = False
        while True:
            try:
                self._producer.produce(self.topic, value=value, key=self._key, on_delivery=self._on_delivery)
                break
            except BufferError:
                if time.monotonic() >= deadline:
                    msg = (
                        f"the reporter's send queue stayed full for {self._produce_timeout_s:.0f} s; "
                        f"is the broker at {self.bootstrap} reachable?"
                    )
                    raise BrokerError(msg) from None
                try:
                    self._producer.poll(0.05)
                except CLIENT_ERRORS as exc:
                    self._note_kafka_exception(exc)
                    if self._fatal and not recreated:
                        self._recreate_producer()
                        recreated = True
            except CLIENT_ERRORS as exc:
                if _is_fatal(exc.args[0] if exc.args else None) and not recreated:
                    self._fatal = True
                    self._recreate_producer()
                    recreated = True
                    continue
                msg = f"cannot publish to {self.topic} at {self.bootstrap}: {exc}"
                raise BrokerError(msg) from exc
        try:
            self._producer.poll(0)
        except CLIENT_ERRORS as exc:
            self._note_kafka_exception(exc)

    def _drain(self, timeout_s: float, repair: bool) -> int:
        """Serve delivery reports until the producer's queue is empty or ``timeout_s`` passes.

        This polls instead of calling ``Producer.flush()``: confluent-kafka 2.16's flush keeps
        serving callbacks after a fatal error has been raised in it (the idempotent producer's
        OUT_OF_ORDER_SEQUENCE_NUMBER after a broker crash), so they run with the exception pending
        and fail with ``SystemError``. ``poll()`` stops at the fatal error and raises it cleanly.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if repair and (self._fatal or self._needs_snapshot):
                repair = False  # once per call: a failing broker must not turn flush() into a snapshot loop
                with self._lock:
                    if not self._closed:
                        self._repair()
            with self._lock:
                producer = self._producer
            queued = len(producer)
            left = deadline - time.monotonic()
            if queued == 0 or left <= 0:
                return queued
            try:
                producer.poll(min(0.1, left))
            except CLIENT_ERRORS as exc:
                self._note_kafka_exception(exc)

    def _repair(self) -> None:
        """Recreate a failed producer and republish the active set; call with the lock held."""
        if self._fatal:
            self._recreate_producer()
        if self._needs_snapshot:
            self._repairs += 1
            self._publish_snapshot()

    def _new_producer(self) -> Any:
        return make_producer(self._client, self._conf)

    def _recreate_producer(self) -> None:
        """Replace a producer that hit a fatal error; call with the lock held."""
        old = self._producer
        log.warning("reporter %s: the producer hit a fatal error; recreating it and publishing a snapshot", self.node)
        with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
            old.purge()
        for _ in range(10):  # serve the purged messages' delivery reports: they count as failures
            with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
                if not old.poll(0):
                    break
        self._producer = self._new_producer()
        self._fatal = False
        self._needs_snapshot = True
        self._restarts += 1

    def _note_kafka_exception(self, exc: BaseException) -> None:
        err = exc.args[0] if exc.args else None
        if _is_fatal(err):
            self._fatal = True
            self._needs_snapshot = True
        log.warning("reporter %s: producer error: %s", self.node, exc)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        with self._stats_lock:
            if err is None:
                self._delivered += 1
                return
            self._failures += 1
            failures = self._failures
            now = time.monotonic()
            quiet = now - self._last_failure_log < 5.0
            if not quiet:
                self._last_failure_log = now
        self._needs_snapshot = True
        if _is_fatal(err):
            self._fatal = True
        if not quiet:
            log.warning(
                "reporter %s: an event was not delivered to %s (%s); %d failure(s) so far; a snapshot will repair the job's view",
                self.node,
                self.topic,
                err,
                failures,
            )

    def _on_error(self, err: KafkaError) -> None:
        if _is_fatal(err):
            self._fatal = True
            self._needs_snapshot = True
            log.error("reporter %s: fatal producer error: %s", self.node, err)
        else:
            log.debug("reporter %s: producer error: %s", self.node, err)

    # -- heartbeat thread ----------------------------------------------------------------
    def _read_figures(self) -> dict[str, Any]:
        if self._figures is None:
            return {}
        raw = self._figures()
        figures = {k: raw[k] for k in _FIGURE_KEYS if k in raw and raw[k] is not None}
        unknown = set(raw) - set(_FIGURE_KEYS) - self._warned_figures
        if unknown:
            self._warned_figures |= unknown
            log.warning("reporter %s: figures() returned unknown keys %s; they are not published", self.node, unknown)
        return figures

    def _heartbeat_loop(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.heartbeat()
            except ClientClosed:
                return
            except Exception:
                log.exception("reporter %s: heartbeat failed; retrying in %.1f s", self.node, interval_s)
            self._stop.wait(interval_s)


_is_fatal = is_fatal
