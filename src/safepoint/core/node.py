"""One node's active holds, identity and figures, and the rules that change them.

The node stage of the job keeps one ``NodeState`` per (cluster, node) and calls
``NodeState.apply`` for each of the node's events, in offset order. What the cluster stage
needs to know comes out as a ``NodeUpdate``: a compact summary, never the whole hold set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from safepoint.core.policy import Policy

__all__ = ["NodeState", "NodeUpdate", "IGNORED_DUPLICATE", "IGNORED_OLDER_SEQ", "IGNORED_STALE_INCARNATION"]

IGNORED_DUPLICATE = "duplicate"
IGNORED_OLDER_SEQ = "older_seq"
IGNORED_STALE_INCARNATION = "stale_incarnation"

# A hold on the wire between stages and in state: [ts, opened_wall_ms, label, incarnation].
# A transaction adds [prepared, coordinator, participants].
R_TS, R_WALL, R_LABEL, R_INC = 0, 1, 2, 3
T_PREPARED, T_COORD, T_PARTS = 4, 5, 6
INT64_MIN = -(1 << 63)


@dataclass(slots=True)
class NodeUpdate:
    """What the cluster stage learns from one applied node event."""

    node: str
    wall_ms: int
    incarnation: int
    seq: int
    local_min: int | None
    unknown: str | None
    blocker: list[Any] | None  # [kind, id, ts, opened_wall_ms, label]
    groups: list[str] | None  # groups the node reports holding, when they changed
    opened: list[list[Any]]  # [[kind, id, ts], ...] holds added by this event
    closed: list[list[Any]]  # [[kind, id], ...] holds removed by this event
    changed: bool  # local_min, unknown or groups changed

    def to_json(self) -> list[Any]:
        return [
            self.node,
            self.wall_ms,
            self.incarnation,
            self.seq,
            self.local_min,
            self.unknown,
            self.blocker,
            self.groups,
            self.opened,
            self.closed,
            self.changed,
        ]

    @classmethod
    def from_json(cls, data: list[Any]) -> NodeUpdate:
        return cls(*data)


class NodeState:
    """The job's view of one node: identity, open readers and transactions, last figures."""

    __slots__ = (
        "cluster",
        "node",
        "incarnation",
        "seq",
        "readers",
        "txs",
        "mvcc_now",
        "groups",
        "pinned_bytes",
        "debt_bytes",
        "last_wall_ms",
        "_summary",
    )

    def __init__(self, cluster: str, node: str) -> None:
        self.cluster = cluster
        self.node = node
        self.incarnation = -1
        self.seq = -1
        self.readers: dict[str, list[Any]] = {}
        self.txs: dict[str, list[Any]] = {}
        self.mvcc_now: int | None = None
        self.groups: dict[str, list[Any]] = {}  # group -> [leader, published_min_tx_time]
        self.pinned_bytes: int | None = None
        self.debt_bytes: int | None = None
        self.last_wall_ms = -1
        self._summary: tuple[Any, ...] | None = None

    # -- persistence ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "c": self.cluster,
            "n": self.node,
            "i": self.incarnation,
            "s": self.seq,
            "r": self.readers,
            "t": self.txs,
            "m": self.mvcc_now,
            "g": self.groups,
            "p": self.pinned_bytes,
            "d": self.debt_bytes,
            "w": self.last_wall_ms,
            "x": list(self._summary) if self._summary is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeState:
        state = cls(data["c"], data["n"])
        state.incarnation = data["i"]
        state.seq = data["s"]
        state.readers = data["r"]
        state.txs = data["t"]
        state.mvcc_now = data["m"]
        state.groups = data["g"]
        state.pinned_bytes = data["p"]
        state.debt_bytes = data["d"]
        state.last_wall_ms = data["w"]
        state._summary = tuple(data["x"]) if data.get("x") is not None else None
        return state

    # -- the rules --------------------------------------------------------------------
    def check_order(self, event: dict[str, Any]) -> str | None:
        """Return why the event is ignored (stale or duplicate), or None to apply it."""
        incarnation = event["incarnation"]
        if incarnation < self.incarnation:
            return IGNORED_STALE_INCARNATION
        if incarnation == self.incarnation:
            if event["seq"] == self.seq:
                return IGNORED_DUPLICATE
            if event["seq"] < self.seq:
                return IGNORED_OLDER_SEQ
        return None

    def apply(self, event: dict[str, Any], policy: Policy) -> NodeUpdate | str:
        """Apply one validated node event. Returns the update, or the reason it was ignored."""
        ignored = self.check_order(event)
        if ignored is not None:
            return ignored
        opened: list[list[Any]] = []
        closed: list[list[Any]] = []
        groups_changed = False
        incarnation = event["incarnation"]
        if incarnation > self.incarnation:
            if self.incarnation >= 0:
                self._restart(incarnation, closed)
            self.incarnation = incarnation
        self.seq = event["seq"]
        wall = event["wall_ms"]
        if wall > self.last_wall_ms:
            self.last_wall_ms = wall
        kind = event["type"]
        if kind == "reader_open":
            rid = event["reader_id"]
            if rid in self.readers:
                closed.append(["reader", rid])
            self.readers[rid] = [event["read_ts"], wall, event.get("label"), incarnation]
            opened.append(["reader", rid, event["read_ts"]])
        elif kind == "reader_close":
            if self.readers.pop(event["reader_id"], None) is not None:
                closed.append(["reader", event["reader_id"]])
        elif kind == "tx_begin":
            tid = event["tx_id"]
            if tid in self.txs:
                closed.append(["tx", tid])
            self.txs[tid] = [event["begin_ts"], wall, event.get("label"), incarnation, False, None, None]
            opened.append(["tx", tid, event["begin_ts"]])
        elif kind == "tx_prepare":
            tx = self.txs.get(event["tx_id"])
            if tx is not None:
                tx[T_PREPARED] = True
                tx[T_COORD] = event["coordinator"]
                tx[T_PARTS] = list(event["participants"])
        elif kind == "tx_end":
            if self.txs.pop(event["tx_id"], None) is not None:
                closed.append(["tx", event["tx_id"]])
        elif kind == "heartbeat":
            self.mvcc_now = event["mvcc_now"]
            if "pinned_bytes" in event:
                self.pinned_bytes = event["pinned_bytes"]
            if "debt_bytes" in event:
                self.debt_bytes = event["debt_bytes"]
            if "groups" in event:
                new_groups = {g["group"]: [bool(g.get("leader", False)), g.get("published_min_tx_time")] for g in event["groups"]}
                groups_changed = set(new_groups) != set(self.groups)
                self.groups = new_groups
        elif kind == "snapshot":
            self._replace(event, wall, incarnation, opened, closed)
        else:  # pragma: no cover - parse() only lets node types through here
            msg = f"not a node event: {kind}"
            raise ValueError(msg)
        return self._update(wall, opened, closed, groups_changed, policy)

    def _restart(self, incarnation: int, closed: list[list[Any]]) -> None:
        """A new process: its old readers and unprepared transactions died with it."""
        for rid in [r for r, h in self.readers.items() if h[R_INC] < incarnation]:
            del self.readers[rid]
            closed.append(["reader", rid])
        for tid in [t for t, h in self.txs.items() if h[R_INC] < incarnation and not h[T_PREPARED]]:
            del self.txs[tid]
            closed.append(["tx", tid])
        self.seq = -1

    def _replace(
        self,
        event: dict[str, Any],
        wall: int,
        incarnation: int,
        opened: list[list[Any]],
        closed: list[list[Any]],
    ) -> None:
        readers: dict[str, list[Any]] = {}
        for r in event["readers"]:
            old = self.readers.get(r["reader_id"])
            opened_wall = r.get("opened_wall_ms", old[R_WALL] if old else wall)
            readers[r["reader_id"]] = [r["read_ts"], opened_wall, r.get("label"), incarnation]
        txs: dict[str, list[Any]] = {}
        for t in event["txs"]:
            old = self.txs.get(t["tx_id"])
            opened_wall = t.get("opened_wall_ms", old[R_WALL] if old else wall)
            prepared = bool(t.get("prepared", old[T_PREPARED] if old else False))
            coord = t.get("coordinator", old[T_COORD] if old else None)
            parts = t.get("participants", old[T_PARTS] if old else None)
            txs[t["tx_id"]] = [t["begin_ts"], opened_wall, t.get("label"), incarnation, prepared, coord, parts]
        for kind, old_map, new_map in (("reader", self.readers, readers), ("tx", self.txs, txs)):
            for hid, hold in old_map.items():
                if hid not in new_map or new_map[hid][R_TS] != hold[R_TS]:
                    closed.append([kind, hid])
            for hid, hold in new_map.items():
                if hid not in old_map or old_map[hid][R_TS] != hold[R_TS]:
                    opened.append([kind, hid, hold[R_TS]])
        self.readers = readers
        self.txs = txs

    def local_min(self, policy: Policy) -> tuple[int | None, str | None, list[Any] | None]:
        """(local_min, why unknown, blocker). The blocker is [kind, id, ts, opened_wall_ms, label]."""
        if self.mvcc_now is None:
            return None, "no heartbeat yet", None
        # clamped: a timestamp is a signed 64-bit integer on the wire, and nothing is older than the smallest one
        best: list[Any] = ["retention", None, max(self.mvcc_now - policy.retention, INT64_MIN), None, None]
        for gid, (leader, published) in self.groups.items():
            if published is None:
                if leader:
                    return None, f"group {gid} it leads has no published min tx time", None
                continue
            if published < best[2]:
                best = ["group", gid, published, None, None]
        for rid, h in self.readers.items():
            if h[R_TS] <= best[2] and (h[R_TS] < best[2] or best[0] in ("retention", "group")):
                best = ["reader", rid, h[R_TS], h[R_WALL], h[R_LABEL]]
        for tid, h in self.txs.items():
            if h[R_TS] < best[2] or (h[R_TS] == best[2] and best[0] in ("retention", "group")):
                best = ["prepared_tx" if h[T_PREPARED] else "tx", tid, h[R_TS], h[R_WALL], h[R_LABEL]]
        return best[2], None, best

    def _update(
        self,
        wall: int,
        opened: list[list[Any]],
        closed: list[list[Any]],
        groups_changed: bool,
        policy: Policy,
    ) -> NodeUpdate:
        lmin, unknown, blocker = self.local_min(policy)
        summary = (lmin, unknown)
        changed = groups_changed or summary != self._summary
        self._summary = summary
        return NodeUpdate(
            node=self.node,
            wall_ms=wall,
            incarnation=self.incarnation,
            seq=self.seq,
            local_min=lmin,
            unknown=unknown,
            blocker=blocker,
            groups=sorted(self.groups) if groups_changed else None,
            opened=opened,
            closed=closed,
            changed=changed,
        )

    def group_list(self) -> list[str]:
        return sorted(self.groups)
