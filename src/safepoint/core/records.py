"""The named records a node's and a cluster's state keep, and what a node tells its cluster:
open holds, blockers, a cluster's record of each node, and the ``NodeUpdate`` of one event.

Each record is a slotted dataclass or a NamedTuple in memory. In the state store a stored record
is the positional list its ``to_json`` gives (the fields in declaration order, trailing optional
ones left out), so the layout of each is written down here and nowhere else. A ``NodeUpdate``
lives only between ``NodeState.apply`` and ``ClusterState.apply_node_update`` (``engine.step``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from safepoint.core.signals import Signal

__all__ = ["Blocker", "Expiry", "Floor", "Hold", "HoldRef", "NodeRecord", "NodeUpdate", "OpenedHold"]

FLOOR_KINDS = ("retention", "group")
"""Blocker kinds that are a node's own bound, not a reader or transaction."""


@dataclass(slots=True, init=False)
class Hold:
    """One open reader or transaction of a node (the node stage's state)."""

    ts: int
    """``read_ts`` or ``begin_ts``."""
    opened_wall: int
    """The node's ``wall_ms`` when it opened (or the snapshot's ``opened_wall_ms``)."""
    label: str | None
    incarnation: int
    """The node process that opened it: a restart drops readers and unprepared transactions."""
    prepared: bool = False
    """Transactions only: prepared (two-phase commit), its decision unknown."""
    coordinator: str | None = None
    participants: list[str] | None = None
    prepared_wall: int | None = None
    """When it was first seen prepared (the in-doubt clock)."""
    namespace: str | None = None
    """The tenant it belongs to: it pins that namespace only (None: every namespace)."""

    def __init__(self, ts: int, opened_wall: int, label: str | None, incarnation: int, prepared: bool = False,
                 coordinator: str | None = None, participants: list[str] | None = None,
                 prepared_wall: int | None = None, namespace: str | None = None) -> None:
        # written out (init=False), here and in the records below that are made per event: the
        # compiled core compiles it, where the dataclass's own __init__ would run as Python
        self.ts = ts
        self.opened_wall = opened_wall
        self.label = label
        self.incarnation = incarnation
        self.prepared = prepared
        self.coordinator = coordinator
        self.participants = participants
        self.prepared_wall = prepared_wall
        self.namespace = namespace

    def to_json(self) -> list[Any]:
        head = [self.ts, self.opened_wall, self.label, self.incarnation]
        if self.namespace is not None:
            return [*head, self.prepared, self.coordinator, self.participants, self.prepared_wall, self.namespace]
        if not self.prepared and self.coordinator is None and self.participants is None and self.prepared_wall is None:
            return head  # a reader, or a transaction never prepared
        return [*head, self.prepared, self.coordinator, self.participants, self.prepared_wall]

    @classmethod
    def from_json(cls, data: list[Any]) -> Hold:
        return cls(*data)


@dataclass(slots=True)
class Expiry:
    """A forced expiry the node stage decided for one of the node's holds."""

    kind: str
    """reader or tx."""
    mode: str
    """graceful, then hard after the grace period."""
    at_wall: int
    """When it was decided (or upgraded to hard), on the node's clock."""
    id: str

    def to_json(self) -> list[Any]:
        return [self.kind, self.mode, self.at_wall, self.id]

    @classmethod
    def from_json(cls, data: list[Any]) -> Expiry:
        return cls(*data)


class Blocker(NamedTuple):
    """A node's lowest hold: a reader or transaction, or its own floor (``retention``, ``group``)."""

    kind: str
    """reader, tx, prepared_tx, retention or group."""
    id: str | None
    """The reader, transaction or group id (None for retention)."""
    ts: int
    opened_wall: int | None
    label: str | None
    cost: int | None = None
    """The bytes of history it alone keeps on its node (``core/cost.py``; None: the node sends no
    history curve, or a floor)."""

    @classmethod
    def of(cls, data: list[Any] | tuple[Any, ...] | None) -> Blocker | None:
        return None if data is None else cls(*data)

    def to_json(self) -> list[Any]:
        """The positional form (the cost left out when unknown, as written before it existed)."""
        return list(self) if self.cost is not None else list(self)[:5]

    @property
    def floor(self) -> Floor:
        return Floor(self.kind, self.id, self.ts)


class Floor(NamedTuple):
    """The lowest of a node's own bounds: its retention bound or a group's published time."""

    kind: str
    id: str | None
    ts: int

    @classmethod
    def of(cls, data: list[Any] | tuple[Any, ...] | None) -> Floor | None:
        return None if data is None else cls(*data)


class OpenedHold(NamedTuple):
    """A hold an event opened: (kind, id, ts[, namespace])."""

    kind: str
    id: str
    ts: int
    namespace: str | None = None


class HoldRef(NamedTuple):
    """A hold an event closed: (kind, id)."""

    kind: str
    id: str


