"""The outputs of an advancing round: the catalog floor and the compaction directive.

A directive's size does not grow with the cluster: it names the blocker, the ``BASIS_LISTED``
members with the lowest minimums (their incarnation, seq and minimum), how many members there
are, and ``positions``: per events partition, the offset after the cluster's last message the
job had applied, from which a checker replays every node to where the job had it (one entry per
partition, not per node). Every node's own figures are in the status. The member set itself,
which a job that lost its checkpoint must wait for, goes out as a ``members`` record (key
``<cluster>/%members``) on the directives topic with the first directive after it changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from safepoint.core.control import service_blocker
from safepoint.core.ids import escape
from safepoint.core.tenants import directive_fields

if TYPE_CHECKING:
    from safepoint.core.cluster import ClusterState

__all__ = ["BASIS_LISTED", "catalog_floor_at", "compaction_directive", "members_key", "members_record"]

BASIS_LISTED = 8
"""Members a directive's ``basis`` names: those with the lowest minimums."""


def catalog_floor_at(state: ClusterState, safe: int) -> int | None:
    """The catalog floor for ``safe``: the newest version activated at or before it, held back by
    unfinished index builds and rebalances, never below the last one (versions below it are dropped)."""
    eligible = [v for v, at in state.catalogs.items() if at <= safe]
    if not eligible:
        return state.catalog_floor
    candidate = max(eligible)
    pins = list(state.index_builds.values()) + list(state.rebalances.values())
    if pins:
        candidate = min(candidate, min(pins))
    if state.catalog_floor is not None and candidate < state.catalog_floor:
        return state.catalog_floor
    for v in [v for v in state.catalogs if v < candidate]:
        del state.catalogs[v]  # dropped versions are never needed again
    return candidate


def compaction_directive(state: ClusterState, gnode: str, now: int, retention: int) -> dict[str, Any]:
    """The directive of the current safe point; ``gnode`` is the blocking node ("": a service hold)."""
    blocker = state.nodes[gnode].blocker if gnode else None
    blocker_out = service_blocker(state, now) if not gnode else None
    if blocker is not None:
        blocker_out = {
            "node": gnode,
            "kind": blocker.kind,
            "id": blocker.id,
            "ts": blocker.ts,
            "age_ms": now - blocker.opened_wall if blocker.opened_wall is not None else None,
            "label": blocker.label,
        }
    # carried so that a job that lost its checkpoint keeps them (core/recovery.py)
    holds = state.control.holds
    pause = state.control.paused
    lowest = state._mins[:BASIS_LISTED]  # (local_min, node) of the members, lowest first
    basis = {n: {"incarnation": state.nodes[n].incarnation, "seq": state.nodes[n].seq, "local_min": m} for m, n in lowest}
    return {
        "v": 1,
        "type": "compaction",
        "cluster": state.name,
        "seq": state.dseq,
        "safe_ts": state.safe_ts,
        "catalog_floor": state.catalog_floor,
        "cluster_wall_ms": now,
        "blocker": blocker_out,
        "basis": basis,
        "members": len(state._members),
        "positions": {str(p): o for p, o in sorted(state.positions.items())},
        "retention": retention,
        **({"service_holds": {holder: dict(h) for holder, h in sorted(holds.items())}} if holds else {}),
        **({"paused": {"reason": pause["reason"], "since_wall_ms": pause["since_wall_ms"]}} if pause else {}),
        **directive_fields(state),
    }


def members_key(cluster: str) -> str:
    """The directives topic's key of a cluster's member set (no escaped node id starts with ``%``)."""
    return f"{escape(cluster)}/%members"


def members_record(state: ClusterState) -> dict[str, Any]:
    """The cluster's member set, as of the directive ``state.dseq`` (``core/recovery.py`` reads it)."""
    return {"v": 1, "type": "members", "cluster": state.name, "seq": state.dseq, "nodes": sorted(state._members)}
