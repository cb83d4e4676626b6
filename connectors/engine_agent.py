"""What the agents that read a database's holds share (``PostgresAgent``, ``MariaDBAgent``): one
node of a safepoint cluster that polls its engine, publishes the holds that came and went through
an observing ``Reporter``, heartbeats with the engine's figures, and takes directives and forced
expiries from a ``DirectiveListener``.

A subclass reads its engine (``observe``: one reading, connecting first where it must; ``holds``:
the reading's holds by id), says what it publishes (``_mvcc_now``, ``_figures``), takes each
reading's figures into its counters (``_read``), acts on a forced expiry (``_on_expire``) and
closes its connections (``_close``). A hold is any object with ``kind`` (``reader``, ``tx``,
``prepared``), ``id``, ``ts``, ``label``, ``opened_wall_ms`` and ``marked``.

A poll that fails says so once, publishes nothing (no close, no heartbeat: the job holds the safe
point when the node goes stale) and is tried again with back-off up to ``MAX_BACKOFF_S``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from safepoint.connectors.directive_models import Directive, ExpireDirective
from safepoint.connectors.handles import Handle, Reader, Transaction
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.errors import SafepointError

__all__ = ["AgentStats", "EngineAgent", "EngineHold", "MAX_BACKOFF_S"]

MAX_BACKOFF_S = 10.0


class EngineHold(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def ts(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def opened_wall_ms(self) -> int | None: ...
    @property
    def marked(self) -> bool: ...


@dataclass
class AgentStats:
    polls: int = 0
    heartbeats: int = 0
    failures: int = 0
    """Polls that could not read the engine."""
    holds: int = 0
    """Holds of the last poll."""
    opened: int = 0
    closed: int = 0
    directive_seq: int = 0
    safe_ts: int = 0
    expiries: int = 0
    """Forced-expiry directives for this agent's holds."""
    relabeled: int = 0
    """Holds restated with a new label (their session went idle in its transaction or back to work, a
    slot's reader went or came)."""
    expiries_not_acted: int = 0
    """Expiries the agent did not act on (each logged with why)."""


