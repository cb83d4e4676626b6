"""Lazy registration: a node publishes only the readers and transactions that can hold history back
(their opens, lazily, when asked; prepares; closes).

The job's minimum for a node is at most its retention bound, ``mvcc_now - retention`` of the
node's last heartbeat. A reader or an unprepared transaction at or above that bound can never
lower the minimum: the safe point is the same whether it was published or not. Databases open
thousands of short readers a second and a handful of long ones, so with ``Reporter(...,
retention=R)`` a hold is published only when it can matter:

- at once, when its ts is already below the bound of the last heartbeat sent (a historical read),
  and at once before this reporter's first heartbeat (the job may still hold the previous
  process's bound for the node; the heartbeat thread sends the first one at start);
- before the heartbeat whose bound would pass its ts (it has lived long enough to matter);
- when it is prepared (``tx_prepare`` needs its ``tx_begin``), or named in a snapshot.

A hold closed before any of that publishes nothing. Its publication carries ``opened_wall_ms``,
so the job still sees how long it has been open. Heartbeats keep counting every open hold.

``R`` must not exceed the job's ``retention`` (a larger one would leave holds between the two
bounds unpublished): directives announce the job's ``retention``, and a reporter whose ``R`` is
larger publishes everything it holds at once, then everything eagerly, and logs one warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from safepoint.connectors.handles import Handle, Reader, Transaction, add_optional, check_ts, refuse_below_safe
from safepoint.errors import SafepointError

if TYPE_CHECKING:
    from safepoint.connectors.admission import Admission
    from safepoint.connectors.sender import Sender

__all__ = ["HoldsMixin", "LazyRegistration"]

log = logging.getLogger("safepoint.reporter")


class LazyRegistration:
    """When a node's holds must be published (see the module docstring). ``retention`` None: always."""

    def __init__(self, node: str, retention: int | None) -> None:
        if retention is not None and (not isinstance(retention, int) or isinstance(retention, bool) or retention < 0):
            msg = f"retention must be an int >= 0 (MVCC units, the job's retention) or None, got {retention!r}"
            raise ValueError(msg)
        self.node = node
        self.retention = retention
        self.bound: int | None = None
        """The retention bound of the last heartbeat sent (None before the first)."""
        self.eager = retention is None

    def defer(self, ts: int) -> bool:
        """Whether a hold opened now at ``ts`` can wait: at or above the bound of a heartbeat this
        reporter sent. Not before its first one: after a restart the job still holds the previous
        process's bound for the node, which this reporter does not know."""
        return not self.eager and self.bound is not None and ts >= self.bound

    def heartbeat_bound(self, mvcc_now: int) -> int | None:
        """The bound the heartbeat carrying ``mvcc_now`` sets: holds below it must be published
        before that heartbeat. None when publishing eagerly."""
        if self.eager:
            return None
        assert self.retention is not None
        bound = mvcc_now - self.retention
        # never lower: if the clock stepped back, the job may still hold the higher bound until this
        # heartbeat arrives, and a hold between the two must not wait
        self.bound = bound if self.bound is None else max(self.bound, bound)
        return bound

    def job_retention(self, retention: int) -> bool:
        """The job's ``retention`` (from a directive). True when it is below ``R``: from now on
        publish eagerly (the caller publishes what waits)."""
        if self.eager or self.retention is None or retention >= self.retention:
            return False
        self.eager = True
        log.warning(
            "reporter %s: retention=%d is larger than the job's retention %d, so holds between the two bounds "
            "would not be published; publishing every reader and transaction from now on (set retention=%d or lower)",
            self.node, self.retention, retention, retention,
        )
        return True


