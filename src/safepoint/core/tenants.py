"""Tenants: each namespace gets its own safe point, next to the cluster's.

A hold with a ``namespace`` pins that namespace only; a hold without one, every group's published
time, every node's retention bound and every service hold pin all namespaces. When a round passes,
besides ``safe_ts`` (every namespace may compact up to it, as before):

* ``namespace_safe_ts`` = max(previous, the lowest of what pins all namespaces over the members):
  the bound of a namespace with no hold of its own;
* ``namespaces[ns]`` = max(its previous bound, min(the lowest of what pins all, ns's own lowest
  hold)) for each namespace with holds of its own, where a namespace's previous bound is
  ``namespace_safe_ts`` when it had none (a reader at or above its namespace's bound is protected,
  and that bound never goes back).

Each is at least ``safe_ts``. At most ``max_namespaces`` namespaces are admitted per cluster (by
name; one already tracked is never evicted, even if the setting is lowered, since its holds may lie
below ``namespace_safe_ts``); the holds of the others pin all namespaces, with a
``namespace_limit`` alert. A new hold below its namespace's bound is a ``horizon_violation`` naming
the namespace. With no namespaced hold ever seen, nothing here runs and directives are unchanged.
``Tenants`` is the cluster's part that keeps them: ``base`` (``namespace_safe_ts``), ``bounds``
({ns: ts}) and ``limit`` (the namespaces beyond the cap at the last round).
"""

from __future__ import annotations

from typing import Any

from safepoint.core.alerts import AlertBook, Bound
from safepoint.core.ids import join_id
from safepoint.core.members import Members
from safepoint.core.outputs import Output
from safepoint.core.policy import Policy

__all__ = ["Tenants"]

LIMIT_ID = "namespace_limit/-"


