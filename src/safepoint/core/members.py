"""A cluster's nodes and which of them count: the records the round reads, and their indexes.

``Members`` owns every node's ``NodeRecord`` (what the node stage's ``NodeUpdate`` summaries said)
and the topology. The *members* are the nodes the round waits for: the topology's nodes once one
was published, else every node that reported. Beside the records it keeps the indexes the round
needs after every event, updated in place so that an event costs the same at 10 or 10,000 nodes:

* ``mins``: (local minimum, node) of every member whose minimum is known, lowest first
  (``core/sortedpairs.py``);
* ``walls``: the log time of each member's newest event (the lease clock, ``core/leases.py``);
* ``unknown``, ``missing_groups``, ``never``, ``leaderless``: the members (and groups) that abort
  the round (``core/aborts.py`` alerts them);
* ``ns_nodes``: the nodes with namespaced holds (``core/tenants.py``).

Invariant: the indexes are what ``rebuild`` makes of the records and the topology (dict order
aside, which no output depends on). ``test_properties`` checks it after every step of random logs.
"""

from __future__ import annotations

from typing import Any

from safepoint.core.leases import LastWalls
from safepoint.core.records import NodeRecord, NodeUpdate
from safepoint.core.sortedpairs import SortedPairs

__all__ = ["Members"]


