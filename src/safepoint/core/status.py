"""What pins history, as one status per cluster: the job publishes it, ``replay --status`` writes it.

The status comes in two parts, each computed from one part of the state on cluster time (no clock):

* ``node_status`` (a node's ``NodeState``): one node's figures, its bands, the count of its open holds
  by kind, its own floors (retention bound, groups' published times) and its ``status_holds``
  oldest readers and transactions with their labels;
* ``cluster_status`` (its ``ClusterState``): the safe point, catalog floor and directive ``seq``,
  the round (aborted or not, and every reason), the blocker, each node's lease and minimum, and
  the active cluster alerts.

The job writes each part to the compacted status topic when it changed in a micro-batch (key
``cluster`` and ``cluster/node``); ``assemble`` joins a cluster's parts into the status the HTTP
surface, ``safepoint view`` and ``replay --status`` show: the same function over the same parts,
so the job's status and replay's are equal for the same log.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from safepoint.core.alerts import problems
from safepoint.core.cluster import ClusterState
from safepoint.core.cost import layer_costs
from safepoint.core.holds import HELD_KINDS, KINDS, blocker_kind
from safepoint.core.ids import escape, join_id
from safepoint.core.node import NodeState
from safepoint.core.policy import Policy
from safepoint.core.records import FLOOR_KINDS, Hold

__all__ = ["LEVELS", "STATUS", "assemble", "by_cost", "cluster_status", "node_status", "status_key"]

STATUS = "status"
"""Output channel of the status parts."""
LEVELS = ("normal", "warning", "critical")
LISTED = 100
"""Round reasons and alerts a cluster's part lists (by id; all are counted by kind)."""


def blocker_kinds() -> list[str]:
    """Every kind of thing that holds history back, in the status's order: a node's holds (every
    registered kind, ``core/holds.py``), its own floor, a service hold."""
    return [*HELD_KINDS, *FLOOR_KINDS, "service"]


def status_key(cluster: str, node: str | None = None) -> str:
    """The status topic's key of a cluster's part (``cluster``) or a node's (``cluster/node``), each
    name escaped (``core/ids.py``: a ``/`` or ``%`` in a name cannot make one key read as another;
    no escaped name starts with ``%j``, so the job's own key ``%job`` is no cluster's)."""
    return escape(cluster) if node is None else join_id(cluster, node)


def forecast_of(ns: NodeState, policy: Policy) -> dict[str, Any]:
    """A node's growth rates (bytes/s, null until three heartbeats reported them) and the projected
    time until its pinned bytes reach the critical threshold (null: not growing, or critical)."""
    p = ns.pressure
    f = p.forecast
    ttc = f.time_to_critical(ns.pinned_bytes, policy.pinned_critical_enter_bytes, p.pinned_band.level == 2)
    return {"pinned_bytes_per_s": None if f.pinned_per_ms is None else round(f.pinned_per_ms * 1000),
            "debt_bytes_per_s": None if f.debt_per_ms is None else round(f.debt_per_ms * 1000),
            "time_to_critical_s": None if ttc is None else ttc // 1000,
            "forecast_raised": f.raised_since is not None}


def hold_order() -> dict[str, int]:
    """Each of ``blocker_kinds`` -> its place (ties of one timestamp are listed in this order)."""
    return {kind: i for i, kind in enumerate(blocker_kinds())}


