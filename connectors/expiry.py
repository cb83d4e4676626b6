"""Forced expiry on the node: how a ``Reporter`` applies the job's ``expire`` directives.

The database calls ``check()`` on a handle at its operation boundaries; an expired reader or
transaction raises ``ReaderExpired`` there (and at ``prepare()`` and at commit), never in the
middle of an operation. ``graceful`` keeps the handle open until that boundary; ``hard``
releases it at once. ``ExpiryMixin`` holds these methods for ``Reporter``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from safepoint.connectors.handles import ExpireCallback, Handle, Reader, Transaction
from safepoint.errors import ReaderExpired

if TYPE_CHECKING:
    from safepoint.connectors.directive_models import ExpireDirective

__all__ = ["ExpiryMixin"]

log = logging.getLogger("safepoint.reporter")


class ExpiryMixin:
    """``Reporter``'s handling of expire directives (its lock, handles and counters)."""

    node: str
    cluster: str
    _lock: threading.RLock
    _readers: dict[str, Reader]
    _txs: dict[str, Transaction]
    _expired: int
    _expiries_ignored: int
    _expire_callback_failures: int
    _on_expire: ExpireCallback | None
    _observer: bool
    _close_hold: Callable[..., None]

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
        if mode == "hard" and not self._observer:  # an observer's hold ends when the engine ends it
            self._release_expired(handle)
        return handle

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
