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
``ClusterState.tenants`` keeps ``{"base": namespace_safe_ts, "bounds": {ns: ts}, "limit": [...]}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from safepoint.core.alerts import stamp_alert
from safepoint.core.control import service_min
from safepoint.core.ids import join_id
from safepoint.core.outputs import Output

if TYPE_CHECKING:
    from safepoint.core.cluster import ClusterState
    from safepoint.core.policy import Policy

__all__ = ["bound_of", "check_ns_violation", "directive_fields", "pins_all_bound", "tenant_round"]

LIMIT_ID = "namespace_limit/-"


def bound_of(state: ClusterState, namespace: str | None) -> int | None:
    """The bound a hold of ``namespace`` is protected at (``safe_ts`` for no namespace)."""
    if namespace is None or not state.tenants:
        return state.safe_ts
    bounds = state.tenants.get("bounds", {})
    return bounds[namespace] if namespace in bounds else state.tenants.get("base")


def pins_all_bound(state: ClusterState) -> tuple[int, str] | None:
    """The highest bound already sent that a hold pinning every namespace (no namespace, a group's
    time, a retention bound, a service hold) must not lie below: (ts, what it is), or None."""
    best = None if state.safe_ts is None else (state.safe_ts, "safe_ts")
    t = state.tenants
    if t:
        base = t.get("base")
        if base is not None and (best is None or base > best[0]):
            best = (base, "namespace_safe_ts")
        for ns, ts in sorted(t.get("bounds", {}).items()):
            if best is None or ts > best[0]:
                best = (ts, f"namespace {ns}'s bound")
    return best


def check_ns_violation(state: ClusterState, node: str, kind: str, hid: str, ts: int, namespace: str | None,
                       out: list[Output]) -> None:
    """A new hold below a namespace bound it pins (but not below ``safe_ts``: that one is alerted as
    before): its namespace's bound, or for a hold without one, every namespace's bound."""
    if not state.tenants:
        return
    if namespace is None:
        highest = pins_all_bound(state)
        if highest is None:
            return
        bound, what = highest
        whose = f"without a namespace (it pins every namespace, {what} included)"
    else:
        known = bound_of(state, namespace)
        if known is None:
            return
        bound, whose = known, f"of namespace {namespace}"
    if ts >= bound or (state.safe_ts is not None and ts < state.safe_ts):
        return
    now = state.cluster_time
    assert now is not None
    aid = join_id("horizon_violation", node, kind, hid)
    body = {"id": aid, "kind": "horizon_violation", "node": node, "severity": "critical", "value": ts, "threshold": bound,
            "since": now, "detail": f"{kind} {hid} {whose} on node {node} needs ts {ts}, below the bound {bound} already "
                                    "sent: versions it reads may be compacted"}
    state.raised[aid] = body
    out.append(stamp_alert(state, body, "raised", now))


def tenant_round(state: ClusterState, safe: int, now: int, policy: Policy, out: list[Output]) -> bool:
    """Move the namespace bounds for a round that passes; True when any of them advanced or a
    namespace's own bound appeared or went (the directive must say so)."""
    if not state._ns_nodes and not state.tenants:
        return False
    base: int | None = None
    own: dict[str, int] = {}
    for node in state._members:
        rec = state.nodes[node]
        if rec.ns is None:
            low = rec.local_min
        else:
            low = rec.ns[0]
            for ns, ts in rec.ns[1].items():
                own[ns] = min(own.get(ns, ts), ts)
        if low is not None:
            base = low if base is None else min(base, low)
    service = service_min(state) if state.control else None
    if service is not None:
        base = service[0] if base is None else min(base, service[0])
    t = state.tenants
    before = t.get("bounds", {})
    # the cap admits, it never evicts: a tracked namespace's holds may lie below namespace_safe_ts
    kept = [ns for ns in sorted(own) if ns in before]
    fresh = [ns for ns in sorted(own) if ns not in before]
    room = max(0, policy.max_namespaces - len(kept))
    tracked, untracked = kept + fresh[:room], fresh[room:]
    for ns in untracked:  # beyond the cap: they pin all namespaces
        base = own[ns] if base is None else min(base, own[ns])
    _limit_alert(state, untracked, now, policy, out)
    prev_base = t.get("base")
    new_base = max(x for x in (prev_base, base, safe) if x is not None)
    bounds: dict[str, int] = {}
    for ns in tracked:
        candidate = own[ns] if base is None else min(base, own[ns])
        previous = before.get(ns, prev_base)
        bounds[ns] = max(safe, candidate if previous is None else max(previous, candidate))
    changed = new_base != prev_base or bounds != before
    t["base"], t["bounds"] = new_base, bounds
    return changed


def _limit_alert(state: ClusterState, untracked: list[str], now: int, policy: Policy, out: list[Output]) -> None:
    t = state.tenants
    if untracked and LIMIT_ID not in state.raised:
        body = {"id": LIMIT_ID, "kind": "namespace_limit", "node": None, "severity": "warning", "value": len(untracked),
                "threshold": policy.max_namespaces, "since": now,
                "detail": f"more namespaces have holds than max_namespaces ({policy.max_namespaces}): the holds of "
                          f"{', '.join(untracked[:5])}{' and more' if len(untracked) > 5 else ''} pin all namespaces"}
        state.raised[LIMIT_ID] = body
        out.append(stamp_alert(state, body, "raised", now))
    elif not untracked and LIMIT_ID in state.raised:
        out.append(stamp_alert(state, state.raised.pop(LIMIT_ID), "cleared", now))
    t["limit"] = untracked


def directive_fields(state: ClusterState) -> dict[str, Any]:
    """``namespace_safe_ts`` and ``namespaces`` for the directive, once namespaces are in use."""
    if not state.tenants:
        return {}
    return {"namespace_safe_ts": state.tenants.get("base"), "namespaces": dict(sorted(state.tenants.get("bounds", {}).items()))}
