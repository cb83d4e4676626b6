"""Every directive the job writes, built in one place: compaction, members, expire, snapshot_request, band.

A compaction directive's size does not grow with the cluster: it names the blocker, the
``BASIS_LISTED`` members with the lowest minimums (their incarnation, seq and minimum), how many
members there are, and ``positions``: per partition of the events and control topics
(``core/origin.py``'s ``position_key``), the offset after the cluster's last message the job had
applied, from which a checker replays every node and the cluster's control events to where the
job had them (one entry per partition, not per node). Every node's own figures are in the status. The member set
itself, which a job that lost its checkpoint must wait for, goes out as a ``members`` record (key
``<cluster>/%members``) on the directives topic with the first directive after it changed.

Per-node directives (``expire``, ``snapshot_request``, ``band``) are keyed by the node (and the
hold; ``<cluster>/<node>/%band`` for the band, so that the compacted topic keeps each node's
newest) and numbered by their own sequence, ``node_seq``. A ``band`` directive tells a node its
pinned-bytes band whenever it changes: its client admits long snapshots by it (rate-limited in
``warning``, refused in ``critical``).

Every directive carries the job's ``generation`` (``Policy.generation``: the id of the job's state's
lifetime, where the job gives one) and, where the cluster's policy has ``directive_keys``, its ``sig``
(``core/signing.py``): ``stamp`` adds both, last, so the signature covers the generation too.

``Directives`` is the cluster's part that numbers them and remembers where the cluster's input
stood; the cluster decides when one goes out.
"""

from __future__ import annotations

from typing import Any

from safepoint.core.control import Control
from safepoint.core.holds import KINDS
from safepoint.core.ids import escape, join_id
from safepoint.core.members import Members
from safepoint.core.origin import position_key
from safepoint.core.outputs import DIRECTIVES, Output
from safepoint.core.policy import Policy
from safepoint.core.signing import sign_directive
from safepoint.core.tenants import Tenants

__all__ = ["BAND", "BASIS_LISTED", "SNAPSHOT_REQUEST", "Directives", "band_key", "members_key", "stamp"]

BASIS_LISTED = 8
"""Members a directive's ``basis`` names: those with the lowest minimums."""
SNAPSHOT_REQUEST = "snapshot_request"
"""The directive that asks a node for its complete set of holds."""
BAND = "band"
"""The directive that tells a node its pinned-bytes band (its admission control follows it)."""
EXPIRE_HEAD = ("v", "type", "cluster", "node")
EXPIRE_TAIL = ("reason", "mode", "seq", "cluster_wall_ms")
"""An ``expire`` directive's fields, around the one that names the hold (its kind's ``id_field``)."""


def members_key(cluster: str) -> str:
    """The directives topic's key of a cluster's member set (no escaped node id starts with ``%``)."""
    return f"{escape(cluster)}/%members"


