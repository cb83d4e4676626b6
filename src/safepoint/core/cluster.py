"""One database cluster: its nodes' summaries, topology, catalog, and the safe point.

The cluster stage of the job keeps one ``ClusterState`` per cluster. It learns about nodes
only through ``NodeUpdate`` summaries and about the cluster through cluster events, and after
each one it re-evaluates the round: aborts (with alerts), the global minimum, the monotonic
safe point and the catalog floor, and emits a directive when either advances.
"""

from __future__ import annotations

from typing import Any

from sortedcontainers import SortedList

from safepoint.core.aborts import AbortSync, sync_aborts
from safepoint.core.alerts import (
    ABORT_KINDS,
    check_floor,
    check_horizon,
    check_join,
    check_stall,
    clear_violation,
    raise_violation,
    stamp_signal,
)
from safepoint.core.compaction import catalog_floor_at, compaction_directive, members_key, members_record
from safepoint.core.control import (
    CONTROL_TYPES,
    Control,
    apply_control,
    count_ignored,
    expire_service_holds,
    paused,
    service_min,
)
from safepoint.core.ids import join_id, split_id
from safepoint.core.leases import LastWalls
from safepoint.core.node import NodeUpdate
from safepoint.core.outputs import DIRECTIVES, Output
from safepoint.core.policy import Policy
from safepoint.core.records import FLOOR_KINDS, NodeRecord
from safepoint.core.recovery import recover_node
from safepoint.core.tenants import check_ns_violation, pins_all_bound, tenant_round

__all__ = ["ClusterState", "IGNORED_STALE_VERSION", "ABORT_KINDS"]

IGNORED_STALE_VERSION = "stale_version"


