"""The cluster stage's alerts: raised and cleared on cluster time, each with a stable id.

- **Abort alerts** (``missing_node``, ``unknown_node_min``, ``missing_group``,
  ``awaiting_snapshot``, ``leaderless_group``): one per reason the round aborts (a ``Problem``), raised when it appears
  and cleared when it is gone, from the first aborted round on: a node the topology names but
  that never reported is alerted at once (every aborted round names its reason).
- **stall**: the safe point has not advanced for ``stall_ms`` of cluster time.
- **horizon_violation**: a hold below a ``safe_ts`` already sent (a reader or transaction that
  arrived too late, a node that joined, a clock or group that went back); cleared when it closes
  or comes back above.

The functions work on a ``ClusterState``: its ``raised`` alerts (id -> body) are part of its state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from safepoint.core.ids import escape, join_id, split_id
from safepoint.core.outputs import DIRECTIVES, Output, alert
from safepoint.core.policy import Policy
from safepoint.core.records import FLOOR_KINDS, HOLD_KINDS, Blocker, Floor

if TYPE_CHECKING:
    from safepoint.core.cluster import ClusterState

__all__ = ["ABORT_KINDS", "Problem", "check_floor", "check_horizon", "check_join", "check_stall", "clear_violation",
           "problems", "raise_violation", "stamp_alert", "stamp_signal", "sync_abort_alerts"]

ABORT_KINDS = ("missing_node", "unknown_node_min", "missing_group", "awaiting_snapshot", "leaderless_group")


class Problem(NamedTuple):
    """One reason the current round must abort."""

    kind: str
    """One of ``ABORT_KINDS``."""
    node: str | None
    """The node it is about (None: a group's, ``leaderless_group``)."""
    value: int | None
    threshold: int | None
    detail: str


def sync_abort_alerts(state: ClusterState,
    found: dict[str, Problem],
    out: list[Output],
) -> None:
    """Raise what ``found`` has and ``raised`` lacks, clear the other way round (every abort kind)."""
    if not found and not state.raised:
        return
    now = state.cluster_time
    assert now is not None
    for aid in [a for a in state.raised if a.split("/", 1)[0] in ABORT_KINDS and a not in found]:
        body = state.raised.pop(aid)
        out.append(stamp_alert(state, body, "cleared", now))
    raise_new(state, found, now, out)


def raise_new(state: ClusterState, found: dict[str, Problem], now: int, out: list[Output]) -> None:
    """Raise each problem of ``found`` not raised yet, in id order."""
    # sorted: ``found`` comes partly from sets whose order depends on the hash seed and on how the
    # state was rebuilt, and replay, the job and every batch split must emit the same sequence
    for aid, (kind, node, value, threshold, detail) in sorted(found.items()):
        if aid in state.raised:
            continue
        body = {
            "id": aid,
            "kind": kind,
            "node": node,
            "severity": "warning",
            "value": value,
            "threshold": threshold,
            "since": now,
            "detail": f"{detail}; the safe point holds until it recovers",
        }
        state.raised[aid] = body
        out.append(stamp_alert(state, body, "raised", now))

def check_stall(state: ClusterState, now: int, policy: Policy, out: list[Output]) -> None:
    """Cluster time moved on by stall_ms while the safe point did not advance."""
    if state.last_advance_wall is None:
        state.last_advance_wall = now if state.first_wall is None else state.first_wall
    waited = now - state.last_advance_wall
    if not policy.stall_ms or waited < policy.stall_ms or "stall/-" in state.raised:
        return
    why = "; ".join(sorted(p.detail for p in problems(state, policy).values())[:3])
    if not why and state._mins:
        lmin, gnode = state._mins[0]
        b = state.nodes[gnode].blocker or Blocker("?", None, lmin, None, None)
        why = f"held by {b.kind} {b.id or ''} on node {gnode} at ts {b.ts}".replace("  ", " ")
    body = {"id": "stall/-", "kind": "stall", "node": None, "severity": "warning", "value": waited,
            "threshold": policy.stall_ms, "since": state.last_advance_wall,
            "detail": f"safe point has not advanced for {waited} ms of cluster time: {why or 'no directive yet'}"}
    state.raised["stall/-"] = body
    out.append(stamp_alert(state, body, "raised", now))

def raise_violation(state: ClusterState, node: str, kind: str, hid: str, ts: int, out: list[Output],
                    bound: tuple[int, str] | None = None) -> None:
    """A hold below a bound already sent (``bound``: (ts, what); default ``safe_ts``)."""
    aid = join_id("horizon_violation", node, kind, hid)
    now = state.cluster_time
    assert now is not None and state.safe_ts is not None
    limit, what = bound if bound is not None else (state.safe_ts, "safe_ts")
    body = {
        "id": aid,
        "kind": "horizon_violation",
        "node": node,
        "severity": "critical",
        "value": ts,
        "threshold": limit,
        "since": now,
        "detail": (f"the retention bound (mvcc_now - retention) of node {node} is {ts}" if kind == "retention"
                   else f"group {hid} on node {node} publishes min tx time {ts}" if kind == "group"
                   else f"{kind} {hid} on node {node} needs ts {ts}")
        + f", below {what} {limit} already sent: versions it reads may be compacted",
    }
    state.raised[aid] = body
    out.append(stamp_alert(state, body, "raised", now))

def check_horizon(state: ClusterState, node: str, out: list[Output]) -> None:
    """A member whose lowest hold is a reader or transaction below safe_ts has it alerted.

    Holds that arrive below safe_ts are alerted on arrival. This catches the others: those of
    a node that joins the topology after safe_ts passed them (they did not count before), and,
    once that hold closes, the node's next one still below safe_ts.
    """
    rec = state.nodes.get(node)
    if state.safe_ts is None or rec is None or rec.local_min is None or rec.local_min >= state.safe_ts:
        return
    blocker = rec.blocker
    if blocker is None or blocker.kind not in HOLD_KINDS or blocker.id is None:
        return
    kind = "reader" if blocker.kind == "reader" else "tx"
    if join_id("horizon_violation", node, kind, blocker.id) not in state.raised:
        raise_violation(state, node, kind, blocker.id, blocker.ts, out)

def check_join(state: ClusterState, node: str, out: list[Output]) -> None:
    """A node that joins the round: every open reader or transaction of it below safe_ts, and
    its own floor (retention bound or group time) if that is its lowest hold, is alerted now."""
    rec = state.nodes.get(node)
    if state.safe_ts is None or rec is None:
        return
    for key, ts in sorted(rec.holds.items(), key=lambda kv: (kv[1], kv[0])):
        if ts < state.safe_ts:
            kind, hid = split_id(key)
            if join_id("horizon_violation", node, kind, hid) not in state.raised:
                raise_violation(state, node, kind, hid, ts, out)
    blocker = rec.blocker
    if blocker is not None and blocker.kind in FLOOR_KINDS:
        check_floor(state, node, blocker.floor, out)

def check_floor(state: ClusterState, node: str, floor: Floor | None, out: list[Output],
                bound: tuple[int, str] | None = None) -> None:
    """A member's retention bound or group published time below the highest bound it pins
    (``bound``, from ``core/tenants.pins_all_bound`` once namespaces are in use; else ``safe_ts``)
    is a hold below the safe point (a clock or a group that went back): alerted, and cleared once
    it is back at or above."""
    aid = None
    limit = bound if bound is not None else None if state.safe_ts is None else (state.safe_ts, "safe_ts")
    if floor is not None and limit is not None and floor.ts < limit[0]:
        aid = join_id("horizon_violation", node, floor.kind, floor.id or "-")
    prev = state._floor_alerts.get(node)
    if prev is not None and prev != aid:
        del state._floor_alerts[node]
        clear_violation(state, prev, out)
    if aid is not None and aid not in state.raised:
        assert floor is not None and limit is not None
        raise_violation(state, node, floor.kind, floor.id or "-", floor.ts, out, limit)
        state._floor_alerts[node] = aid

def clear_violation(state: ClusterState, aid: str, out: list[Output]) -> None:
    body = state.raised.pop(aid, None)
    if body is not None:
        now = state.cluster_time
        assert now is not None
        out.append(stamp_alert(state, body, "cleared", now))

def stamp_alert(cluster: ClusterState, body: dict[str, Any], state: str, now: int) -> Output:
    kind = body["kind"]
    return alert(
        kind=kind,
        state=state,
        severity=body["severity"],
        cluster=cluster.name,
        node=body["node"],
        value=body["value"],
        threshold=body["threshold"],
        since_wall_ms=body["since"],
        cluster_wall_ms=now,
        detail=body["detail"],
        alert_id=f"{escape(cluster.name)}/{body['id']}",
    )


def never_problem(node: str) -> Problem:
    return Problem("missing_node", node, None, None, f"node {node} is in the topology but never reported")


def stale_problem(node: str, last: int, now: int, policy: Policy) -> Problem:
    age = now - last
    return Problem("missing_node", node, age, policy.node_lease_ms,
                   f"node {node} is stale: last event {age} ms ago in cluster time (lease {policy.node_lease_ms} ms)")


def unknown_problem(node: str, why: str) -> Problem:
    return Problem("unknown_node_min", node, None, None, f"minimum of node {node} is unknown: {why}")


def group_problem(node: str, groups: list[str]) -> Problem:
    return Problem("missing_group", node, len(groups), None,
                   f"node {node} does not report required group(s) {', '.join(groups)}")


def awaiting_problem(state: ClusterState, node: str) -> Problem:
    asked = state.recovery is not None and node in state.recovery["requested"]
    return Problem(
        "awaiting_snapshot",
        node,
        None,
        None,
        f"node {node} has not sent a snapshot since the job started on empty state, so the readers and "
        "transactions it opened before are unknown"
        + ("; a snapshot_request was sent to it" if asked else "; it has not reported since"),
    )


def leaderless_problem(state: ClusterState, group: str) -> Problem:
    holders = sorted(state._group_members.get(group, ()))
    shown = ", ".join(holders[:5]) + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
    return Problem("leaderless_group", None, len(holders), None,
                   f"group {group} has no leader (reported by {shown}, none as its leader: a leader hand-over in "
                   "progress), so no current leader's published min tx time stands for it")


def problems(state: ClusterState, policy: Policy) -> dict[str, Problem]:
    """Every reason the current round must abort, by alert id."""
    found: dict[str, Problem] = {}
    now = state.cluster_time
    assert now is not None
    if (not state._never and not state._unknown and not state._missing_groups and not state._awaiting
            and not state._leaderless
            and (not state._walls or state._walls.lowest() >= now - policy.node_lease_ms)):  # type: ignore[operator]
        return found  # the common case, nothing wrong: what the loops below would find
    for node in state._never:
        found[join_id("missing_node", node)] = never_problem(node)
    for last, node in state._walls.older_than(now - policy.node_lease_ms):
        found[join_id("missing_node", node)] = stale_problem(node, last, now, policy)
    for node, why in state._unknown.items():
        found[join_id("unknown_node_min", node)] = unknown_problem(node, why)
    for node, groups in state._missing_groups.items():
        found[join_id("missing_group", node)] = group_problem(node, groups)
    for node in state._awaiting:
        found[join_id("awaiting_snapshot", node)] = awaiting_problem(state, node)
    for group in state._leaderless:
        found[join_id("leaderless_group", group)] = leaderless_problem(state, group)
    return found


def stamp_signal(state: ClusterState, node: str, signal: list[Any], out: list[Output]) -> None:
    """Stamp a node-stage pressure output with the cluster's identity and time."""
    now = state.cluster_time
    assert now is not None
    kind, body = signal
    if kind == "snapshot_request":
        state.eseq += 1
        out.append(Output(DIRECTIVES, join_id(state.name, node), {**body, "cluster": state.name, "seq": state.eseq,
                                                                  "cluster_wall_ms": now}))
    elif kind == "expire":
        state.eseq += 1
        kind_, hid = ("reader", body["reader_id"]) if "reader_id" in body else ("tx", body["tx_id"])
        value = {**body, "cluster": state.name, "seq": state.eseq, "cluster_wall_ms": now}
        value = {k: value[k] for k in ("v", "type", "cluster", "node", "reader_id", "tx_id", "reason", "mode", "seq",
                                       "cluster_wall_ms") if k in value}
        out.append(Output(DIRECTIVES, join_id(state.name, node, kind_, hid), value))
    else:
        out.append(stamp_alert(state, {k: v for k, v in body.items() if k != "state"}, body["state"], now))