class EngineAgent:
    engine = "engine"
    """The engine's name in the agent's log lines."""
    what = "server"
    """What the agent reads, in its log lines (PostgreSQL's: the instance)."""
    read_errors: tuple[type[BaseException], ...] = (OSError,)
    """What a failed reading raises (the driver's errors)."""

    def __init__(self, bootstrap: str, cluster: str, node: str, stats: AgentStats, log: logging.Logger, *,
                 events_topic: str, directives_topic: str, poll_s: float, state_dir: str | None, client: str,
                 kafka_conf: dict[str, Any] | None, node_key: str | None, directive_key: str | None) -> None:
        self.bootstrap, self.cluster, self.node = bootstrap, cluster, node
        self.events_topic, self.directives_topic = events_topic, directives_topic
        self.poll_s = poll_s
        self.state_dir, self.client, self.kafka_conf, self.node_key = state_dir, client, kafka_conf or {}, node_key
        self.directive_key = directive_key
        self.stats = stats
        self.log = log
        self.reporter: Reporter | None = None
        self.listener: DirectiveListener | None = None
        self.on_beat: Callable[[], None] | None = None
        """Called after each heartbeat (``--stats-file`` writes the counters)."""
        self._handles: dict[str, tuple[Any, Handle]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        """Between the listener's thread (directives, expiries) and the loop."""
        self._down_since: float | None = None
        self._backoff_s = poll_s
        self._reading: Any = None

    # -- what a subclass gives --------------------------------------------------------------
    def observe(self) -> Any:
        raise NotImplementedError

    def holds(self, reading: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _mvcc_now(self) -> int:
        raise NotImplementedError

    def _figures(self) -> dict[str, Any]:
        raise NotImplementedError

    def _read(self, reading: Any) -> None:
        """Take a reading's figures into the counters (after its holds are published)."""

    def _on_expire(self, handle: Handle, directive: ExpireDirective) -> None:
        raise NotImplementedError

    def _closed(self, hold: Any) -> None:
        """A hold went (its close published)."""

    def _close(self, final: bool = False) -> None:
        """Close the agent's connections to its engine (``final``: the agent stops; else a reading failed)."""

    def _after_beat(self) -> None:
        """After each poll's heartbeat."""

    # -- start and stop -------------------------------------------------------------------
    def start_reporting(self) -> Any:
        """The first reading, the reporter with that reading's holds, then the listener (raises when the
        engine cannot be read). The holds come first: of the directives' backlog the listener hands
        over only the expiries naming a hold the reporter has open, so an expiry an earlier agent
        left untaken (one it could not act on, restarted with a wider ``--kill``) reaches this one
        whichever of the two, the listener's catch-up or the first poll, would have been quicker."""
        reading = self._fresh()
        self.reporter = Reporter(self.bootstrap, self.node, cluster=self.cluster, mvcc_clock=self._mvcc_now,
                                 figures=self._figures, heartbeat_interval_s=None, topic=self.events_topic,
                                 state_dir=self.state_dir, client=self.client, kafka_conf=self.kafka_conf,
                                 node_key=self.node_key, observer=True, on_expire=self._on_expire)
        self._sync_holds(reading)
        self.listener = DirectiveListener(self.bootstrap, self.cluster, topic=self.directives_topic,
                                          on_directive=self._take, reporter=self.reporter,
                                          kafka_conf=self.kafka_conf, client=self.client,
                                          directive_key=self.directive_key).start()
        return reading

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.reporter is not None:
            self.reporter.close()
        self._close(final=True)
        self.log.info("%s agent %s stopped: %s", self.engine, self.node, json.dumps(asdict(self.stats)))

    def run(self, until: float | None = None) -> None:
        """Poll, publish and act until ``stop()`` (or the monotonic time ``until``)."""
        assert self.reporter is not None, "start() first"
        try:
            while not self._stop.is_set() and (until is None or time.monotonic() < until):
                wait = self.poll()
                self._stop.wait(wait)
        finally:
            self.close()

    # -- one poll ----------------------------------------------------------------------------
    def _fresh(self) -> Any:
        reading = self.observe()
        self._reading = reading
        return reading

    def poll(self) -> float:
        """Read, publish what changed and a heartbeat; the time to the next poll."""
        assert self.reporter is not None
        try:
            reading = self._fresh() if self.stats.polls else self._reading or self._fresh()
        except self.read_errors as exc:
            self.stats.failures += 1
            self._close()
            if self._down_since is None:
                self._down_since = time.monotonic()
                self.log.error("%s agent: the %s cannot be read (%s); nothing is published until it can (the job holds "
                               "the safe point when this node goes stale); retrying with back-off", self.engine, self.what,
                               str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)
            return self._backoff_s
        self.stats.polls += 1
        if self._down_since is not None:
            self.log.warning("%s agent: the %s answers again after %.1f s", self.engine, self.what,
                             time.monotonic() - self._down_since)
            self._down_since = None
            self._backoff_s = self.poll_s
        self._sync_holds(reading)
        self._read(reading)
        try:
            self.reporter.heartbeat()
            self.stats.heartbeats += 1
        except SafepointError:  # the broker is away: the reporter reconnects and restates its holds
            self.log.warning("%s agent: heartbeat not published; retrying in %.1f s", self.engine, self.poll_s,
                             exc_info=True)
        if self.on_beat is not None:
            self.on_beat()
        self._after_beat()
        return self.poll_s

    def _sync_holds(self, reading: Any) -> None:
        try:
            self._sync(self.holds(reading))
        except SafepointError:  # a change not published (the broker away): the next poll tries again, and
            # the reporter restates every hold it has once deliveries work (its repair snapshot)
            self.log.warning("%s agent: a change of holds not published; retrying at the next poll", self.engine,
                             exc_info=True)

    def _sync(self, now: dict[str, Any]) -> None:
        """Close the holds that went, open those that came (lowest first: a close never comes before
        the open that replaces it, so the node's minimum never rises past a hold still there), and
        restate every hold (a snapshot: no hold closes or opens) once one's marked state changed (a
        session went idle in its transaction or back to work, a slot's reader went or came), so that
        its label says what it does now."""
        assert self.reporter is not None
        came = sorted((h for hid, h in now.items() if hid not in self._handles), key=lambda h: (h.ts, h.id))
        relabeled = 0
        for hid, (held, handle) in list(self._handles.items()):
            fresh = now.get(hid)
            if fresh is not None and fresh.marked != held.marked:
                handle.label = fresh.label
                self._handles[hid] = (fresh, handle)
                relabeled += 1
        for h in came:
            self._open(h)
        for hid in [hid for hid in self._handles if hid not in now]:
            hold, handle = self._handles.pop(hid)
            if isinstance(handle, Reader):
                handle.close()
            elif isinstance(handle, Transaction):
                handle.end("abort" if handle.expired else "commit")
            self.stats.closed += 1
            self._closed(hold)
        self.stats.holds = len(self._handles)
        if relabeled:
            self.reporter.snapshot()
            self.stats.relabeled += relabeled

    def _open(self, h: EngineHold) -> None:
        assert self.reporter is not None
        handle: Handle
        if h.kind == "reader":
            handle = self.reporter.reader(h.ts, reader_id=h.id, label=h.label)
        else:
            handle = self.reporter.transaction(h.ts, tx_id=h.id, label=h.label)
        handle.opened_wall_ms = h.opened_wall_ms
        if isinstance(handle, Reader):
            handle.open()
        else:
            assert isinstance(handle, Transaction)
            handle.begin()
            if h.kind == "prepared":  # its fate is its coordinator's: never expired
                handle.prepare(self.node, [self.node])
        self._handles[h.id] = (h, handle)
        self.stats.opened += 1

    def _take(self, directive: Directive) -> None:
        """The newest directive the listener delivered (its seq advanced, or a new generation's)."""
        with self._lock:
            self.stats.directive_seq, self.stats.safe_ts = directive.seq, directive.safe_ts

    def hold_of(self, ident: str) -> Any:
        entry = self._handles.get(ident)
        return entry[0] if entry else None

    # -- forced expiries: what both agents say of each --------------------------------------
    def _expiry_of(self, directive: ExpireDirective) -> tuple[str, Any]:
        """Counted; (the hold's id, the hold now, or None)."""
        self.stats.expiries += 1
        ident = directive.reader_id or directive.tx_id or ""
        return ident, self.hold_of(ident)

    def _record(self, ident: str, directive: ExpireDirective, hold: Any, **who: Any) -> dict[str, Any]:
        """The structured ``forced_expiry`` record of an expiry's log line."""
        return {"event": "forced_expiry", "engine": self.engine, "cluster": self.cluster, "node": self.node, "id": ident,
                "mode": directive.mode, "reason": directive.reason, "seq": directive.seq,
                "label": hold.label if hold else None, **who}

    def _not_acted(self, ident: str, directive: ExpireDirective, why: str, record: dict[str, Any]) -> None:
        self.stats.expiries_not_acted += 1
        self.log.warning("%s agent: expiry of %s (%s) not acted on: %s", self.engine, ident, directive.mode, why,
                         extra={"safepoint": {**record, "acted": False, "why": why}})
