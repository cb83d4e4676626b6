"""The outputs of an advancing round: the catalog floor and the compaction directive."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from safepoint.core.control import service_blocker
from safepoint.core.tenants import directive_fields

if TYPE_CHECKING:
    from safepoint.core.cluster import ClusterState

__all__ = ["catalog_floor_at", "compaction_directive"]


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
    basis = {
        n: {"incarnation": state.nodes[n].incarnation, "seq": state.nodes[n].seq, "local_min": state.nodes[n].local_min}
        for n in sorted(state._members)
    }
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
        "retention": retention,
        **({"service_holds": {holder: dict(h) for holder, h in sorted(holds.items())}} if holds else {}),
        **({"paused": {"reason": pause["reason"], "since_wall_ms": pause["since_wall_ms"]}} if pause else {}),
        **directive_fields(state),
    }