class ClusterState:
    """The cluster stage's state for one cluster."""

    __slots__ = (
        "name",
        "nodes",
        "topology",
        "versions",
        "catalogs",
        "index_builds",
        "rebalances",
        "cluster_time",
        "first_wall",
        "safe_ts",
        "catalog_floor",
        "dseq",
        "last_directive_wall",
        "dirty",
        "raised",
        "topology_wall",
        "eseq",
        "last_advance_wall",
        "recovery",
        "positions",
        "members_announced",
        "_members",
        "_mins",
        "_walls",
        "_unknown",
        "_missing_groups",
        "_never",
        "_awaiting",
        "_floor_alerts",
        "control",
        "tenants",
        "_ns_nodes",
        "_aborts",
        "_group_members",
        "_group_leaders",
        "_leaderless",
        "reference",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: dict[str, NodeRecord] = {}
        self.topology: dict[str, list[str]] | None = None
        self.versions: dict[str, int] = {}
        self.catalogs: dict[int, int] = {}
        self.index_builds: dict[str, int] = {}
        self.rebalances: dict[str, int] = {}
        self.cluster_time: int | None = None
        self.first_wall: int | None = None
        self.safe_ts: int | None = None
        self.catalog_floor: int | None = None
        self.dseq = 0
        self.last_directive_wall: int | None = None
        self.dirty = False
        self.raised: dict[str, dict[str, Any]] = {}
        self.topology_wall: int | None = None
        self.eseq = 0
        self.last_advance_wall: int | None = None
        self.positions: dict[int, int] = {}
        """Events partition -> the offset after the cluster's last message this stage saw there: a
        directive carries them, so that a checker can replay every node to where the job had it
        (``compaction.positions``); bounded by the partitions, not the nodes."""
        self.members_announced = False
        """The member set went out on the directives topic (a ``members`` record) since it last changed."""
        self.recovery: dict[str, Any] | None = None
        """Set after a start on empty state (``core/recovery.py``): ``expected`` nodes (the last
        directive's basis), ``complete`` nodes (sent a snapshot since), ``requested`` node -> the
        cluster time of its last snapshot request."""
        self.control = Control()
        """Service holds, pause and the outcomes of control actions (``core/control.py``)."""
        self.reference = False
        """Sync the round's abort alerts by walking every member after every event: the reference
        the incremental sync is tested against (``core/aborts.py``; not stored)."""
        self.tenants: dict[str, Any] = {}
        """The namespaces' bounds once a namespaced hold was seen (``core/tenants.py``)."""
        self._rebuild()

    # -- persistence ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nodes": {n: rec.to_json() for n, rec in self.nodes.items()},
            "topology": self.topology,
            "versions": self.versions,
            "catalogs": [[v, a] for v, a in self.catalogs.items()],
            "index_builds": self.index_builds,
            "rebalances": self.rebalances,
            "cluster_time": self.cluster_time,
            "first_wall": self.first_wall,
            "safe_ts": self.safe_ts,
            "catalog_floor": self.catalog_floor,
            "dseq": self.dseq,
            "last_directive_wall": self.last_directive_wall,
            "dirty": self.dirty,
            "raised": self.raised,
            "topology_wall": self.topology_wall,
            "eseq": self.eseq,
            "last_advance_wall": self.last_advance_wall,
            "positions": [[p, o] for p, o in sorted(self.positions.items())],
            "members_announced": self.members_announced,
            "recovery": None if self.recovery is None else {
                "expected": sorted(self.recovery["expected"]),
                "complete": sorted(self.recovery["complete"]),
                "requested": self.recovery["requested"],
            },
            **({"control": self.control.to_json()} if self.control else {}),
            **({"tenants": self.tenants} if self.tenants else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterState:
        state = cls(data["name"])
        state.nodes = {n: NodeRecord.from_json(rec) for n, rec in data["nodes"].items()}
        state.topology = data["topology"]
        state.versions = data["versions"]
        state.catalogs = {v: a for v, a in data["catalogs"]}
        state.index_builds = data["index_builds"]
        state.rebalances = data["rebalances"]
        state.cluster_time = data["cluster_time"]
        state.first_wall = data["first_wall"]
        state.safe_ts = data["safe_ts"]
        state.catalog_floor = data["catalog_floor"]
        state.dseq = data["dseq"]
        state.last_directive_wall = data["last_directive_wall"]
        state.dirty = data["dirty"]
        state.raised = data["raised"]
        state.topology_wall = data["topology_wall"]
        state.eseq = data.get("eseq", 0)
        state.last_advance_wall = data.get("last_advance_wall")
        state.positions = {p: o for p, o in data.get("positions") or ()}
        state.members_announced = bool(data.get("members_announced"))  # a state from before: announce them again
        state.control = Control.from_json(data.get("control"))
        state.tenants = data.get("tenants", {})
        recovery = data.get("recovery")
        if recovery is not None:
            state.recovery = {"expected": set(recovery["expected"]), "complete": set(recovery["complete"]),
                              "requested": dict(recovery["requested"])}
        state._rebuild()
        return state

    def _rebuild(self) -> None:
        """Recompute the derived indexes from the persisted fields."""
        self._members: set[str] = set(self.topology) if self.topology is not None else set(self.nodes)
        self._mins: SortedList = SortedList()
        self._walls = LastWalls()
        self._unknown: dict[str, str] = {}
        self._missing_groups: dict[str, list[str]] = {}
        self._never: set[str] = {n for n in self._members if n not in self.nodes}
        self._ns_nodes: set[str] = {n for n, rec in self.nodes.items() if rec.ns is not None}
        self._awaiting: set[str] = set()
        self._floor_alerts: dict[str, str] = {}  # node -> its raised retention/group violation
        self._aborts = AbortSync()  # the next round walks every member once (core/aborts.py)
        self._group_members: dict[str, set[str]] = {}  # group -> the members that report it
        self._group_leaders: dict[str, set[str]] = {}  # group -> the members that say they lead it
        self._leaderless: set[str] = set()  # groups members report that no member leads
        for aid in self.raised:
            parts = split_id(aid)
            if parts[0] == "horizon_violation" and len(parts) == 4 and parts[2] in FLOOR_KINDS:
                self._floor_alerts[parts[1]] = aid
        if self.recovery is not None:
            needed = self._members | (self.recovery["expected"] if self.topology is None else set())
            self._awaiting = needed - self.recovery["complete"]
        for node in self._members:
            rec = self.nodes.get(node)
            if rec is not None:
                self._index(node, rec)

    def _index(self, node: str, rec: NodeRecord) -> None:
        if rec.local_min is not None:
            self._mins.add((rec.local_min, node))
        else:
            self._unknown[node] = rec.unknown or "unknown"
        self._walls.set(node, rec.last_wall)
        self._index_groups(node, rec.groups, rec.led, +1)
        if self.topology is not None:
            missing = self._missing_of(node, rec)
            if missing:
                self._missing_groups[node] = missing

    def _index_groups(self, node: str, groups: list[str], led: list[str], sign: int) -> None:
        """Add (``sign`` +1) or remove (-1) a member's groups and the groups it leads, and keep
        ``_leaderless`` (a group some member reports but none leads: a leader hand-over in progress,
        so no current leader's time stands for the group and the round aborts) in step for those
        groups. (A leader that has not published yet is its own node's unknown minimum.)"""
        if not groups and not led:
            return
        for index, names in ((self._group_members, groups), (self._group_leaders, led)):
            for g in names:
                if sign > 0:
                    index.setdefault(g, set()).add(node)
                else:
                    left = index.get(g)
                    if left is not None:
                        left.discard(node)
                        if not left:
                            del index[g]
        for g in {*groups, *led}:
            if g in self._group_members and g not in self._group_leaders:
                self._leaderless.add(g)
            else:
                self._leaderless.discard(g)

    def _missing_of(self, node: str, rec: NodeRecord) -> list[str]:
        """The groups the topology requires of ``node`` that its record does not report."""
        assert self.topology is not None
        return sorted(set(self.topology.get(node) or ()) - set(rec.groups))

    def _reindex(self, node: str, rec: NodeRecord, old_min: int | None, old_last: int,
                 old_groups: tuple[list[str], list[str]] | None) -> None:
        """Re-index a member whose record changed, touching only what changed: the indexes end
        as ``_rebuild`` would make them (dict order aside, which no output depends on)."""
        new_min = rec.local_min
        if new_min != old_min:
            if old_min is not None:
                self._mins.discard((old_min, node))
            else:
                self._unknown.pop(node, None)
            if new_min is not None:
                self._mins.add((new_min, node))
        if new_min is None:
            self._unknown[node] = rec.unknown or "unknown"
        if rec.last_wall != old_last:
            self._walls.set(node, rec.last_wall)
        if old_groups is not None:
            self._index_groups(node, *old_groups, -1)
            self._index_groups(node, rec.groups, rec.led, +1)
        if old_groups is not None and self.topology is not None:
            missing = self._missing_of(node, rec)
            if missing:
                self._missing_groups[node] = missing
            else:
                self._missing_groups.pop(node, None)

    # -- inputs -----------------------------------------------------------------------
    def _advance(self, wall: int) -> None:
        if self.cluster_time is None or wall > self.cluster_time:
            self.cluster_time = wall
        if self.first_wall is None:
            self.first_wall = wall
        if self.topology is not None and self.topology_wall is None:
            self.topology_wall = wall

    def apply_node_update(self, u: NodeUpdate, policy: Policy, out: list[Output]) -> None:
        """Take one node's summary after one of its applied events, then re-evaluate."""
        self._advance(u.wall_ms)
        self._aborts.touched.add(u.node)
        rec = self.nodes.get(u.node)
        member = u.node in self._members
        fresh = rec is None
        if rec is None:
            groups: list[str] = u.groups if u.groups is not None else []
            rec = NodeRecord(u.incarnation, u.seq, u.local_min, u.unknown, u.blocker, groups, u.wall_ms, u.wall_ms, {},
                             led=u.led or [])
            self.nodes[u.node] = rec
            if self.topology is None:
                self._members.add(u.node)
                self.members_announced = False
                member = True
            self._never.discard(u.node)
            self.dirty = True
        else:
            old_min, old_last = rec.local_min, rec.last_wall
            old_groups = (rec.groups, rec.led) if u.groups is not None else None
            rec.incarnation = u.incarnation
            rec.seq = u.seq
            rec.local_min = u.local_min
            rec.unknown = u.unknown
            rec.blocker = u.blocker
            if u.groups is not None:
                rec.groups = u.groups
                rec.led = u.led or []
            if u.wall_ms > rec.last_wall:
                rec.last_wall = u.wall_ms
            if u.changed:
                self.dirty = True
            if member:
                self._reindex(u.node, rec, old_min, old_last, old_groups)
        if member and fresh:
            self._index(u.node, rec)
        holds = rec.holds
        for kind, hid in u.closed:
            holds.pop(join_id(kind, hid), None)
            if self.raised:
                clear_violation(self, join_id("horizon_violation", u.node, kind, hid), out)
        if u.ns is not None or rec.ns is not None:
            rec.ns = u.ns
            (self._ns_nodes.add if u.ns is not None else self._ns_nodes.discard)(u.node)
        for kind, hid, ts, ns in u.opened:
            holds[join_id(kind, hid)] = ts
            if self.safe_ts is not None and ts < self.safe_ts:
                raise_violation(self, u.node, kind, hid, ts, out)
            elif self.tenants:
                check_ns_violation(self, u.node, kind, hid, ts, ns, out)
        if member:
            check_horizon(self, u.node, out)
            check_floor(self, u.node, u.floor, out, pins_all_bound(self) if self.tenants else None)
        for signal in u.signals:
            if self.control and paused(self) and (signal[0] == "expire" or signal[1].get("kind") == "forced_expiry"):
                count_ignored(self, "expiry_while_paused")
                continue
            stamp_signal(self, u.node, signal, out)
        if self.recovery is not None:
            recover_node(self, u, policy, out)
        self.evaluate(policy, out)

    # -- recovery after a start on empty state (core/recovery.py) -------------------------
    def start_recovery(self, safe_ts: int | None, catalog_floor: int | None, seq: int, node_seq: int,
                       expected: tuple[str, ...] | list[str]) -> None:
        """Continue from a seed and require a snapshot of every node before it counts again."""
        self.safe_ts = safe_ts
        self.catalog_floor = catalog_floor
        self.dseq = seq
        self.eseq = node_seq
        self.recovery = {"expected": set(expected), "complete": set(), "requested": {}}
        self._rebuild()

    def apply_cluster_event(self, event: dict[str, Any], policy: Policy, out: list[Output]) -> str | None:
        """Apply a validated cluster event. Returns why it was ignored, or None."""
        kind = event["type"]
        if kind in CONTROL_TYPES:
            apply_control(self, event, lambda: pins_all_bound(self), out)
            self.evaluate(policy, out)
            return None
        version = event["version"]
        if version <= self.versions.get(kind, -1):
            return IGNORED_STALE_VERSION
        self.versions[kind] = version
        if kind == "topology":
            before = set(self._members)
            self.topology = {n: list(gs) for n, gs in event["nodes"].items()}
            self.topology_wall = self.cluster_time
            self._rebuild()
            if self._members != before:
                self.members_announced = False
            for node in sorted(self._members - before):
                check_join(self, node, out)
        elif kind == "catalog":
            self.catalogs[event["catalog_version"]] = event["activated_at"]
        elif kind == "index_build":
            if event["state"] == "started":
                self.index_builds[event["index"]] = event["catalog_version"]
            else:
                self.index_builds.pop(event["index"], None)
        elif kind == "rebalance":
            if event["state"] == "started":
                self.rebalances[event["group"]] = event["catalog_version"]
            else:
                self.rebalances.pop(event["group"], None)
        self.dirty = True
        self.evaluate(policy, out)
        return None

    # -- the round ----------------------------------------------------------------------
    def evaluate(self, policy: Policy, out: list[Output]) -> None:
        now = self.cluster_time
        if now is None or self.first_wall is None:
            return
        if self.control:
            expire_service_holds(self, now, out)
        if self.topology is None and now < self.first_wall + policy.node_lease_ms:
            return  # discovery window: every live node gets a lease to report first
        aborted = sync_aborts(self, policy, out)
        if not self._round(aborted, now, policy, out) and self.control.announce and self.safe_ts is not None:
            # the holds or the pause changed: they ride on a directive at once (same safe point), so
            # that a job that loses its checkpoint keeps them (core/recovery.py)
            self._emit(self._lowest_node(), now, policy, out)
        # after the round: a message that both ends a long gap and advances the safe point is no stall
        check_stall(self, now, policy, out)

    def _lowest_node(self) -> str:
        """The node of the lowest minimum when every member's is known ("": none, or a service hold)."""
        if not self._mins or len(self._mins) != len(self._members):
            return ""
        lmin, gnode = self._mins[0]
        service = service_min(self) if self.control else None
        return "" if service is not None and service[0] < lmin else str(gnode)

    def _round(self, aborted: bool, now: int, policy: Policy, out: list[Output]) -> bool:
        """Emit a directive if the round is not aborted and safe_ts or catalog_floor advances;
        True when it did."""
        if aborted or not self.dirty or (self.control and paused(self)):
            return False  # a pause keeps the cluster dirty: what it held back goes out after resume
        if (
            policy.directive_interval_ms
            and self.last_directive_wall is not None
            and now - self.last_directive_wall < policy.directive_interval_ms
        ):
            return False
        self.dirty = False
        if not self._members or len(self._mins) != len(self._members):
            return False
        global_min, gnode = self._mins[0]
        service = service_min(self) if self.control else None
        if service is not None and service[0] < global_min:
            global_min, gnode = service[0], ""  # "": the blocker is a service hold of the cluster
        safe = global_min if self.safe_ts is None else max(self.safe_ts, global_min)
        floor = catalog_floor_at(self, safe)
        tenants_moved = tenant_round(self, safe, now, policy, out) if (self._ns_nodes or self.tenants) else False
        if safe == self.safe_ts and floor == self.catalog_floor and not tenants_moved:
            return False
        self.safe_ts = safe
        self.catalog_floor = floor
        self.last_advance_wall = now
        clear_violation(self, "stall/-", out)
        self._emit(gnode, now, policy, out)
        return True

    def _emit(self, gnode: str, now: int, policy: Policy, out: list[Output]) -> None:
        self.dseq += 1
        self.last_directive_wall = now
        self.control.announce = False
        if not self.members_announced:
            self.members_announced = True
            out.append(Output(DIRECTIVES, members_key(self.name), members_record(self)))
        out.append(Output(DIRECTIVES, self.name, compaction_directive(self, gnode, now, policy.retention)))