class Tenants:
    """A cluster's namespace bounds, once a namespaced hold was seen (``active``); each bound only
    goes forward and is at least ``safe_ts``."""

    __slots__ = ("active", "base", "bounds", "limit")

    def __init__(self) -> None:
        self.active = False
        """A round with namespaced holds ran (or a seed carried bounds): directives carry them."""
        self.base: int | None = None
        """``namespace_safe_ts``: the bound of a namespace without holds of its own."""
        self.bounds: dict[str, int] = {}
        self.limit: list[str] = []

    def __bool__(self) -> bool:
        return self.active

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "bounds": self.bounds, "limit": self.limit} if self.active else {}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Tenants:
        t = cls()
        if data:
            t.active = True
            t.base = data.get("base")
            t.bounds = dict(data.get("bounds") or {})
            t.limit = list(data.get("limit") or [])
        return t

    def bound_of(self, namespace: str | None, safe_ts: int | None) -> int | None:
        """The bound a hold of ``namespace`` is protected at (``safe_ts`` for no namespace)."""
        if namespace is None or not self.active:
            return safe_ts
        return self.bounds[namespace] if namespace in self.bounds else self.base

    def pins_all(self, safe_ts: int | None) -> Bound | None:
        """The highest bound already sent that a hold pinning every namespace (no namespace, a group's
        time, a retention bound, a service hold) must not lie below: (ts, what it is), or None."""
        best = None if safe_ts is None else (safe_ts, "safe_ts")
        if self.active:
            if self.base is not None and (best is None or self.base > best[0]):
                best = (self.base, "namespace_safe_ts")
            for ns, ts in sorted(self.bounds.items()):
                if best is None or ts > best[0]:
                    best = (ts, f"namespace {ns}'s bound")
        return best

    def check_violation(self, book: AlertBook, node: str, kind: str, hid: str, ts: int, namespace: str | None,
                        safe_ts: int | None, now: int) -> Output | None:
        """A new hold below a namespace bound it pins (but not below ``safe_ts``: that one is alerted as
        before): its namespace's bound, or for a hold without one, every namespace's bound. The
        alert's message, or None."""
        if not self.active:
            return None
        if namespace is None:
            highest = self.pins_all(safe_ts)
            if highest is None:
                return None
            bound, what = highest
            whose = f"without a namespace (it pins every namespace, {what} included)"
        else:
            known = self.bound_of(namespace, safe_ts)
            if known is None:
                return None
            bound, whose = known, f"of namespace {namespace}"
        if ts >= bound or (safe_ts is not None and ts < safe_ts):
            return None
        aid = join_id("horizon_violation", node, kind, hid)
        return book.raise_({"id": aid, "kind": "horizon_violation", "node": node, "severity": "critical",
                                "value": ts, "threshold": bound, "since": now,
                                "detail": f"{kind} {hid} {whose} on node {node} needs ts {ts}, below the bound "
                                          f"{bound} already sent: versions it reads may be compacted"}, now)

    def round(self, members: Members, service: tuple[int, str] | None, safe: int, now: int, policy: Policy,
              book: AlertBook) -> tuple[bool, list[Output]]:
        """Move the namespace bounds for a round that passes (``service``: the lowest service hold):
        (any of them advanced or a namespace's own bound appeared or went: the directive must say so,
        the namespace limit alert's message)."""
        if not members.ns_nodes and not self.active:
            return False, []
        base: int | None = None
        own: dict[str, int] = {}
        for node in members.names:
            rec = members.nodes[node]
            if rec.ns is None:
                low = rec.local_min
            else:
                low = rec.ns[0]
                for ns, ts in rec.ns[1].items():
                    own[ns] = min(own.get(ns, ts), ts)
            if low is not None:
                base = low if base is None else min(base, low)
        if service is not None:
            base = service[0] if base is None else min(base, service[0])
        before = self.bounds
        # the cap admits, it never evicts: a tracked namespace's holds may lie below namespace_safe_ts
        kept = [ns for ns in sorted(own) if ns in before]
        fresh = [ns for ns in sorted(own) if ns not in before]
        room = max(0, policy.max_namespaces - len(kept))
        tracked, untracked = kept + fresh[:room], fresh[room:]
        for ns in untracked:  # beyond the cap: they pin all namespaces
            base = own[ns] if base is None else min(base, own[ns])
        said = self._limit_alert(untracked, now, policy, book)
        prev_base = self.base
        new_base = max(x for x in (prev_base, base, safe) if x is not None)
        bounds: dict[str, int] = {}
        for ns in tracked:
            candidate = own[ns] if base is None else min(base, own[ns])
            previous = before.get(ns, prev_base)
            bounds[ns] = max(safe, candidate if previous is None else max(previous, candidate))
        changed = new_base != prev_base or bounds != before
        self.active = True
        self.base, self.bounds = new_base, bounds
        return changed, said

    def _limit_alert(self, untracked: list[str], now: int, policy: Policy, book: AlertBook) -> list[Output]:
        """``namespace_limit`` raised while namespaces go untracked, cleared once none is."""
        self.limit = untracked
        if untracked and LIMIT_ID not in book:
            return [book.raise_({
                "id": LIMIT_ID, "kind": "namespace_limit", "node": None, "severity": "warning",
                "value": len(untracked), "threshold": policy.max_namespaces, "since": now,
                "detail": f"more namespaces have holds than max_namespaces ({policy.max_namespaces}): the holds of "
                          f"{', '.join(untracked[:5])}{' and more' if len(untracked) > 5 else ''} pin all namespaces"},
                now)]
        if not untracked and LIMIT_ID in book:
            cleared = book.clear(LIMIT_ID, now)
            assert cleared is not None
            return [cleared]
        return []

    def directive_fields(self) -> dict[str, Any]:
        """``namespace_safe_ts`` and ``namespaces`` for the directive, once namespaces are in use."""
        if not self.active:
            return {}
        return {"namespace_safe_ts": self.base, "namespaces": dict(sorted(self.bounds.items()))}
