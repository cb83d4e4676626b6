"""A start on empty state: the floor that must not go back, and the picture each node must give again.

The job's state lives in its checkpoint. When a job starts without one (a wiped volume, a
redeployment, a recreated topic), two things would go wrong if it simply started over:

* its directives would restart at ``seq`` 1 below what every node has already applied, and its
  ``safe_ts`` could start below the one already sent (nodes may have compacted up to it);
* it would not know the readers and transactions opened before the events it reads (with
  ``starting_offsets = "latest"``, or once the events topic's retention dropped them), so the
  safe point could pass a live hold.

``Seed`` carries what the last directives of a cluster say (read from the compacted directives
topic when the job starts): the cluster's safe point, catalog floor and ``seq`` continue from
there. ``StartPlan`` decides which clusters start *recovering*: a recovering cluster aborts its
round (reason ``awaiting_snapshot``) for every node that has not sent a ``snapshot`` since the
start, and asks each such node for one with a ``snapshot_request`` directive; a ``Reporter``
answers by itself. A snapshot is the node's complete set of open readers and transactions, so
once every node of the round has sent one, the job knows every live hold again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from safepoint.core.ids import join_id
from safepoint.core.outputs import DIRECTIVES, Output

if TYPE_CHECKING:
    from safepoint.core.cluster import ClusterState
    from safepoint.core.node import NodeUpdate
    from safepoint.core.policy import Policy


SNAPSHOT_REQUEST = "snapshot_request"
"""The directive that asks a node for its complete set of holds."""

__all__ = ["Seed", "StartPlan", "seeds_from_directives"]


@dataclass(frozen=True, slots=True)
class Seed:
    """What the newest directives of one cluster say: the floor a new start must keep."""

    safe_ts: int | None = None
    catalog_floor: int | None = None
    seq: int = 0
    """``seq`` of the newest compaction directive (the next one is ``seq + 1``)."""
    node_seq: int = 0
    """Highest ``seq`` of the per-node directives (``expire``, ``snapshot_request``)."""
    nodes: tuple[str, ...] = ()
    """The cluster's members as of its newest compaction directive: the newest ``members`` record
    at or below its ``seq`` (a directive of an older job: the nodes of its ``basis``, which named
    every member)."""
    service_holds: Mapping[str, Any] = field(default_factory=dict)
    """The service holds the newest compaction directive carried (holder -> hold)."""
    tenants: Mapping[str, Any] = field(default_factory=dict)
    """Its ``namespace_safe_ts`` and ``namespaces`` as ``{"base": ..., "bounds": {...}}`` (empty: none)."""
    paused: Mapping[str, Any] | None = None
    """Its ``paused`` (``{"reason", "since_wall_ms"}``): the cluster was paused (None: it was not)."""

    def to_json(self) -> dict[str, Any]:
        return {"safe_ts": self.safe_ts, "catalog_floor": self.catalog_floor, "seq": self.seq,
                "node_seq": self.node_seq, "nodes": list(self.nodes), "service_holds": dict(self.service_holds),
                "tenants": dict(self.tenants), "paused": None if self.paused is None else dict(self.paused)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Seed:
        return cls(data.get("safe_ts"), data.get("catalog_floor"), int(data.get("seq") or 0),
                   int(data.get("node_seq") or 0), tuple(data.get("nodes") or ()), dict(data.get("service_holds") or {}),
                   dict(data.get("tenants") or {}), data.get("paused"))


def seeds_from_directives(values: Iterable[Mapping[str, Any]]) -> dict[str, Seed]:
    """The seed of each cluster from directive values read off the directives topic (any order,
    repeats allowed): the compaction directive with the highest ``seq``, and the highest ``seq``
    of the per-node directives. Values that are not directives are skipped."""
    newest: dict[str, Mapping[str, Any]] = {}
    members: dict[str, Mapping[str, Any]] = {}
    node_seq: dict[str, int] = {}
    for value in values:
        cluster, kind, seq = value.get("cluster"), value.get("type"), value.get("seq")
        if not isinstance(cluster, str) or not isinstance(seq, int) or isinstance(seq, bool):
            continue
        if kind == "members" and isinstance(value.get("nodes"), list):
            best = members.get(cluster)
            if best is None or seq > best["seq"]:
                members[cluster] = value
        elif kind == "compaction":
            best = newest.get(cluster)
            if best is None or seq > best["seq"]:
                newest[cluster] = value
        elif kind in ("expire", "snapshot_request"):
            node_seq[cluster] = max(node_seq.get(cluster, 0), seq)
    seeds: dict[str, Seed] = {}
    for cluster in sorted(set(newest) | set(node_seq)):
        d = newest.get(cluster)
        if d is None:
            seeds[cluster] = Seed(node_seq=node_seq[cluster])
            continue
        basis = d.get("basis")
        listed = members.get(cluster)
        if "members" in d:  # a bounded directive: its members went out in a members record
            nodes = tuple(sorted(str(n) for n in listed["nodes"])) if listed is not None and listed["seq"] <= d["seq"] else ()
        else:
            nodes = tuple(sorted(basis)) if isinstance(basis, Mapping) else ()
        seeds[cluster] = Seed(
            safe_ts=d.get("safe_ts"),
            catalog_floor=d.get("catalog_floor"),
            seq=d["seq"],
            node_seq=node_seq.get(cluster, 0),
            nodes=nodes,
            service_holds=dict(d["service_holds"]) if isinstance(d.get("service_holds"), Mapping) else {},
            tenants={"base": d["namespace_safe_ts"], "bounds": dict(d.get("namespaces") or {})}
            if isinstance(d.get("namespace_safe_ts"), int) else {},
            paused=dict(d["paused"]) if isinstance(d.get("paused"), Mapping) else None,
        )
    return seeds


@dataclass(frozen=True, slots=True)
class StartPlan:
    """How the clusters a job meets for the first time start.

    ``seeds``: clusters the directives topic already knows; each starts from its seed and
    recovers (its earlier holds may be unknown). ``recover_all``: every other cluster recovers
    too (the job does not read the events before its start: ``starting_offsets = "latest"``).
    Without either, a cluster starts fresh, as a new deployment reading its whole log does.
    """

    seeds: Mapping[str, Seed] = field(default_factory=dict)
    recover_all: bool = False

    def new_cluster(self, name: str) -> ClusterState:
        from safepoint.core.cluster import ClusterState
        from safepoint.core.control import seed_control

        state = ClusterState(name)
        seed = self.seeds.get(name)
        if seed is not None or self.recover_all:
            seed = seed or Seed()
            state.start_recovery(seed.safe_ts, seed.catalog_floor, seed.seq, seed.node_seq, seed.nodes)
            # a backup's hold outlives the checkpoint (its TTL still runs), and so does a pause
            seed_control(state, dict(seed.service_holds), seed.paused)
            if seed.tenants:  # every namespace's bound keeps going forward only
                state.tenants = {"base": seed.tenants["base"], "bounds": dict(seed.tenants["bounds"])}
        return state

    def to_json(self) -> dict[str, Any]:
        return {"seeds": {c: s.to_json() for c, s in self.seeds.items()}, "recover_all": self.recover_all}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> StartPlan:
        if not data:
            return cls()
        return cls({c: Seed.from_json(s) for c, s in (data.get("seeds") or {}).items()}, bool(data.get("recover_all")))


def recover_node(state: ClusterState, u: NodeUpdate, policy: Policy, out: list[Output]) -> None:
    """A snapshot completes a node's picture; any other event of an incomplete node that the
    round needs asks it for one (again after a lease without an answer)."""
    rec = state.recovery
    assert rec is not None
    if u.snapshot:
        if u.node not in rec["complete"]:
            rec["complete"].add(u.node)
            rec["requested"].pop(u.node, None)
            state._awaiting.discard(u.node)
            state.dirty = True
        return
    if u.node in rec["complete"]:
        return
    if u.node in state._members:
        state._awaiting.add(u.node)
    if u.node not in state._awaiting:
        return  # not in the topology: it does not count, so it is not asked (yet)
    now = state.cluster_time
    assert now is not None
    last = rec["requested"].get(u.node)
    if last is not None and now - last < policy.node_lease_ms:
        return
    rec["requested"][u.node] = now
    state.eseq += 1
    out.append(Output(DIRECTIVES, join_id(state.name, u.node), {
        "v": 1, "type": SNAPSHOT_REQUEST, "cluster": state.name, "node": u.node, "seq": state.eseq,
        "reason": "recovery", "cluster_wall_ms": now}))