@dataclass(slots=True, init=False)
class NodeRecord:
    """What the cluster stage keeps of one node (from its ``NodeUpdate`` summaries)."""

    incarnation: int
    seq: int
    local_min: int | None
    unknown: str | None
    """Why the node's minimum is unknown, or None."""
    blocker: Blocker | None
    groups: list[str]
    last_wall: int
    """The log time of the node's newest event (the lease clock, ``core/clock.py``)."""
    first_wall: int
    """The log time of its first."""
    ns: list[Any] | None = None
    """With namespaced holds: [the minimum of what pins every namespace, {namespace: its lowest
    hold}] (``core/tenants.py``); None: ``local_min`` pins every namespace."""
    led: list[str] = field(default_factory=list)
    """The groups it says it leads (a group some member reports but none leads aborts the round)."""
    partition: int | None = None
    """The events partition of its last event (a gap there may hide its events); None: not known."""

    def __init__(self, incarnation: int, seq: int, local_min: int | None, unknown: str | None, blocker: Blocker | None,
                 groups: list[str], last_wall: int, first_wall: int, ns: list[Any] | None = None,
                 led: list[str] | None = None, partition: int | None = None) -> None:
        self.incarnation = incarnation
        self.seq = seq
        self.local_min = local_min
        self.unknown = unknown
        self.blocker = blocker
        self.groups = groups
        self.last_wall = last_wall
        self.first_wall = first_wall
        self.ns = ns
        self.led = [] if led is None else led
        self.partition = partition

    def to_json(self) -> list[Any]:
        blocker = None if self.blocker is None else self.blocker.to_json()
        out: list[Any] = [self.incarnation, self.seq, self.local_min, self.unknown, blocker, self.groups,
                          self.last_wall, self.first_wall, {}]  # {}: where the node's open holds were once copied
        if self.partition is not None:
            return [*out, self.ns, self.led, self.partition]
        if self.led:
            return [*out, self.ns, self.led]
        return out if self.ns is None else [*out, self.ns]

    @classmethod
    def from_json(cls, data: list[Any]) -> NodeRecord:
        inc, seq, lmin, unknown, blocker, groups, last, first, *rest = data
        # rest[0]: a copy of the node's open holds in values written before the node's own state
        # answered for them (ignored); written before ``led`` was kept: none (its groups look
        # leaderless until the node's next heartbeat: the safe side)
        return cls(inc, seq, lmin, unknown, Blocker.of(blocker), groups, last, first,
                   rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else [], rest[3] if len(rest) > 3 else None)


@dataclass(slots=True, init=False)
class NodeUpdate:
    """What the cluster learns from one applied node event."""

    node: str
    log_ms: int
    """The event's log time (``core/clock.py``): the cluster's clock and the node's lease move with it."""
    incarnation: int
    seq: int
    local_min: int | None
    unknown: str | None
    blocker: Blocker | None
    groups: list[str] | None  # groups the node reports holding, when they (or those it leads) changed
    opened: list[OpenedHold]  # holds added by this event
    closed: list[HoldRef]  # holds removed by this event
    changed: bool  # local_min, unknown or groups changed
    signals: list[Signal] = field(default_factory=list)
    """What the node's rules decided on its clock, for the cluster to stamp (``core/signals.py``)."""
    snapshot: bool = False
    """The event was a snapshot: the node's complete set of readers and transactions."""
    floor: Floor | None = None
    """The lowest of the node's retention bound and group published times."""
    ns: list[Any] | None = None
    """With namespaced holds: [the lowest of what pins every namespace, {namespace: its lowest hold}]."""
    led: list[str] | None = None
    """With ``groups``: the groups it says it leads."""
    partition: int | None = None
    """The events partition the event came from (set by ``engine.step``)."""
    sender: int = 0
    """The incarnation that sent the event (``incarnation`` is the node's newest)."""
    lives: list[int] | None = None
    """Every incarnation of the node that may still speak, when there is more than one (None: just the newest)."""

    def __init__(self, node: str, log_ms: int, incarnation: int, seq: int, local_min: int | None, unknown: str | None,
                 blocker: Blocker | None, groups: list[str] | None, opened: list[OpenedHold], closed: list[HoldRef],
                 changed: bool, signals: list[Signal] | None = None, snapshot: bool = False,
                 floor: Floor | None = None, ns: list[Any] | None = None, led: list[str] | None = None) -> None:
        self.node = node
        self.log_ms = log_ms
        self.incarnation = incarnation
        self.seq = seq
        self.local_min = local_min
        self.unknown = unknown
        self.blocker = blocker
        self.groups = groups
        self.opened = opened
        self.closed = closed
        self.changed = changed
        self.signals = [] if signals is None else signals
        self.snapshot = snapshot
        self.floor = floor
        self.ns = ns
        self.led = led
        self.partition: int | None = None
        self.sender = incarnation
        self.lives: list[int] | None = None
