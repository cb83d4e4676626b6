"""What a node's code holds while it reads or writes: ``Reader`` and ``Transaction`` handles.

A handle is made by its ``Reporter`` (``reporter.reader(...)``, ``reporter.transaction(...)``)
and publishes through it: ``with`` publishes the open (``reader_open`` / ``tx_begin``) on enter and
the end (``reader_close`` / ``tx_end``) on exit. ``check()`` is the operation boundary where a
forced expiry (``connectors/expiry.py``) takes effect.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from safepoint.errors import ReaderRefused, SafepointError

if TYPE_CHECKING:
    from safepoint.connectors.directive_models import ExpireDirective
    from safepoint.connectors.reporter import Reporter

__all__ = ["ExpireCallback", "Handle", "Outcome", "Reader", "Transaction", "add_optional", "check_id", "check_ts", "new_id", "refuse_below_safe"]

log = logging.getLogger("safepoint.reporter")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_INT64_MIN, _INT64_MAX = INT64_MIN, INT64_MAX

Outcome = Literal["commit", "abort"]


def check_ts(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        msg = f"{name} must be an int (an MVCC timestamp), got {type(value).__name__}"
        raise TypeError(msg)
    if not _INT64_MIN <= value <= _INT64_MAX:
        msg = f"{name} {value} does not fit in a signed 64-bit integer"
        raise ValueError(msg)
    return value


def check_id(name: str, value: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 256:
        msg = f"{name} must be a non-empty string of at most 256 characters, got {value!r}"
        raise ValueError(msg)
    return value


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class _Handle:
    """What readers and transactions share: the reporter, the optional fields, the expiry."""

    __slots__ = ("_reporter", "label", "groups", "namespace", "opened_wall_ms", "_state", "_on_expire", "_expiry",
                 "_published", "long")

    def __init__(
        self,
        reporter: Reporter,
        label: str | None,
        groups: Sequence[str] | None,
        namespace: str | None,
        on_expire: ExpireCallback | None,
        long: bool = False,
    ) -> None:
        self._reporter = reporter
        self.long = bool(long)
        """Declared long: admitted under pressure by the node's admission control (``connectors/admission.py``)."""
        self.label = label
        self.groups = list(groups) if groups is not None else None
        self.namespace = namespace
        self.opened_wall_ms: int | None = None
        self._state = "new"
        self._on_expire = on_expire
        self._expiry: ExpireDirective | None = None
        self._published = False
        """Its open was published (with lazy registration a hold may wait: ``connectors/lazy.py``)."""

    @property
    def expired(self) -> bool:
        """True once the safe-point service expired this handle (see :meth:`Reporter.expire`)."""
        return self._expiry is not None

    @property
    def expiry(self) -> ExpireDirective | None:
        """The expire directive that applies to this handle (the hard one after an escalation), or None."""
        return self._expiry

    _KIND: ClassVar[Literal["reader", "tx"]]
    _ID_KEY: ClassVar[str]
    """The name of the handle's id on the wire (``reader_id``, ``tx_id``)."""
    _TS_KEY: ClassVar[str]
    """The name of the handle's timestamp on the wire (``read_ts``, ``begin_ts``)."""

    @property
    def _kind(self) -> Literal["reader", "tx"]:
        return self._KIND

    @property
    def _ident(self) -> str:
        return str(getattr(self, self._ID_KEY))

    @property
    def _ts(self) -> int | None:
        ts: int | None = getattr(self, self._TS_KEY)
        return ts

    def _start(self, again: str) -> Self:
        """Publish the open through the reporter, once; ``again`` is the error for a second time."""
        if self._state != "new":
            raise SafepointError(again)
        self._reporter._open(self)  # type: ignore[arg-type]  # a _Handle is always a Reader or a Transaction
        self._state = "open"
        return self

    def _base_entry(self) -> dict[str, Any]:
        """The handle as it appears in a snapshot's readers or txs."""
        entry: dict[str, Any] = {self._ID_KEY: self._ident, self._TS_KEY: self._ts}
        add_optional(entry, self.label, self.namespace, self.groups)
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
        reader_id: str | None,
        label: str | None,
        groups: Sequence[str] | None,
        namespace: str | None,
        on_expire: ExpireCallback | None = None,
        long: bool = False,
    ) -> None:
        super().__init__(reporter, label, groups, namespace, on_expire, long)
        self.read_ts: int | None = None if read_ts is None else check_ts("read_ts", read_ts)
        self.reader_id = new_id("r") if reader_id is None else check_id("reader_id", reader_id)
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
        return self._start(f"reader {self.reader_id} was already opened; make a new one with reporter.reader()")

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
        return self._base_entry()

    def __repr__(self) -> str:
        return f"Reader({self.reader_id!r}, read_ts={self.read_ts}, {self._state})"

    _KIND = "reader"
    _ID_KEY = "reader_id"
    _TS_KEY = "read_ts"


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
        tx_id: str | None,
        label: str | None,
        groups: Sequence[str] | None,
        namespace: str | None,
        on_expire: ExpireCallback | None = None,
        long: bool = False,
    ) -> None:
        super().__init__(reporter, label, groups, namespace, on_expire, long)
        self.begin_ts: int | None = None if begin_ts is None else check_ts("begin_ts", begin_ts)
        self.tx_id = new_id("t") if tx_id is None else check_id("tx_id", tx_id)
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
        return self._start(f"transaction {self.tx_id} was already begun; make a new one with reporter.transaction()")

    def prepare(self, coordinator: str, participants: Iterable[str]) -> None:
        """Publish ``tx_prepare``: two-phase commit, prepared, decision unknown (in doubt).

        A cancel point: an expired transaction is aborted and raises ReaderExpired instead.
        """
        check_id("coordinator", coordinator)
        parts = [check_id("participant", p) for p in participants]
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
            check_ts("commit_ts", commit_ts)
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
        entry = self._base_entry()
        if self._state == "prepared":
            entry["prepared"] = True
            entry["coordinator"] = self.coordinator
            entry["participants"] = list(self.participants or ())
        return entry

    def __repr__(self) -> str:
        return f"Transaction({self.tx_id!r}, begin_ts={self.begin_ts}, {self._state})"

    _KIND = "tx"
    _ID_KEY = "tx_id"
    _TS_KEY = "begin_ts"


