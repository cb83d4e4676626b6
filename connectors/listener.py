"""The node side of the directives: learn the cluster's safe point from the compacted topic.

A :class:`DirectiveListener` reads ``safepoint.directives`` for one cluster without a consumer
group (it assigns every partition from the beginning, so a fresh node learns the latest directive
the compacted topic kept). The sink that writes directives is at-least-once, so repeats happen:
only a directive whose ``seq`` advances is delivered. Use it either way::

    listener = DirectiveListener("kafka:9092", "c1", reporter=reporter)
    while running:
        directive = listener.poll(1.0)
        if directive is not None:
            db.compact(compact_up_to(directive, db.oldest_local_hold()))

    # or in a background thread:
    listener = DirectiveListener("kafka:9092", "c1", on_directive=apply, reporter=reporter).start()

With ``reporter=`` every new ``safe_ts`` is fed to :meth:`Reporter.observe_safe_ts`, so readers
below it are refused on the node.

With ``directive_key=`` (the job's public keys: one, or a list or comma-separated string during a
rotation) a directive no key signed, or one without a signature, is never acted on: it is counted
(``unsigned``, ``bad_signatures``), logged at most once a minute, and the newest valid directive stays
in force. Without a key every directive is taken, as a topic only the job may write gives them (the
security page). A directive of a new ``generation`` (the job started on empty state: its ``seq``
starts again) is taken once its ``safe_ts`` is not below the one this listener already delivered
(counted in ``held_back`` until then); per-node directives of a new generation start their ``seq`` again. Per-node directives (forced expiry, snapshot requests after the
job lost its checkpoint) are answered as ``connectors/node_directives.py`` says.

On start the listener first catches up with the topic: of the backlog it delivers only the
directive with the highest ``seq`` (the older ones are superseded). Expiry directives of the
backlog are each delivered (each names a different reader or transaction), except, with
``reporter=``, those naming a reader or transaction the reporter does not have open: they died with
an earlier process of the node (counted as ``backlog_expires_skipped``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import fastjsonschema

from safepoint.connectors.directive_models import (
    BAND,
    DEFAULT_DIRECTIVES_TOPIC,
    SNAPSHOT_REQUEST,
    Directive,
    ExpireDirective,
    ListenerStats,
    compact_up_to,
    validator,
)
from safepoint.connectors.kafka.clients import (
    CLIENT_ERRORS,
    CONFLUENT,
    GROUP_AUTHORIZATION_FAILED,
    PARTITION_EOF,
    assign_from_beginning,
    check_client,
    consumer_conf,
    end_offsets,
    known_ends,
    make_consumer,
    read_positions,
    set_paused,
)
from safepoint.connectors.kafka.idle import IdlePause
from safepoint.connectors.node_directives import NodeDirectivesMixin
from safepoint.core.signing import verify_directive
from safepoint.errors import BrokerError, ClientClosed, ConfigError, SafepointError

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

    from safepoint.connectors.reporter import Reporter
    from safepoint.settings import Settings

__all__ = [
    "DEFAULT_DIRECTIVES_TOPIC",
    "Directive",
    "ExpireDirective",
    "DirectiveListener",
    "ListenerStats",
    "compact_up_to",
]

log = logging.getLogger("safepoint.listener")

REFUSED_LOG_EVERY_S = 60.0
"""A refused directive is logged at most this often (each one is counted)."""


def newer_in_backlog(directive: Directive, best: Directive | None) -> bool:
    """Whether ``directive``, read after ``best`` in the topic's backlog, supersedes it: a higher ``seq`` of
    the same generation, or one of another generation written later (the job that wrote last), but never
    one without a generation over one with it (an older version's, or a forgery without a key)."""
    if best is None:
        return True
    if directive.generation == best.generation:
        return directive.seq > best.seq
    return directive.generation is not None


def directive_keys(key: str | Sequence[str] | None) -> list[str]:
    """The public keys a listener verifies with: one, a list, or a comma-separated string (a rotation);
    each 64 hex digits (a ``ConfigError`` says so otherwise)."""
    keys = [k.strip() for k in (key.split(",") if isinstance(key, str) else key or []) if k.strip()]
    for k in keys:
        try:
            verify_directive({"sig": "ed25519:00"}, [k])
        except ValueError as exc:
            msg = f"directive key {k[:8]}...: {exc}"
            raise ConfigError(msg) from exc
    return keys

D = TypeVar("D")


def deliver_until_stopped(
    poll: Callable[[float], D | None],
    handler: Callable[[D], object],
    stop: threading.Event,
    retry_backoff_s: float,
    on_failure: Callable[[D], None],
) -> None:
    """Poll and hand each new directive to ``handler`` until ``stop`` is set or the source closes (the
    listener's background thread). A handler that raises is retried every ``retry_backoff_s`` until
    it succeeds or a newer directive supersedes the one it failed on: a node applies the newest safe
    point it can, never a stale one after a newer one, and never skips the newest.
    ``on_failure(directive)`` runs inside the ``except`` of a failed call (it may log the traceback)."""
    pending: D | None = None
    while not stop.is_set():
        try:
            newer = poll(0.2 if pending is None else retry_backoff_s)
        except ClientClosed:
            return
        except SafepointError as exc:
            log.warning("directive listener: %s; retrying", exc)
            stop.wait(retry_backoff_s)
            continue
        if newer is not None:
            pending = newer
        if pending is None:
            continue
        current = pending
        try:
            handler(current)
            pending = None
        except Exception:
            on_failure(current)


class DirectiveListener(NodeDirectivesMixin):
    """Follows one cluster's directives; see the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        cluster: str | None = None,
        *,
        topic: str = DEFAULT_DIRECTIVES_TOPIC,
        on_directive: Callable[[Directive], object] | None = None,
        on_expire: Callable[[ExpireDirective], object] | None = None,
        reporter: Reporter | None = None,
        node: str | None = None,
        kafka_conf: Mapping[str, Any] | None = None,
        retry_backoff_s: float = 1.0,
        client: str | None = None,
        directive_key: str | Sequence[str] | None = None,
    ) -> None:
        """``cluster`` (and ``client``, the Kafka library: ``"confluent"`` or ``"kafka-python"``)
        default to the reporter's, else ``"default"`` (and ``"confluent"``). ``node`` (default: the
        reporter's node) limits ``on_expire`` to this node's readers and transactions; with
        neither, every expiry of the cluster is delivered. ``on_directive`` is called by the
        background thread (:meth:`start`); :meth:`poll` returns directives instead. ``on_expire``
        is called in whichever thread reads the topic. With ``reporter=`` the node's expiries go to
        :meth:`Reporter.expire` first (in the same thread), then to ``on_expire``. ``directive_key``:
        the public keys directives must be signed with (see the module's text).
        """
        if client is None:
            client = reporter.client if reporter is not None else CONFLUENT
        if cluster is None:
            cluster = reporter.cluster if reporter is not None else "default"
        if node is None and reporter is not None:
            node = reporter.node
        self.cluster = cluster
        self.node = node
        self.topic = topic
        self.bootstrap = bootstrap
        self._on_directive = on_directive
        self._on_expire = on_expire
        self._reporter = reporter
        self._retry_backoff_s = retry_backoff_s
        conf = consumer_conf(bootstrap, f"safepoint-listener-{cluster}", "safepoint.listener.librdkafka", kafka_conf)
        conf["error_cb"] = self._on_error
        self._consumer = make_consumer(check_client(client), conf)

        self._partitions: set[int] = set()
        self._eof: set[int] = set()
        self._caught_up = False
        self._backlog_best: Directive | None = None
        self._keys = directive_keys(directive_key)
        self._refused_logged = -REFUSED_LOG_EVERY_S
        self._generation: str | None = None
        """The generation of the newest compaction directive delivered."""
        self._node_generation: str | None = None
        """The generation of the newest per-node directive seen."""
        self._last_seq = 0
        self._last_expire_seq = 0
        """The newest per-node directive seq seen (expire and snapshot_request share it)."""
        self._backlog_snapshot_request = False
        self._safe_ts: int | None = None
        self._catalog_floor: int | None = None
        self._last: Directive | None = None
        self._waiting_logged = False
        self._counts = {f.name: 0 for f in fields(ListenerStats)}

        self._read: dict[int, int] = {}
        """partition -> the next offset to read, from what was read (records and ends of partition)."""
        self._idle = IdlePause()
        """Once caught up, a poll that finds nothing pauses the partitions (``connectors/kafka/idle.py``)."""
        self._closed = False
        self._consumer_closed = False
        self._close_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings, cluster: str | None = None, **kwargs: Any) -> DirectiveListener:
        """A listener for the deployment ``settings`` describe (bootstrap, directives topic, extra Kafka keys)."""
        conf = settings.librdkafka()
        conf.update(kwargs.pop("kafka_conf", None) or {})
        kwargs.setdefault("client", settings.client)
        kwargs.setdefault("directive_key", settings.directive_key or None)
        return cls(
            conf.pop("bootstrap.servers"),
            cluster,
            topic=kwargs.pop("topic", settings.directives_topic),
            kafka_conf=conf,
            **kwargs,
        )

    # -- state ---------------------------------------------------------------------------
    @property
    def safe_ts(self) -> int | None:
        """The newest safe point delivered (it never goes backwards), or None before the first."""
        return self._safe_ts

    @property
    def catalog_floor(self) -> int | None:
        """The catalog floor of the newest directive delivered, or None."""
        return self._catalog_floor

    @property
    def last_directive(self) -> Directive | None:
        return self._last

    @property
    def seq(self) -> int:
        """The ``seq`` of the newest directive delivered (0 before the first)."""
        return self._last_seq

    @property
    def caught_up(self) -> bool:
        """True once the backlog the topic held at start has been read."""
        return self._caught_up

    def stats(self) -> ListenerStats:
        return ListenerStats(**self._counts)

    # -- iteration -------------------------------------------------------------------------
    def poll(self, timeout: float = 1.0) -> Directive | None:
        """The next directive of this cluster whose seq advances, or None after ``timeout`` seconds.

        Expiry directives met on the way are handed to ``on_expire`` in this thread.
        """
        if self._closed:
            msg = f"directive listener for cluster {self.cluster} is closed; make a new one"
            raise ClientClosed(msg)
        if self._thread is not None and threading.current_thread() is not self._thread:
            msg = "this listener runs in its background thread (start()); use on_directive instead of poll()"
            raise SafepointError(msg)
        return self._poll(timeout)

    def __iter__(self) -> Iterator[Directive]:
        """Yield advancing directives until :meth:`close`."""
        while not self._closed:
            directive = self.poll(1.0)
            if directive is not None:
                yield directive

    def _poll(self, timeout: float) -> Directive | None:
        if self._closed:
            closed = f"directive listener for cluster {self.cluster} is closed; make a new one"
            raise ClientClosed(closed)
        deadline = time.monotonic() + max(0.0, timeout)
        if not self._partitions and not self._assign(deadline):
            return None
        while True:
            remaining = deadline - time.monotonic()
            try:
                if self._caught_up:
                    go = self._idle.may_poll(self._ends, self._positions(), lambda: self._set_paused(False))
                    if go is not True:
                        time.sleep(max(0.0, min(float(go), remaining)))
                        if deadline - time.monotonic() <= 0:
                            return None
                        continue
                msg = self._consumer.poll(max(0.0, min(remaining, 0.2) if self._caught_up else remaining))
                offset = msg.offset() if msg is not None else None
                if msg is not None and msg.partition() is not None and offset is not None and offset >= 0:
                    err = msg.error()
                    if err is None:
                        self._read[msg.partition()] = offset + 1
                    elif err.code() == PARTITION_EOF:
                        self._read[msg.partition()] = offset  # an end of partition carries the end offset
                if self._caught_up:
                    self._idle.polled(msg is not None, self._positions(), lambda: self._set_paused(True),
                                      known_ends(self._consumer, self.topic, self._partitions))
            except CLIENT_ERRORS as exc:
                msg_text = f"cannot read {self.topic} at {self.bootstrap}: {exc}"
                raise BrokerError(msg_text) from exc
            if msg is None:
                if deadline - time.monotonic() > 0:
                    continue
                return None
            directive = self._handle(msg)
            if directive is not None:
                return directive
            if remaining <= 0:
                return None

    def _ends(self) -> dict[int, int]:
        return end_offsets(self._consumer, self.topic, self._partitions)

    def _positions(self) -> dict[int, int]:
        return read_positions(self._consumer, self.topic, self._partitions, self._read)

    def _set_paused(self, paused: bool) -> None:
        set_paused(self._consumer, self.topic, self._positions(), paused)

    def _assign(self, deadline: float) -> bool:
        """Assign every partition of the topic from the beginning; False if it does not exist yet."""
        try:
            md = self._consumer.list_topics(self.topic, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            meta = md.topics.get(self.topic)
        except CLIENT_ERRORS as exc:
            log.warning("directive listener: cannot read metadata of %s at %s: %s", self.topic, self.bootstrap, exc)
            meta = None
        if meta is None or meta.error is not None or not meta.partitions:
            if not self._waiting_logged:
                self._waiting_logged = True
                log.info("directive listener: topic %s does not exist yet at %s; waiting", self.topic, self.bootstrap)
            time.sleep(max(0.0, min(0.5, deadline - time.monotonic())))
            return False
        self._partitions = set(meta.partitions)
        assign_from_beginning(self._consumer, self.topic, self._partitions)
        return True

    def _handle(self, msg: Message) -> Directive | None:
        err = msg.error()
        if err is not None:
            if err.code() == PARTITION_EOF:
                return self._on_eof(msg.partition())
            level = logging.DEBUG if err.code() == GROUP_AUTHORIZATION_FAILED else logging.WARNING
            log.log(level, "directive listener: error reading %s: %s", self.topic, err)
            return None
        obj = self._directive_of(msg)
        if obj is None:
            return None
        kind = obj["type"]
        if kind == "compaction":
            return self._compaction(Directive.from_json(obj))
        if obj.get("generation") != self._node_generation:
            self._new_node_generation(obj.get("generation"))
        if kind == "expire":
            self._expire(ExpireDirective.from_json(obj))
        elif kind == SNAPSHOT_REQUEST:
            self._snapshot_request(obj)
        else:
            self._band(obj)
        return None

    def _directive_of(self, msg: Message) -> dict[str, Any] | None:
        """The message's directive for a node of this cluster (compaction or per-node), valid and, with
        keys, signed by one of them; None for anything else (counted, and logged where it is wrong)."""
        self._counts["received"] += 1
        raw = msg.value()
        if raw is None:
            return None  # a tombstone: nothing to apply
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            return self._invalid(msg, f"not JSON: {exc}")
        if not isinstance(obj, dict):
            return self._invalid(msg, "not a JSON object")
        if obj.get("cluster") != self.cluster:
            self._counts["other_clusters"] += 1
            return None
        if self._keys:
            why = verify_directive(obj, self._keys)
            if why is not None:
                return self._refused(msg, obj, why)
        kind = obj.get("type")
        if kind == "members":
            return None  # the cluster's member set, for a job that lost its checkpoint: nothing for a node
        if kind not in ("compaction", "expire", SNAPSHOT_REQUEST, BAND):
            return self._invalid(msg, f"unknown directive type {kind!r}")
        try:
            validator(kind)(obj)
        except fastjsonschema.JsonSchemaValueException as exc:
            return self._invalid(msg, f"invalid {kind}: {exc.message}")
        return obj

    def _compaction(self, directive: Directive) -> Directive | None:
        """A compaction directive: of the backlog at start, the newest of the generation written last is
        kept; then one whose ``seq`` advances, or the first of a new generation (``_new_generation``)."""
        if not self._caught_up:
            if newer_in_backlog(directive, self._backlog_best):
                if self._backlog_best is not None:
                    self._counts["superseded"] += 1
                self._backlog_best = directive
            else:
                self._counts["repeats"] += 1
            return None
        if directive.generation != self._generation and self._last is not None:
            if directive.generation is None:  # a job that gives no generation (an older version's): stale here
                self._counts["repeats"] += 1
                return None
            return self._new_generation(directive)
        if directive.seq <= self._last_seq:
            self._counts["repeats"] += 1
            log.debug("directive listener: ignored directive seq %d (last %d)", directive.seq, self._last_seq)
            return None
        return self._accept(directive)

    def _new_generation(self, directive: Directive) -> Directive | None:
        """A directive of another generation than the newest delivered (a job that started on empty
        state): taken, its ``seq`` from the start again, unless it would take this node's safe point back."""
        if self._safe_ts is not None and directive.safe_ts < self._safe_ts:
            self._counts["held_back"] += 1
            log.info("directive listener: generation %s's directive seq %d has safe_ts %d below this node's %d; "
                     "waiting for the new job's safe point to catch up", directive.generation, directive.seq,
                     directive.safe_ts, self._safe_ts)
            return None
        log.warning("directive listener: the job's generation changed (%s -> %s: the job started on empty state); "
                    "taking its directives from seq %d", self._generation, directive.generation, directive.seq)
        self._counts["generations"] += 1
        self._last_seq = 0
        return self._accept(directive)

    def _refused(self, msg: Message, obj: dict[str, Any], why: str) -> dict[str, Any] | None:
        """A directive no key of this listener signed: counted, logged at most every ``REFUSED_LOG_EVERY_S``."""
        self._counts["unsigned" if why == "unsigned" else "bad_signatures"] += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_EVERY_S:
            self._refused_logged = now
            log.warning("directive listener: refused a %s %s directive of cluster %s (%s [%s] offset %s; %d unsigned and "
                        "%d badly signed so far): not acted on; the newest valid directive stays in force",
                        "unsigned" if why == "unsigned" else "badly signed", obj.get("type"), self.cluster, self.topic,
                        msg.partition(), msg.offset(), self._counts["unsigned"], self._counts["bad_signatures"])
        return None

    def _on_eof(self, partition: int | None) -> Directive | None:
        if self._caught_up or partition is None:
            return None
        self._eof.add(partition)
        if not self._partitions <= self._eof:
            return None
        self._caught_up = True
        if self._backlog_snapshot_request:
            self._backlog_snapshot_request = False
            self._answer_snapshot_request()
        best, self._backlog_best = self._backlog_best, None
        return self._accept(best) if best is not None else None

    def _accept(self, directive: Directive) -> Directive:
        self._last_seq = directive.seq
        self._last = directive
        self._generation = directive.generation
        if self._safe_ts is not None and directive.safe_ts < self._safe_ts:
            log.warning(
                "directive listener: directive seq %d has safe_ts %d below the previous %d; keeping %d "
                "(was the job's checkpoint reset?)",
                directive.seq,
                directive.safe_ts,
                self._safe_ts,
                self._safe_ts,
            )
        else:
            self._safe_ts = directive.safe_ts
        self._catalog_floor = directive.catalog_floor
        self._counts["delivered"] += 1
        if self._reporter is not None:
            self._reporter.observe_safe_ts(self._safe_ts, directive.raw.get("retention"), directive.namespace_safe_ts,
                                           directive.namespaces)
            self._reporter.observe_emergency(directive.emergency is not None)
        return directive

    def _invalid(self, msg: Message, reason: str) -> dict[str, Any] | None:
        self._counts["invalid"] += 1
        log.warning("directive listener: skipped %s [%s] offset %s: %s", self.topic, msg.partition(), msg.offset(), reason)
        return None

    def _on_error(self, err: KafkaError) -> None:
        log.log(logging.ERROR if err.fatal() else logging.DEBUG, "directive listener: consumer error: %s", err)

    # -- background thread ---------------------------------------------------------------
    def start(self) -> Self:
        """Run in a background thread, calling ``on_directive`` for each advancing directive.

        A directive whose handler raises is logged and retried every ``retry_backoff_s`` until it
        succeeds or a newer directive supersedes it. With ``reporter=`` and no ``on_directive``
        the thread only keeps the reporter informed (safe point, expiries, snapshot requests).
        """
        if self._on_directive is None and self._reporter is None:
            msg = "start() needs on_directive=... or reporter=...; without either, iterate with poll() instead"
            raise SafepointError(msg)
        if self._thread is not None:
            return self
        if self._closed:
            msg = f"directive listener for cluster {self.cluster} is closed; make a new one"
            raise ClientClosed(msg)
        self._thread = threading.Thread(target=self._run, name=f"safepoint-listener-{self.cluster}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            deliver_until_stopped(self._poll, self._on_directive or (lambda _directive: None), self._stop,
                                  self._retry_backoff_s, self._handler_failed)
        finally:
            if self._closed:
                self._close_consumer()

    def _handler_failed(self, directive: Directive) -> None:
        self._counts["handler_failures"] += 1
        log.exception("directive listener: on_directive failed for seq %d; retrying in %.1f s", directive.seq,
                      self._retry_backoff_s)

    # -- closing ---------------------------------------------------------------------------
    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (if any) and close the consumer. Idempotent; safe from a handler."""
        self._closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("directive listener: the background thread did not stop within %.1f s", timeout_s)
                return
        if thread is None or thread is not threading.current_thread():
            self._close_consumer()

    def _close_consumer(self) -> None:
        with self._close_lock:
            if self._consumer_closed:
                return
            self._consumer_closed = True
        with contextlib.suppress(*CLIENT_ERRORS, RuntimeError):
            self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DirectiveListener(cluster={self.cluster!r}, topic={self.topic!r}, seq={self._last_seq})"
