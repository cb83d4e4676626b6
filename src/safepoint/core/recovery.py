"""A start on empty state, or a gap in the log: the floor that must not go back, and the picture each
node must give again.

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
from typing import Any

from safepoint.core.records import NodeUpdate

__all__ = ["ASK", "COMPLETED", "Recovery", "Seed", "StartPlan", "seeds_from_directives"]

COMPLETED = "completed"
ASK = "ask"


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
        elif kind in ("expire", "snapshot_request", "band"):
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

    def seed_of(self, cluster: str) -> Seed | None:
        """The seed a cluster met for the first time starts from (None: it starts fresh)."""
        seed = self.seeds.get(cluster)
        return seed if seed is not None or not self.recover_all else Seed()

    def to_json(self) -> dict[str, Any]:
        return {"seeds": {c: s.to_json() for c, s in self.seeds.items()}, "recover_all": self.recover_all}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> StartPlan:
        if not data:
            return cls()
        return cls({c: Seed.from_json(s) for c, s in (data.get("seeds") or {}).items()}, bool(data.get("recover_all")))


class Recovery:
    """A cluster's part while nodes owe a snapshot: after a start on empty state (``whole``: every
    node does), or after a gap in the events topic (``core/gaps.py``: the nodes whose events may have
    been in it, and any node first seen on its partitions within a lease after it).

    ``expected``: the nodes known to owe one (after a start on empty state, those of the last
    directive's member set); ``complete``: the nodes that sent a snapshot since; ``requested``: node
    -> the cluster time of its last snapshot request; ``windows``: [partition (-1: every one), until
    (cluster time)] of each gap, during which a node first seen there owes one too; ``cause``: node
    -> the gap that made it owe one (absent: the start on empty state); ``awaiting`` (derived): the
    members (and, without a topology, the expected nodes) that are not complete. The round aborts
    while ``awaiting`` is not empty."""

    __slots__ = ("expected", "complete", "requested", "whole", "windows", "cause", "restated", "awaiting")

    def __init__(self, expected: Iterable[str], complete: Iterable[str] = (),
                 requested: Mapping[str, int] | None = None, whole: bool = True,
                 windows: Iterable[list[int]] = (), cause: Mapping[str, int] | None = None,
                 restated: Mapping[str, Iterable[int]] | None = None) -> None:
        self.expected = set(expected)
        self.complete = set(complete)
        self.requested: dict[str, int] = dict(requested or {})
        self.whole = whole
        self.windows: list[list[int]] = [list(w) for w in windows]
        self.cause: dict[str, int] = dict(cause or {})
        self.restated: dict[str, set[int]] = {n: set(incs) for n, incs in (restated or {}).items()}
        """node -> the incarnations that sent a snapshot since it owed one: it is complete once every
        process that may still speak for it did (an older one within its grace may hold what was lost)."""
        self.awaiting: set[str] = set()

    def rebuild(self, members: set[str], topology_known: bool) -> None:
        """Recompute ``awaiting`` for the member set ``members``."""
        if self.whole:
            needed = members | (self.expected if not topology_known else set())
        else:
            needed = self.expected & members if topology_known else set(self.expected)
        self.awaiting = needed - self.complete

    def owe(self, nodes: Iterable[str], partition: int, until: int, gap: int) -> None:
        """A gap: ``nodes`` owe a snapshot again (asked at their next event), and so does any node first
        seen on ``partition`` (-1: any) up to cluster time ``until``."""
        for node in nodes:
            self.expected.add(node)
            self.complete.discard(node)
            self.requested.pop(node, None)
            self.restated.pop(node, None)
            self.cause[node] = gap
        self.windows.append([partition, until, gap])

    def take(self, u: NodeUpdate, member: bool, now: int, lease_ms: int, fresh: bool = False,
             partition: int = -1) -> str | None:
        """A snapshot completes a node's picture (``COMPLETED``: the round may pass now); any other
        event of an incomplete node that the round needs asks it for one, again after a lease
        without an answer (``ASK``: a ``snapshot_request`` must go to the node now). ``fresh``: the
        node's first event, on ``partition``."""
        if u.node in self.complete:
            return None
        if u.snapshot:
            self.restated.setdefault(u.node, set()).add(u.sender)
        done = self.restated.get(u.node)
        if done is not None and set(u.lives or (u.incarnation,)) <= done:
            self.complete.add(u.node)
            self.requested.pop(u.node, None)
            self.restated.pop(u.node, None)
            self.awaiting.discard(u.node)
            return COMPLETED
        if not self.whole and u.node not in self.expected:
            window = next((w for w in self.windows if w[0] in (-1, partition) and now <= w[1]), None) if fresh else None
            if window is None:
                return None  # its events were never in a gap
            self.expected.add(u.node)
            if len(window) > 2:
                self.cause[u.node] = window[2]
        if member:
            self.awaiting.add(u.node)
        if u.node not in self.awaiting:
            return None  # not in the topology: it does not count, so it is not asked (yet)
        last = self.requested.get(u.node)
        if last is not None and now - last < lease_ms:
            return None
        self.requested[u.node] = now
        return ASK

    def may_have_lost(self, node: str, partition: int, now: int, fresh: bool) -> bool:
        """Whether ``node``'s events may have been lost (``Incarnations.lost_since``): it owes a
        snapshot, or, at its first event (``fresh``, on ``partition`` at cluster time ``now``), it would
        owe one as ``take`` decides (a superset: ``take`` sees the time after the event)."""
        if node in self.complete:
            return False
        if self.whole or node in self.expected:
            return True
        return fresh and any(w[0] in (-1, partition) and now <= w[1] for w in self.windows)

    def finished(self, now: int) -> bool:
        """A gap's recovery is over: no node owes a snapshot (a member or not: one that joins the
        topology later must still restate before it counts) and no window is open (a start on empty
        state never ends: every node the job meets must restate)."""
        return (not self.whole and not self.awaiting and self.expected <= self.complete
                and all(now > w[1] for w in self.windows))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"expected": sorted(self.expected), "complete": sorted(self.complete),
                                "requested": self.requested}
        if self.restated:
            data["restated"] = {n: sorted(incs) for n, incs in self.restated.items()}
        if not self.whole:
            data.update(whole=False, windows=self.windows, cause=self.cause)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Recovery | None:
        if data is None:
            return None
        return cls(data["expected"], data["complete"], data["requested"], bool(data.get("whole", True)),
                   data.get("windows") or (), data.get("cause"), data.get("restated"))