Handle = Reader | Transaction
"""A reader or transaction handle."""

ExpireCallback = Callable[[Handle, "ExpireDirective"], object]
"""``on_expire(handle, directive)``: cancel the handle's running work now (see :meth:`Reporter.expire`)."""


def refuse_below_safe(safe: int | None, what: str, ident: str, ts: int, namespace: str | None = None,
                      from_namespace: bool = False) -> None:
    """Refuse (``ReaderRefused``) a hold below the newest bound the node learnt of: the cluster's
    safe point, with ``namespace`` that namespace's bound, or (``from_namespace``, a hold without
    a namespace) the highest namespace bound above the safe point."""
    if safe is not None and ts < safe:
        if namespace is not None:
            whose = f"the bound of namespace {namespace!r}"
        elif from_namespace:
            whose = "a namespace's bound (a hold without a namespace pins every namespace)"
        else:
            whose = "the cluster's safe point"
        msg = (
            f"{what} {ident} at {ts} refused: it is below {whose} {safe}, so versions it "
            f"needs may already be compacted; retry with a timestamp >= {safe}"
        )
        raise ReaderRefused(msg)


def add_optional(event: dict[str, Any], label: str | None, namespace: str | None, groups: list[str] | None) -> None:
    if groups is not None:
        event["groups"] = groups
    if namespace is not None:
        event["namespace"] = namespace
    if label is not None:
        event["label"] = label