def node_status(ns: NodeState, policy: Policy) -> dict[str, Any]:
    """One node's part of its cluster's status (``policy.status_holds`` oldest holds)."""
    lmin, unknown, _ = ns.local_min(policy)
    held = [(blocker_kind(what, h), hid, h) for what in KINDS for hid, h in ns.holds.of(what.name).items()]
    open_counts = dict.fromkeys(HELD_KINDS, 0)
    for kind, _hid, _h in held:
        open_counts[kind] += 1
    order = hold_order()

    def ranked(e: tuple[str, str, Hold]) -> tuple[int, int, str]:
        return e[2].ts, order[e[0]], e[1]

    oldest = heapq.nsmallest(policy.status_holds, held, key=ranked)
    costs: dict[tuple[str, str], int] = {}
    status: dict[str, Any] = {
        "v": 1,
        "type": "node_status",
        "cluster": ns.cluster,
        "node": ns.node,
        "incarnation": ns.incarnation,
        "seq": ns.seq,
        "wall_ms": ns.last_wall_ms,
        "clock_offset_ms": ns.clock.offset,
        "mvcc_now": ns.mvcc_now,
        "pinned_bytes": ns.pinned_bytes,
        "local_min": lmin,
        "unknown": unknown,
        "bands": {"pinned": LEVELS[ns.pressure.pinned_band.level], "age": LEVELS[ns.pressure.age_band.level]},
        "in_doubt": sorted(ns.pressure.in_doubt),
        "expiring": len(ns.pressure.expiries),
        "forecast": forecast_of(ns, policy),
    }
    if ns.wraparound_left is not None:
        status["wraparound_left"] = ns.wraparound_left
    if ns.engine is not None:
        purged, length = ns.engine
        status.update({k: v for k, v in (("purged_ts", purged), ("history_length", length)) if v is not None})
    if ns.admission:
        status["admission"] = {"throttled": ns.admission[0], "refused": ns.admission[1]}
    if ns.incs:  # other processes of the node whose holds are still kept (core/incarnations.py)
        status["incarnations"] = [{"incarnation": inc, "seq": seq, "last_log_ms": last, "twin": bool(twin)}
                                  for inc, (seq, last, twin, _since) in sorted(ns.incs.lives.items())]
    status["open"] = open_counts
    floors: list[dict[str, Any]] = []
    if ns.mvcc_now is not None:
        floors.append({"kind": "retention", "id": None, "ts": ns.mvcc_now - policy.retention})
    for gid, (leader, published) in sorted(ns.groups.items()):
        floors.append({"kind": "group", "id": gid, "ts": published, "leader": bool(leader)})
    status["floors"] = floors
    if ns.history is not None:  # the costliest holds are listed too (core/cost.py)
        floor = ns.floor_hold(policy)
        costs = layer_costs(((h.ts, (kind, hid)) for kind, hid, h in held),
                            None if isinstance(floor, str) else floor.ts, ns.history, ns.mvcc_now)
        listed = {(kind, hid) for kind, hid, _h in oldest}
        costliest = heapq.nsmallest(policy.status_holds, (x for x in held if costs[x[0], x[1]] > 0),
                                    key=lambda x: (-costs[x[0], x[1]], ranked(x)))
        oldest += [x for x in costliest if (x[0], x[1]) not in listed]
        oldest.sort(key=ranked)
        status["held_bytes"] = sum(costs.values())
    holds = []
    for kind, hid, h in oldest:
        entry = {"kind": kind, "id": hid, "ts": h.ts, "opened_wall_ms": h.opened_wall, "label": h.label}
        if h.namespace is not None:
            entry["namespace"] = h.namespace
        if costs:
            entry["cost_bytes"] = costs[kind, hid]
        holds.append(entry)
    status["holds"] = holds
    return status


def _round(cs: ClusterState, policy: Policy) -> dict[str, Any]:
    now = cs.cluster_time
    if now is None or cs.first_wall is None:
        return {"aborted": True, "reasons": [{"kind": "no_events", "node": None,
                                              "detail": "no event of the cluster has been applied yet"}]}
    if cs.members.topology is None and now < cs.first_wall + policy.node_lease_ms:
        ends = cs.first_wall + policy.node_lease_ms
        return {"aborted": True, "reasons": [{
            "kind": "discovery", "node": None, "value": ends - now, "threshold": policy.node_lease_ms,
            "detail": f"no topology yet and the discovery window has not ended: it ends in {ends - now} ms of "
                      f"cluster time (node_lease_ms {policy.node_lease_ms})"}]}
    found = sorted(problems(cs.members, cs.recovery, now, policy).items())
    reasons = [{"kind": p.kind, "node": p.node, "value": p.value, "threshold": p.threshold, "detail": p.detail}
               for _, p in found[:LISTED]]
    if cs.gaps.open and cs.gaps.frozen(now):
        until = max(g["until"] for g in cs.gaps.open.values() if g["until"] is not None and not g["acked"])
        reasons.insert(0, {"kind": "control_lost", "node": None, "value": until - now, "threshold": None,
                           "detail": "events lost from the log may have held control events (a service hold): the "
                                     f"safe point holds for {until - now} ms more of cluster time, or until an "
                                     "operator acknowledges the gap (safepoint ack-gap)"})
    if not reasons and not cs.members.names:
        reasons.append({"kind": "no_nodes", "node": None, "value": None, "threshold": None,
                        "detail": "no node of the cluster is live"})
    out: dict[str, Any] = {"aborted": bool(reasons), "reasons": reasons}
    if len(found) > LISTED:  # the list is cut: count them all
        counts: dict[str, int] = {}
        for _, p in found:
            counts[p.kind] = counts.get(p.kind, 0) + 1
        out.update(reasons_total=len(found), reason_counts=counts)
    return out