class HoldsMixin:
    """``Reporter``'s publishing of its handles' opens, prepares and closes (its lock, handles,
    sender and ``LazyRegistration``)."""

    node: str
    _lock: threading.RLock
    _readers: dict[str, Reader]
    _txs: dict[str, Transaction]
    _safe_ts: int | None
    _ns_bounds: tuple[int, dict[str, int]] | None
    _closed: bool
    _lazy: LazyRegistration
    _sender: Sender
    _admission: Admission
    _observer: bool
    _mvcc_clock: Callable[[], int]
    _wall_clock: Callable[[], int]
    _check_open: Callable[[], None]
    _send: Callable[[str, dict[str, Any]], int]

    def _bound_of(self, namespace: str | None) -> int | None:
        """The newest bound a hold of ``namespace`` is protected at: its namespace's, or for a hold
        without one (it pins every namespace) the highest of the safe point and every namespace's
        bound (the safe point when the cluster has no namespaced holds)."""
        if self._ns_bounds is None:
            return self._safe_ts
        base, bounds = self._ns_bounds
        own = max(base, *bounds.values()) if namespace is None else bounds.get(namespace, base)
        return own if self._safe_ts is None else max(own, self._safe_ts)

    def _open(self, handle: Handle) -> None:
        """Publish a handle's open (``reader_open`` or ``tx_begin``) and start holding it."""
        held: dict[str, Any] = self._readers if handle._KIND == "reader" else self._txs
        what = "reader" if handle._KIND == "reader" else "transaction"
        with self._lock:
            self._check_open()
            if handle._ident in held:
                msg = f"{what} id {handle._ident!r} is already open on node {self.node}; ids must be unique"
                raise SafepointError(msg)
            if handle._ts is None:
                setattr(handle, handle._TS_KEY, check_ts("mvcc_clock()", self._mvcc_clock()))
            assert handle._ts is not None
            bound = self._bound_of(handle.namespace)
            if not self._observer:  # an observed hold exists already: it is reported, never refused
                refuse_below_safe(bound, what, handle._ident, handle._ts, handle.namespace, bound != self._safe_ts)
            admission = self._admission
            if not self._observer and admission.band != "normal" and admission.is_long(
                    handle.long, handle._ts, self._mvcc_clock() if admission.long_read_after is not None else None):
                admission.admit(what, handle._ident)  # raises when not admitted (connectors/admission.py)
            if self._lazy.defer(handle._ts):
                handle.opened_wall_ms = self._wall_clock()
            else:
                self._publish_open(handle)
            held[handle._ident] = handle

    def _publish_open(self, handle: Handle) -> None:
        """Publish ``reader_open`` or ``tx_begin``; a hold that waited carries when it opened."""
        event: dict[str, Any] = {handle._ID_KEY: handle._ident, handle._TS_KEY: handle._ts}
        add_optional(event, handle.label, handle.namespace, handle.groups)
        if handle.opened_wall_ms is not None:
            event["opened_wall_ms"] = handle.opened_wall_ms
        self._send("reader_open" if handle._KIND == "reader" else "tx_begin", event)
        if handle.opened_wall_ms is None:
            handle.opened_wall_ms = self._sender.last_wall
        handle._published = True

    def _publish_waiting(self, below: int | None) -> None:
        """Publish the holds that waited, all of them or those below ``below``, lowest ts first."""
        held: list[Handle] = [*self._readers.values(), *self._txs.values()]
        waiting = [h for h in held if not h._published and (below is None or (h._ts is not None and h._ts < below))]
        for h in sorted(waiting, key=lambda h: (h._ts, h._KIND, h._ident)):
            self._publish_open(h)

    def _prepare_tx(self, tx: Transaction, coordinator: str, participants: list[str]) -> None:
        with self._lock:
            self._check_open()
            if not tx._published:
                self._publish_open(tx)
            self._send("tx_prepare", {"tx_id": tx.tx_id, "coordinator": coordinator, "participants": participants})

    def _close_hold(self, kind: Literal["reader", "tx"], ident: str, extra: dict[str, Any] | None = None) -> None:
        """Forget the hold locally and publish its end; a failure to publish is logged, never raised.

        (Closing runs in ``__exit__``; raising there would hide the caller's own exception. The
        job's view is repaired by the next heartbeat's snapshot.)
        """
        with self._lock:
            held = self._readers.pop(ident, None) if kind == "reader" else self._txs.pop(ident, None)
            if held is None or self._closed or not held._published:
                return  # never published (lazy registration): the job never knew it
            event: dict[str, Any] = {"reader_id": ident} if kind == "reader" else {"tx_id": ident}
            event.update(extra or {})
            try:
                self._send("reader_close" if kind == "reader" else "tx_end", event)
            except SafepointError as exc:
                self._sender.needs_snapshot = True
                log.error("reporter %s: could not publish the end of %s %s: %s", self.node, kind, ident, exc)
