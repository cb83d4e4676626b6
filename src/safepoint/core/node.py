"""One node's active holds, identity and figures, and the rules that change them.

The node stage of the job keeps one ``NodeState`` per (cluster, node) and calls
``NodeState.apply`` for each of the node's events, in offset order. What the cluster stage
needs to know comes out as a ``NodeUpdate``: a compact summary, never the whole hold set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from safepoint.core.bands import LEVEL_NAMES, band_step, new_band
from safepoint.core.ids import join_id
from safepoint.core.policy import Policy

__all__ = ["NodeState", "NodeUpdate", "IGNORED_DUPLICATE", "IGNORED_OLDER_SEQ", "IGNORED_STALE_INCARNATION"]

IGNORED_DUPLICATE = "duplicate"
IGNORED_OLDER_SEQ = "older_seq"
IGNORED_STALE_INCARNATION = "stale_incarnation"

# A hold on the wire between stages and in state: [ts, opened_wall_ms, label, incarnation].
# A transaction adds [prepared, coordinator, participants].
R_TS, R_WALL, R_LABEL, R_INC = 0, 1, 2, 3
T_PREPARED, T_COORD, T_PARTS, T_PREP_WALL = 4, 5, 6, 7
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
    signals: list[list[Any]] = field(default_factory=list)
    """Pressure outputs decided on the node's clock: ["alert", body] or ["expire", body]."""
    snapshot: bool = False
    """The event was a snapshot: the node's complete set of readers and transactions."""
    floor: list[Any] | None = None
    """The lowest of the node's retention bound and group published times: [kind, id, ts]."""

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
            self.signals,
            self.snapshot,
            self.floor,
        ]

    @classmethod
    def from_json(cls, data: list[Any]) -> NodeUpdate:
        return cls(*data)


def _quiet(band: list[Any]) -> bool:
    """Normal with nothing breaching: in canonical form (``bands._canonical``) that is ``new_band()``."""
    return band == _NEW_BAND