def _listed(cs: ClusterState, policy: Policy, now: int | None, never: list[str]) -> tuple[list[str], int]:
    """The nodes whose lease and minimum the cluster's part lists (``status_nodes`` of them):
    every node when they fit, else those with a problem (never reported, stale, unknown minimum,
    missing group, awaiting a snapshot, not a member) first, then the lowest minimums; and how many
    nodes with a problem did not fit (then an unlisted node is not known to be a member)."""
    records = cs.members.nodes
    names = sorted(records) + never
    if len(names) <= policy.status_nodes:
        return names, 0
    lease = policy.node_lease_ms
    awaiting = cs.recovery.awaiting if cs.recovery is not None else set()

    def rank(name: str) -> tuple[int, int, str]:
        rec = records.get(name)
        if rec is None:
            return (0, 0, name)
        trouble = (rec.local_min is None or name in cs.members.missing_groups or name in awaiting
                   or name not in cs.members or (now is not None and now - rec.last_wall > lease))
        return (0 if trouble else 1, rec.local_min if rec.local_min is not None else 0, name)

    listed = heapq.nsmallest(policy.status_nodes, names, key=rank)
    unlisted_trouble = 0 if listed and rank(listed[-1])[0] else sum(1 for n in names if rank(n)[0] == 0) - len(listed)
    return sorted(listed), unlisted_trouble


def cluster_status(cs: ClusterState, policy: Policy) -> dict[str, Any]:
    """The cluster's own part of its status."""
    now = cs.cluster_time
    blocker = None
    records = cs.members.nodes
    low = cs.round_min()  # as the round picks it
    if low is not None and low[1] == "":
        blocker = cs.control.blocker(now) if now is not None else None
    elif low is not None:
        gnode = low[1]
        b = records[gnode].blocker
        if b is not None:
            blocker = {"node": gnode, "kind": b.kind, "id": b.id, "ts": b.ts,
                       "age_ms": now - b.opened_wall if now is not None and b.opened_wall is not None else None,
                       "label": b.label, **({"cost_bytes": b.cost} if b.cost is not None else {})}
    lease = policy.node_lease_ms
    topology = set(cs.members.topology or ())
    never = sorted(topology - set(records))
    nodes: dict[str, dict[str, Any]] = {}
    listed, unlisted_trouble = _listed(cs, policy, now, never)
    for name in listed:
        rec = records.get(name)
        nodes[name] = ({"incarnation": None, "seq": None, "local_min": None, "unknown": "never reported",
                        "last_wall_ms": None, "stale": True, "member": False, "in_topology": True} if rec is None else
                       {"incarnation": rec.incarnation, "seq": rec.seq, "local_min": rec.local_min, "unknown": rec.unknown,
                        "last_wall_ms": rec.last_wall, "stale": now is not None and now - rec.last_wall > lease,
                        "member": name in cs.members, "in_topology": name in topology})
    pause = cs.control.paused
    pause = None if pause is None else {"reason": pause["reason"], "since_wall_ms": pause["since_wall_ms"]}
    raised = sorted(cs.alerts.raised.items())
    alerts = [{k: a.get(k) for k in ("id", "kind", "node", "severity", "since", "detail")} for _, a in raised[:LISTED]]
    cut: dict[str, Any] = {}
    if len(raised) > LISTED:  # the list is cut: count them all
        counts: dict[str, int] = {}
        for _, a in raised:
            k = f"{a['kind']}/{a.get('severity') or 'warning'}"
            counts[k] = counts.get(k, 0) + 1
        cut = {"alerts_total": len(raised), "alert_counts": counts}
    return {
        "v": 1,
        "type": "cluster_status",
        "cluster": cs.name,
        "safe_ts": cs.safe_ts,
        "catalog_floor": cs.catalog_floor,
        "seq": cs.dseq,
        "cluster_wall_ms": now,
        "mvcc_unit": policy.mvcc_unit,
        "paused": pause is not None,
        "pause": pause,
        "service_holds": [{"holder": holder, "ts": h["ts"], "ttl_ms": h["ttl_ms"], "label": h.get("label"),
                           "renewed_wall_ms": h["applied_ms"], "expires_after_ms": h["expires_ms"],
                           "since_wall_ms": h["since_wall_ms"], "action_id": h.get("action_id"),
                           **({"owned": True} if h.get("owner") else {})}
                          for holder, h in sorted(cs.control.holds.items())],
        "control_ignored": dict(sorted(cs.control.ignored.items())),
        "actions": [dict(a) for a in cs.control.actions],
        **cs.tenants.directive_fields(),
        "round": _round(cs, policy),
        "blocker": blocker,
        "node_lease_ms": lease,
        "has_topology": cs.members.topology is not None,
        "nodes_total": len(records) + len(never),
        **({"unlisted_trouble": unlisted_trouble} if unlisted_trouble else {}),
        "nodes": nodes,
        "alerts": alerts,
        **({"gaps": cs.gaps.status()} if cs.gaps.open else {}),
        **({"compacted_ts": cs.compacted[0], "compactions": cs.compacted[1]} if cs.compacted is not None else {}),
        **cut,
    }


