"""Holders of an etcd cluster's old revisions: a paginated list, a snapshot, a backup, a watch.

While ``safepoint agent etcd`` compacts the cluster, a reader that needs an old revision holds it
with a service hold (``connectors/service_hold.py``: a TTL, renewals, a refusal raised)::

    with RevisionHold("kafka:9092", "etcd-main", "backup-1", "http://127.0.0.1:2379",
                      ttl_ms=60_000, label="nightly backup") as hold:
        for page in paginate(hold.etcd, b"/registry/", revision=hold.revision):
            write(page)            # revision hold.revision stays readable meanwhile
    # released on exit: the agent compacts past it a few directive intervals later

``RevisionHold`` takes the store's current revision, holds it (retrying with a newer revision when
the job refuses the one it took because the safe point or the compacted revision passed it while
the hold was on its way) and releases it on exit; a holder that dies is released by its TTL.
``HeldWatch`` follows a watch whose hold advances as its events are consumed, so that a watch
that must resume (its member restarted) finds its next revision still there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from safepoint.connectors.etcd_gateway import EtcdGateway
from safepoint.connectors.service_hold import HoldRefused, ServiceHold

__all__ = ["HeldWatch", "RevisionHold", "paginate"]

log = logging.getLogger("safepoint.etcd")

PASSED = ("below_safe_ts", "below_compacted_ts")
"""Refusals of a revision taken a moment too early: a newer one is taken and held instead."""


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` of every key starting with ``prefix`` (etcd's convention)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def paginate(etcd: EtcdGateway, prefix: bytes | str, *, revision: int, page: int = 100
             ) -> Iterator[list[tuple[bytes, bytes, int]]]:
    """The keys under ``prefix`` as they were at ``revision``, ``page`` at a time (Kubernetes' list
    with a continue token). Each page is one read at ``revision``: it fails with
    ``RevisionCompacted`` once that revision is compacted."""
    key = prefix.encode() if isinstance(prefix, str) else prefix
    end = prefix_end(key)
    while True:
        kvs, more, _ = etcd.range(key, end, revision=revision, limit=page)
        if kvs:
            yield kvs
        if not more or not kvs:
            return
        key = kvs[-1][0] + b"\0"


class RevisionHold:
    """Holds the store's current revision for a block; see the module docstring."""

    def __init__(self, bootstrap: str, cluster: str, holder: str, endpoints: str | list[str] | EtcdGateway, *,
                 ttl_ms: int, label: str | None = None, attempts: int = 3, **hold_options: Any) -> None:
        self.etcd = endpoints if isinstance(endpoints, EtcdGateway) else EtcdGateway(endpoints)
        self._own_gateway = not isinstance(endpoints, EtcdGateway)
        self.bootstrap, self.cluster, self.holder = bootstrap, cluster, holder
        self.ttl_ms, self.label, self.attempts = ttl_ms, label, max(1, attempts)
        self.hold_options = hold_options
        self.hold: ServiceHold | None = None
        self.revision: int | None = None

    def __enter__(self) -> RevisionHold:
        for attempt in range(self.attempts):
            revision = self.etcd.revision()
            hold = ServiceHold(self.bootstrap, self.cluster, self.holder, revision, self.ttl_ms, label=self.label,
                               **self.hold_options)
            try:
                hold.__enter__()
            except HoldRefused as exc:
                if exc.outcome.get("reason") in PASSED and attempt + 1 < self.attempts:
                    log.info("revision hold %s: revision %d passed meanwhile (%s); taking a newer one", self.holder,
                             revision, exc.outcome.get("reason"))
                    continue
                if self._own_gateway:
                    self.etcd.close()
                raise
            self.hold, self.revision = hold, revision
            return self
        msg = "unreachable"
        raise AssertionError(msg)  # pragma: no cover

    def check(self) -> None:
        """Raise ``HoldLost`` if the job refused or expired the hold since it was set."""
        assert self.hold is not None
        self.hold.check()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.hold is not None:
                self.hold.close()
        finally:
            if self._own_gateway:
                self.etcd.close()


class HeldWatch:
    """A watch of ``key``..``range_end`` from ``hold.ts`` whose hold moves forward as its events are
    consumed: after the events of revision ``r`` were handed out, the hold is advanced to ``r + 1``
    (at most every ``advance_every_s``), the first revision a resumed watch needs.

        with ServiceHold(bootstrap, "etcd-main", "cdc", ts=start, ttl_ms=30_000) as hold:
            for event in HeldWatch(etcd, b"/registry/", prefix_end(b"/registry/"), hold):
                ship(event)
    """

    def __init__(self, etcd: EtcdGateway, key: bytes | str, range_end: bytes | str | None, hold: ServiceHold, *,
                 advance_every_s: float = 1.0) -> None:
        self.etcd, self.key, self.range_end, self.hold = etcd, key, range_end, hold
        self.advance_every_s = advance_every_s
        self.next_revision = hold.ts
        """The first revision not handed out yet: where a resumed watch starts."""
        self.advances = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        last_advance = time.monotonic()
        for response in self.etcd.watch(self.key, self.range_end, self.next_revision):
            events = response.get("events", [])
            yield from events
            revisions = [int(e["kv"].get("mod_revision", 0)) for e in events if "kv" in e]
            if revisions:
                self.next_revision = max(self.next_revision, max(revisions) + 1)
            if self.next_revision > self.hold.ts and time.monotonic() - last_advance >= self.advance_every_s:
                self.hold.advance(self.next_revision)
                self.advances += 1
                last_advance = time.monotonic()