_NEW_BAND = new_band()


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
        "pinned_band",
        "age_band",
        "in_doubt",
        "expiries",
        "expire_walls",
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
        self.pinned_band: list[Any] = new_band()
        self.age_band: list[Any] = new_band()
        self.in_doubt: list[str] = []  # prepared tx ids alerted as in doubt
        self.expiries: dict[str, list[Any]] = {}  # join_id(kind, id) -> [kind, mode, at_wall, id]
        self.expire_walls: list[int] = []  # times of recent expire directives (rate limit)

    # -- persistence ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The node's state for the state store, compact: empty and default fields are left out,
        and so is a quiet pressure band (``from_json`` restores both as new)."""
        data: dict[str, Any] = {"c": self.cluster, "n": self.node, "i": self.incarnation, "s": self.seq,
                                "w": self.last_wall_ms}
        optional = (
            ("r", self.readers), ("t", self.txs), ("m", self.mvcc_now), ("g", self.groups), ("p", self.pinned_bytes),
            ("d", self.debt_bytes), ("x", list(self._summary) if self._summary is not None else None),
            ("pb", None if _quiet(self.pinned_band) else self.pinned_band),
            ("ab", None if _quiet(self.age_band) else self.age_band),
            ("id", self.in_doubt), ("xp", self.expiries), ("ew", self.expire_walls),
        )
        for key, value in optional:
            if value is not None and value != [] and value != {}:
                data[key] = value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeState:
        state = cls(data["c"], data["n"])
        state.incarnation = data["i"]
        state.seq = data["s"]
        state.readers = data.get("r") or {}
        state.txs = data.get("t") or {}
        state.mvcc_now = data.get("m")
        state.groups = data.get("g") or {}
        state.pinned_bytes = data.get("p")
        state.debt_bytes = data.get("d")
        state.last_wall_ms = data["w"]
        state._summary = tuple(data["x"]) if data.get("x") is not None else None
        # Checkpoints written before the pressure policy existed restore with empty pressure state.
        state.pinned_band = data.get("pb") or new_band()
        state.age_band = data.get("ab") or new_band()
        state.in_doubt = data.get("id") or []
        # "ex" (before readers and transactions sharing an id were told apart) was keyed by the id alone
        state.expiries = data.get("xp") or {join_id(v[0], hid): [*v[:3], hid] for hid, v in (data.get("ex") or {}).items()}
        state.expire_walls = data.get("ew") or []
        for tx in state.txs.values():
            tx.extend([None] * (T_PREP_WALL + 1 - len(tx)))
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
            self.txs[tid] = [event["begin_ts"], wall, event.get("label"), incarnation, False, None, None, None]
            opened.append(["tx", tid, event["begin_ts"]])
        elif kind == "tx_prepare":
            tx = self.txs.get(event["tx_id"])
            if tx is not None:
                tx[T_PREPARED] = True
                tx[T_COORD] = event["coordinator"]
                tx[T_PARTS] = list(event["participants"])
                if tx[T_PREP_WALL] is None:
                    tx[T_PREP_WALL] = wall
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
                new_groups: dict[str, list[Any]] = {}
                for g in event["groups"]:
                    entry = [bool(g.get("leader", False)), g.get("published_min_tx_time")]
                    twin = new_groups.get(g["group"])
                    if twin is not None:  # listed twice: leader if either says so, the lower (or unknown) time
                        low = None if twin[1] is None or entry[1] is None else min(twin[1], entry[1])
                        entry = [twin[0] or entry[0], low]
                    new_groups[g["group"]] = entry
                groups_changed = set(new_groups) != set(self.groups)
                self.groups = new_groups
        elif kind == "snapshot":
            self._replace(event, wall, incarnation, opened, closed)
        else:  # pragma: no cover - parse() only lets node types through here
            msg = f"not a node event: {kind}"
            raise ValueError(msg)
        update = self._update(wall, opened, closed, groups_changed, policy)
        update.snapshot = kind == "snapshot"
        self._pressure(kind == "heartbeat" and "pinned_bytes" in event, closed, policy, update.signals)
        return update

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
            twin = readers.get(r["reader_id"])
            if twin is not None and twin[R_TS] <= r["read_ts"]:
                continue  # listed twice: the lower entry holds (the safer reading)
            old = self.readers.get(r["reader_id"])
            opened_wall = r.get("opened_wall_ms", old[R_WALL] if old else wall)
            readers[r["reader_id"]] = [r["read_ts"], opened_wall, r.get("label"), incarnation]
        txs: dict[str, list[Any]] = {}
        for t in event["txs"]:
            twin = txs.get(t["tx_id"])
            if twin is not None and twin[R_TS] <= t["begin_ts"]:
                continue  # listed twice: the lower entry holds (the safer reading)
            old = self.txs.get(t["tx_id"])
            opened_wall = t.get("opened_wall_ms", old[R_WALL] if old else wall)
            prepared = bool(t.get("prepared", old[T_PREPARED] if old else False))
            coord = t.get("coordinator", old[T_COORD] if old else None)
            parts = t.get("participants", old[T_PARTS] if old else None)
            prep_wall = old[T_PREP_WALL] if old and len(old) > T_PREP_WALL else None  # wall_ms 0 is a time, not "unset"
            if prep_wall is None and prepared:
                prep_wall = wall
            txs[t["tx_id"]] = [t["begin_ts"], opened_wall, t.get("label"), incarnation, prepared, coord, parts, prep_wall]
        for kind, old_map, new_map in (("reader", self.readers, readers), ("tx", self.txs, txs)):
            for hid, hold in old_map.items():
                if hid not in new_map or new_map[hid][R_TS] != hold[R_TS]:
                    closed.append([kind, hid])
            for hid, hold in new_map.items():
                if hid not in old_map or old_map[hid][R_TS] != hold[R_TS]:
                    opened.append([kind, hid, hold[R_TS]])
        self.readers = readers
        self.txs = txs

    def floor_hold(self, policy: Policy) -> list[Any] | str:
        """The lowest of the node's own bounds, the retention bound and its groups' published times,
        as [kind, id, ts, None, None]; or why it is unknown."""
        if self.mvcc_now is None:
            return "no heartbeat yet"
        # clamped: a timestamp is a signed 64-bit integer on the wire, and nothing is older than the smallest one
        best: list[Any] = ["retention", None, max(self.mvcc_now - policy.retention, INT64_MIN), None, None]
        for gid, (leader, published) in self.groups.items():
            if published is None:
                if leader:
                    return f"group {gid} it leads has no published min tx time"
                continue
            if published < best[2]:
                best = ["group", gid, published, None, None]
        return best

    def local_min(self, policy: Policy) -> tuple[int | None, str | None, list[Any] | None]:
        """(local_min, why unknown, blocker). The blocker is [kind, id, ts, opened_wall_ms, label]."""
        floor = self.floor_hold(policy)
        if isinstance(floor, str):
            return None, floor, None
        best = floor
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
        floor = self.floor_hold(policy) if blocker is not None and blocker[0] in ("reader", "tx", "prepared_tx") else blocker
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
            floor=None if floor is None or isinstance(floor, str) else floor[:3],
        )

    def group_list(self) -> list[str]:
        return sorted(self.groups)

    # -- pressure: bands, in-doubt transactions, forced expiry (node clock) ---------------
    def _alert(self, kind: str, aid: str, state: str, severity: str, value: int | None, threshold: int | None,
               since: int, detail: str) -> list[Any]:
        return ["alert", {"id": aid, "kind": kind, "state": state, "severity": severity, "node": self.node,
                          "value": value, "threshold": threshold, "since": since, "detail": detail}]

    def _oldest_open(self) -> tuple[str, str, int, str | None] | None:
        """(kind, id, opened_wall, label) of the longest-open reader or transaction."""
        best: tuple[str, str, int, str | None] | None = None
        for kind, holds in (("reader", self.readers), ("tx", self.txs)):
            for hid, h in holds.items():
                if best is None or (h[R_WALL], kind, hid) < (best[2], best[0], best[1]):
                    best = (kind, hid, h[R_WALL], h[R_LABEL])
        return best

    def _pressure(self, pinned_sample: bool, closed: list[list[Any]], policy: Policy, signals: list[list[Any]]) -> None:
        now = self.last_wall_ms
        for kind, hid in closed:  # what closed is no longer in doubt, expiring, or aged
            if kind == "tx" and hid in self.in_doubt:
                self.in_doubt.remove(hid)
                signals.append(self._alert("in_doubt_tx", join_id("in_doubt_tx", self.node, hid), "cleared", "warning",
                                           None, policy.in_doubt_timeout_ms, now, f"transaction {hid} was decided"))
            exp = self.expiries.pop(join_id(kind, hid), None)
            if exp is not None:
                signals.append(self._alert("forced_expiry", join_id("forced_expiry", self.node, kind, hid), "cleared",
                                           "critical" if exp[1] == "hard" else "warning", None, None, now,
                                           f"{exp[0]} {hid} expired {exp[1]} is closed"))
        if pinned_sample and self.pinned_bytes is not None:
            self._band("pinned_bytes", self.pinned_band, policy.pinned_band(), now, self.pinned_bytes, signals)
        oldest = self._oldest_open()
        age = now - oldest[2] if oldest is not None else 0
        self._band("reader_age", self.age_band, policy.age_band(), now, max(age, 0), signals, oldest)
        for tid, h in self.txs.items():
            if h[T_PREPARED] and h[T_PREP_WALL] is not None and tid not in self.in_doubt:
                waited = now - h[T_PREP_WALL]
                if waited >= policy.in_doubt_timeout_ms:
                    self.in_doubt.append(tid)
                    signals.append(self._alert(
                        "in_doubt_tx", join_id("in_doubt_tx", self.node, tid), "raised", "warning", waited,
                        policy.in_doubt_timeout_ms, h[T_PREP_WALL],
                        f"prepared transaction {tid} undecided for {waited} ms (coordinator {h[T_COORD]}, "
                        f"participants {', '.join(h[T_PARTS] or [])}); it pins ts {h[R_TS]} until decided"))
        if policy.expire_enabled:
            self._expire(now, policy, signals)

    def _band(self, kind: str, band: list[Any], spec: Any, now: int, value: int, signals: list[list[Any]],
              oldest: tuple[str, str, int, str | None] | None = None) -> None:
        change = band_step(band, spec, now, value)
        if change is None:
            return
        old, new, since = change
        what = f"pinned bytes {value}" if kind == "pinned_bytes" else f"oldest reader/transaction open {value} ms"
        if kind == "pinned_bytes" and oldest is None:
            oldest = self._oldest_open()
        if oldest is not None:
            what += f"; oldest {oldest[0]} {oldest[1]}" + (f" ({oldest[3]})" if oldest[3] else "")
        if new == 0:
            signals.append(self._alert(kind, join_id(kind, self.node), "cleared", LEVEL_NAMES[old], value,
                                       spec.exit(old), since, f"{what}: back below the {LEVEL_NAMES[old]} exit threshold"))
        else:
            signals.append(self._alert(kind, join_id(kind, self.node), "raised", LEVEL_NAMES[new], value,
                                       spec.enter(new) if new > old else spec.exit(old), since,
                                       f"{what}: {LEVEL_NAMES[new]} band"))

    def _expire(self, now: int, policy: Policy, signals: list[list[Any]]) -> None:
        """Under critical pressure sustained for expire_after_ms, expire the holds that pin the
        most (lowest ts first) among those open longer than max_reader_lifetime_ms, graceful
        first and hard after the grace period, at most max_expiries_per_window per window.
        Prepared transactions are never expired: their fate belongs to their coordinator."""
        if self.expire_walls:
            self.expire_walls = [w for w in self.expire_walls if now - w < policy.expire_window_ms]
        if self.pinned_band[0] != 2:
            return  # nothing is expired, or upgraded to hard, outside the critical band
        budget = policy.max_expiries_per_window - len(self.expire_walls)
        def upgrade_order(kv: tuple[str, list[Any]]) -> tuple[Any, ...]:
            """First expired first; among one moment's expiries, the hold that pins the most."""
            kind, _mode, at, hid = kv[1]
            h = (self.readers if kind == "reader" else self.txs)[hid]
            return at, h[R_TS], h[R_WALL], kind, hid

        critical = self.pinned_band[0] == 2
        for _key, exp in sorted(self.expiries.items(), key=upgrade_order):
            hid = exp[3]
            if budget <= 0:
                return
            if not critical:
                break  # hard kills only under sustained critical pressure (NornicDB's MVCC lifecycle design)
            if exp[0] == "tx" and self.txs[hid][T_PREPARED]:
                continue  # prepared since its graceful expiry: its fate belongs to its coordinator now
            if exp[1] == "graceful" and now - exp[2] >= policy.expire_grace_ms:
                exp[1], exp[2] = "hard", now
                self._emit_expire(exp[0], hid, "hard", now, signals)
                budget -= 1
        critical_since = self.pinned_band[5] if self.pinned_band[0] == 2 else None
        if budget <= 0 or critical_since is None or now - critical_since < policy.expire_after_ms:
            return
        candidates = [
            (h[R_TS], h[R_WALL], kind, hid)
            for kind, holds in (("reader", self.readers), ("tx", self.txs))
            for hid, h in holds.items()
            if join_id(kind, hid) not in self.expiries
            and now - h[R_WALL] >= policy.max_reader_lifetime_ms
            and not (kind == "tx" and h[T_PREPARED])
        ]
        for _ts, _wall, kind, hid in sorted(candidates)[:budget]:
            self.expiries[join_id(kind, hid)] = [kind, "graceful", now, hid]
            self._emit_expire(kind, hid, "graceful", now, signals)

    def _emit_expire(self, kind: str, hid: str, mode: str, now: int, signals: list[list[Any]]) -> None:
        self.expire_walls.append(now)
        holds = self.readers if kind == "reader" else self.txs
        h = holds[hid]
        reason = (f"critical pinned-bytes pressure ({self.pinned_bytes} bytes); {kind} open "
                  f"{now - h[R_WALL]} ms pins ts {h[R_TS]}")
        body: dict[str, Any] = {"v": 1, "type": "expire", "node": self.node,
                                ("reader_id" if kind == "reader" else "tx_id"): hid, "reason": reason, "mode": mode}
        signals.append(["expire", body])
        signals.append(self._alert("forced_expiry", join_id("forced_expiry", self.node, kind, hid), "raised",
                                   "critical" if mode == "hard" else "warning", h[R_TS], None, now,
                                   f"{mode} expiry of {kind} {hid}" + (f" ({h[R_LABEL]})" if h[R_LABEL] else "")
                                   + f": {reason}"))