def by_cost(holds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assembled status's holds ranked by cost, costliest first; holds of unknown cost after,
    oldest first (without any history curve, that is the order by age)."""
    return sorted(holds, key=lambda h: (h.get("cost_bytes") is None, -(h.get("cost_bytes") or 0)))


def _lease_of(cluster: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    """A node the cluster's part does not list (past ``status_nodes``: a member without a problem,
    unless more nodes had a problem than fit: then whether it is a member is not known, null), from
    its own part: what the cluster's part would have said."""
    now, lease, wall = cluster.get("cluster_wall_ms"), cluster.get("node_lease_ms"), p.get("wall_ms")
    known = not cluster.get("unlisted_trouble")
    return {"incarnation": p.get("incarnation"), "seq": p.get("seq"), "local_min": p.get("local_min"),
            "unknown": p.get("unknown"), "last_wall_ms": wall,
            "stale": now is not None and lease is not None and wall is not None and now - wall > lease,
            "member": True if known else None, "in_topology": bool(cluster.get("has_topology")) if known else None}


def assemble(cluster: dict[str, Any], node_parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A cluster's whole status from its two kinds of parts: holds ranked oldest first (ties by
    node, kind, id), the lag, and each node's figures joined to its lease and minimum."""
    now = cluster.get("cluster_wall_ms")
    parts = {p["node"]: p for p in node_parts}
    holds: list[dict[str, Any]] = []
    order = hold_order()
    counts = dict.fromkeys(order, 0)
    for sh in cluster.get("service_holds", []):
        counts["service"] += 1
        holds.append({"node": None, "kind": "service", "id": sh["holder"], "ts": sh["ts"],
                      "age_ms": now - sh["since_wall_ms"] if now is not None else None, "label": sh.get("label"),
                      "namespace": None, "cost_bytes": None})
    for name, p in parts.items():
        for h in p["holds"]:
            opened = h.get("opened_wall_ms")
            holds.append({"node": name, "kind": h["kind"], "id": h["id"], "ts": h["ts"],
                          "age_ms": now - opened if now is not None and opened is not None else None,
                          "label": h.get("label"), "namespace": h.get("namespace"), "cost_bytes": h.get("cost_bytes")})
        for f in p["floors"]:
            if f["ts"] is not None:
                counts[f["kind"]] += 1
                holds.append({"node": name, "kind": f["kind"], "id": f["id"], "ts": f["ts"], "age_ms": None,
                              "label": None, "namespace": None, "cost_bytes": None})
        for kind, n in p["open"].items():
            counts[kind] += n
    holds.sort(key=lambda h: (h["ts"], h["node"] or "", order.get(h["kind"], len(order)), h["id"] or ""))
    nows = [p["mvcc_now"] for p in parts.values() if p.get("mvcc_now") is not None]
    safe = cluster.get("safe_ts")
    lag = max(nows) - safe if nows and safe is not None else None
    nodes = []
    listed = cluster.get("nodes", {})
    for name in sorted(set(listed) | set(parts)):
        p = parts.get(name, {})
        lease = listed.get(name) or _lease_of(cluster, p)
        nodes.append({
            "node": name, **lease,
            "mvcc_now": p.get("mvcc_now"), "pinned_bytes": p.get("pinned_bytes"), "bands": p.get("bands"),
            "open": p.get("open"), "in_doubt": p.get("in_doubt", []), "expiring": p.get("expiring", 0),
            "forecast": p.get("forecast"), "admission": p.get("admission"), "held_bytes": p.get("held_bytes"),
            **{k: p[k] for k in ("wraparound_left", "purged_ts", "history_length") if p.get(k) is not None}})
    out = {k: v for k, v in cluster.items() if k not in ("v", "type", "nodes")}
    out.update(lag=lag, hold_counts=counts, holds=holds, nodes=nodes)
    if "namespaces" in cluster:  # each namespace's bound and what sets it (its lowest hold, or one that pins all)
        out["namespace_blockers"] = {
            ns: next((h for h in holds if h["namespace"] in (ns, None)), None) for ns in cluster["namespaces"]}
    return out