class Members:
    """The nodes of one cluster, their records, the topology and the round's indexes."""

    __slots__ = ("nodes", "topology", "names", "mins", "walls", "unknown", "missing_groups", "never", "ns_nodes",
                 "group_members", "group_leaders", "leaderless", "announced", "extra")

    def __init__(self, nodes: dict[str, NodeRecord] | None = None,
                 topology: dict[str, list[str]] | None = None) -> None:
        self.nodes: dict[str, NodeRecord] = nodes if nodes is not None else {}
        self.topology = topology
        self.announced = False
        """The member set went out on the directives topic (a ``members`` record) since it last changed."""
        self.extra: set[str] | None = None
        """Nodes that count beside the topology's while a topology may have been lost with events the job
        never read (``core/gaps.py``): the nodes live then, and any seen since; None: the topology alone."""
        self.rebuild()

    def to_stored(self) -> dict[str, Any]:
        """Its fields of the cluster's stored form (``ClusterState.to_json``)."""
        return {"nodes": {n: rec.to_json() for n, rec in self.nodes.items()}, "topology": self.topology,
                "members_announced": self.announced,
                **({"members_extra": sorted(self.extra)} if self.extra is not None else {})}

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> Members:
        m = cls({n: NodeRecord.from_json(rec) for n, rec in data["nodes"].items()}, data["topology"])
        m.announced = bool(data.get("members_announced"))  # a state from before: announce them again
        if data.get("members_extra") is not None:
            m.extra = set(data["members_extra"])
            m.rebuild()
        return m

    def announce(self) -> bool:
        """True when the member set is to go out (a ``members`` record), once per change."""
        if self.announced:
            return False
        self.announced = True
        return True

    def rebuild(self) -> None:
        """Recompute every index from the records and the topology."""
        self.names: set[str] = set(self.topology) if self.topology is not None else set(self.nodes)
        if self.topology is not None and self.extra is not None:
            self.names |= self.extra
        self.unknown: dict[str, str] = {}
        self.missing_groups: dict[str, list[str]] = {}
        self.never: set[str] = {n for n in self.names if n not in self.nodes}
        self.ns_nodes: set[str] = {n for n, rec in self.nodes.items() if rec.ns is not None}
        self.group_members: dict[str, set[str]] = {}  # group -> the members that report it
        self.group_leaders: dict[str, set[str]] = {}  # group -> the members that say they lead it
        self.leaderless: set[str] = set()  # groups members report that no member leads
        known = [(node, rec) for node in self.names if (rec := self.nodes.get(node)) is not None]
        # in bulk: one sort and one heapify (a job reads its clusters' states every micro-batch)
        self.mins = SortedPairs((rec.local_min, node) for node, rec in known if rec.local_min is not None)
        self.walls = LastWalls({node: rec.last_wall for node, rec in known})
        for node, rec in known:
            self._index_rest(node, rec)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, node: object) -> bool:
        return node in self.names

    @property
    def complete(self) -> bool:
        """Every member's minimum is known (the round can compute a global minimum)."""
        return bool(self.names) and len(self.mins) == len(self.names)

    def lowest(self) -> tuple[int, str] | None:
        """(local minimum, node) of the member with the lowest known minimum, or None."""
        return self.mins.lowest()

    def aborting(self) -> bool:
        """A member never reported, has an unknown minimum or misses a group, or a group has no leader."""
        return bool(self.never or self.unknown or self.missing_groups or self.leaderless)

    # -- changes ------------------------------------------------------------------------
    def loosen(self, live: set[str]) -> None:
        """A topology may have been lost: the nodes ``live`` now (and every node seen from now on) count
        too, until the next topology or an operator's acknowledgement (``tighten``)."""
        if self.topology is None:
            return
        self.extra = set(live) | (self.extra or set())
        before = set(self.names)
        self.rebuild()
        if self.names != before:
            self.announced = False

    def tighten(self) -> None:
        if self.extra is not None:
            self.extra = None
            self.rebuild()
            self.announced = False

    def set_topology(self, topology: dict[str, list[str]]) -> set[str]:
        """Take a new topology; returns the nodes that joined the member set."""
        before = set(self.names)
        self.topology = topology
        self.extra = None
        self.rebuild()
        if self.names != before:
            self.announced = False
        return self.names - before

    def take(self, u: NodeUpdate) -> tuple[bool, bool, int | None]:
        """Take one node's summary into its record and the indexes: (whether the node is a member,
        whether its record is new, its known minimum before: None when new or unknown)."""
        rec = self.nodes.get(u.node)
        fresh = rec is None
        old_min = None
        if rec is None:
            groups: list[str] = u.groups if u.groups is not None else []
            rec = NodeRecord(u.incarnation, u.seq, u.local_min, u.unknown, u.blocker, groups, u.log_ms, u.log_ms,
                             led=u.led or [], partition=u.partition)
            self.nodes[u.node] = rec
            if self.topology is None or self.extra is not None:
                self.names.add(u.node)
                self.announced = False
                if self.extra is not None:
                    self.extra.add(u.node)
            self.never.discard(u.node)
            member = u.node in self.names
            if member:
                self._index(u.node, rec)
        else:
            old_min = rec.local_min
            old_groups = (rec.groups, rec.led) if u.groups is not None else None
            member = u.node in self.names
            self.heard(u.node, rec, u.incarnation, u.seq, u.log_ms, member)
            rec.local_min = u.local_min
            rec.unknown = u.unknown
            rec.blocker = u.blocker
            if u.groups is not None:
                rec.groups = u.groups
                rec.led = u.led or []
            if u.partition is not None:
                rec.partition = u.partition
            if member:
                self._reindex(u.node, rec, old_min, old_groups)
        if u.ns is not None or rec.ns is not None:
            rec.ns = u.ns
            (self.ns_nodes.add if u.ns is not None else self.ns_nodes.discard)(u.node)
        return member, fresh, old_min

    # -- indexes --------------------------------------------------------------------------
    def _index(self, node: str, rec: NodeRecord) -> None:
        if rec.local_min is not None:
            self.mins.add((rec.local_min, node))
        self.walls.set(node, rec.last_wall)
        self._index_rest(node, rec)

    def _index_rest(self, node: str, rec: NodeRecord) -> None:
        """A member's unknown minimum, groups and missing groups (``_index`` without ``mins`` and ``walls``)."""
        if rec.local_min is None:
            self.unknown[node] = rec.unknown or "unknown"
        self._index_groups(node, rec.groups, rec.led, +1)
        if self.topology is not None:
            missing = self._missing_of(node, rec)
            if missing:
                self.missing_groups[node] = missing

    def _index_groups(self, node: str, groups: list[str], led: list[str], sign: int) -> None:
        """Add (``sign`` +1) or remove (-1) a member's groups and the groups it leads, and keep
        ``leaderless`` (a group some member reports but none leads: a leader hand-over in progress,
        so no current leader's time stands for the group and the round aborts) in step for those
        groups. (A leader that has not published yet is its own node's unknown minimum.)"""
        if not groups and not led:
            return
        for index, names in ((self.group_members, groups), (self.group_leaders, led)):
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
            if g in self.group_members and g not in self.group_leaders:
                self.leaderless.add(g)
            else:
                self.leaderless.discard(g)

    def _missing_of(self, node: str, rec: NodeRecord) -> list[str]:
        """The groups the topology requires of ``node`` that its record does not report."""
        assert self.topology is not None
        return sorted(set(self.topology.get(node) or ()) - set(rec.groups))

    def heard(self, node: str, rec: NodeRecord, incarnation: int, seq: int, log: int, member: bool) -> None:
        """The node's record takes who sent its newest event and when (its last log time, indexed for a
        member): ``take``'s first part for every event, and all of it for one that changes nothing
        else (``ClusterState.take_quiet``)."""
        rec.incarnation = incarnation
        rec.seq = seq
        if log > rec.last_wall:
            rec.last_wall = log
            if member:
                self.walls.set(node, log)

    def _reindex(self, node: str, rec: NodeRecord, old_min: int | None,
                 old_groups: tuple[list[str], list[str]] | None) -> None:
        """Re-index a member whose record changed, touching only what changed (``heard`` indexed its
        last log time)."""
        new_min = rec.local_min
        if new_min != old_min:
            if old_min is not None:
                self.mins.discard((old_min, node))
            else:
                self.unknown.pop(node, None)
            if new_min is not None:
                self.mins.add((new_min, node))
        if new_min is None:
            self.unknown[node] = rec.unknown or "unknown"
        if old_groups is not None:
            self._index_groups(node, *old_groups, -1)
            self._index_groups(node, rec.groups, rec.led, +1)
        if old_groups is not None and self.topology is not None:
            missing = self._missing_of(node, rec)
            if missing:
                self.missing_groups[node] = missing
            else:
                self.missing_groups.pop(node, None)

    def indexes(self) -> tuple[Any, ...]:
        """The indexes in a comparable form (tests check them against a rebuild)."""
        return (list(self.mins), self.walls.entries(), dict(sorted(self.unknown.items())),
                dict(sorted(self.missing_groups.items())), sorted(self.never), sorted(self.names))