def stamp(value: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """``value`` with the job's ``generation`` (where it has one) and, with ``directive_keys``, the ``sig``
    of everything else: what every directive goes out as."""
    if policy.generation:
        value["generation"] = policy.generation
    key = policy.directive_signer
    if key is not None:
        value["sig"] = sign_directive(value, key)
    return value


def band_key(cluster: str, node: str) -> str:
    """The directives topic's key of a node's band (no escaped id starts with ``%``)."""
    return f"{join_id(cluster, node)}/%band"


class Directives:
    """A cluster's directive sequences and input positions.

    ``seq`` numbers compaction directives (and the ``members`` records that go with them),
    ``node_seq`` the per-node ones; both only go up, also across a lost checkpoint (a seed
    continues them). ``positions``: events partition -> the offset after the cluster's last
    message this stage saw there, bounded by the partitions, not the nodes."""

    __slots__ = ("cluster", "seq", "node_seq", "last_wall", "positions")

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.seq = 0
        self.node_seq = 0
        self.last_wall: int | None = None
        """Cluster time of the last compaction directive (``directive_interval_ms`` counts from it)."""
        self.positions: dict[int, int] = {}

    def to_stored(self) -> dict[str, Any]:
        """Its fields of the cluster's stored form (``ClusterState.to_json``)."""
        return {"dseq": self.seq, "last_directive_wall": self.last_wall, "eseq": self.node_seq,
                "positions": [[p, o] for p, o in sorted(self.positions.items())]}

    @classmethod
    def from_stored(cls, cluster: str, data: dict[str, Any]) -> Directives:
        d = cls(cluster)
        d.seq = data["dseq"]
        d.last_wall = data["last_directive_wall"]
        d.node_seq = data.get("eseq", 0)
        d.positions = {p: o for p, o in data.get("positions") or ()}
        return d

    def seed(self, seq: int, node_seq: int) -> None:
        """Continue the sequences of a job that lost its checkpoint (``core/recovery.py``)."""
        self.seq, self.node_seq = seq, node_seq

    def saw(self, partition: int, offset: int) -> None:
        """The message at routed ``partition``/``offset`` was applied: a directive out of it counts it."""
        self.positions[partition] = offset + 1

    def compaction(self, *, safe_ts: int | None, catalog_floor: int | None, gnode: str, members: Members,
                   control: Control, tenants: Tenants, now: int, policy: Policy,
                   extra: dict[str, Any] | None = None) -> list[Output]:
        """The next compaction directive (``gnode``: the blocking node, "" for a service hold), after
        the ``members`` record when the member set changed since it last went out."""
        self.seq += 1
        self.last_wall = now
        out: list[Output] = []
        if members.announce():
            out.append(Output(DIRECTIVES, members_key(self.cluster), stamp({
                "v": 1, "type": "members", "cluster": self.cluster, "seq": self.seq, "nodes": sorted(members.names)},
                policy)))
        blocker = members.nodes[gnode].blocker if gnode else None
        blocker_out = control.blocker(now) if not gnode else None
        if blocker is not None:
            blocker_out = {
                "node": gnode,
                "kind": blocker.kind,
                "id": blocker.id,
                "ts": blocker.ts,
                "age_ms": now - blocker.opened_wall if blocker.opened_wall is not None else None,
                "label": blocker.label,
                **({"cost_bytes": blocker.cost} if blocker.cost is not None else {}),
            }
        # carried so that a job that lost its checkpoint keeps them (core/recovery.py)
        holds = control.holds
        pause = control.paused
        nodes = members.nodes
        basis = {n: {"incarnation": nodes[n].incarnation, "seq": nodes[n].seq, "local_min": m}
                 for m, n in members.mins.head(BASIS_LISTED)}
        out.append(Output(DIRECTIVES, self.cluster, stamp({
            "v": 1,
            "type": "compaction",
            "cluster": self.cluster,
            "seq": self.seq,
            "safe_ts": safe_ts,
            "catalog_floor": catalog_floor,
            "cluster_wall_ms": now,
            "blocker": blocker_out,
            "basis": basis,
            "members": len(members),
            "positions": {position_key(p): o for p, o in sorted(self.positions.items())},
            "retention": policy.retention,
            **({"service_holds": {holder: dict(h) for holder, h in sorted(holds.items())}} if holds else {}),
            **({"paused": {"reason": pause["reason"], "since_wall_ms": pause["since_wall_ms"]}} if pause else {}),
            **tenants.directive_fields(),
            **(extra or {}),
        }, policy)))
        return out

    def snapshot_request(self, node: str, reason: str, now: int, policy: Policy) -> Output:
        """Ask ``node`` for its complete set of holds (``core/recovery.py``, ``core/leaks.py``)."""
        self.node_seq += 1
        return Output(DIRECTIVES, join_id(self.cluster, node), stamp({
            "v": 1, "type": SNAPSHOT_REQUEST, "cluster": self.cluster, "node": node, "reason": reason,
            "seq": self.node_seq, "cluster_wall_ms": now}, policy))

    def band(self, node: str, band: str, now: int, policy: Policy) -> Output:
        """Tell ``node`` its pinned-bytes band changed (``core/pressure.py`` decided it)."""
        self.node_seq += 1
        return Output(DIRECTIVES, band_key(self.cluster, node), stamp({
            "v": 1, "type": BAND, "cluster": self.cluster, "node": node, "band": band, "seq": self.node_seq,
            "cluster_wall_ms": now}, policy))

    def expire(self, node: str, body: dict[str, Any], now: int, policy: Policy) -> Output:
        """Tell ``node`` to end one reader or transaction (the node stage decided it: ``core/pressure.py``)."""
        self.node_seq += 1
        what = next(k for k in KINDS if k.id_field in body)
        hid = body[what.id_field]
        value = {**body, "cluster": self.cluster, "seq": self.node_seq, "cluster_wall_ms": now}
        return Output(DIRECTIVES, join_id(self.cluster, node, what.name, hid), stamp(
            {**{k: value[k] for k in EXPIRE_HEAD}, what.id_field: hid, **{k: value[k] for k in EXPIRE_TAIL}}, policy))
