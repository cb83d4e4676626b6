"""Pressure on one node, decided on its own clock: bands, in-doubt transactions, forced expiry.

After each applied event the node stage runs ``apply_pressure``: the pinned-bytes band (on a
heartbeat that reports ``pinned_bytes``) and the oldest-hold age band move with hysteresis
(``bands.py``), a prepared transaction undecided for ``in_doubt_timeout_ms`` is alerted, and
under sustained critical pressure the holds that pin the most are expired, graceful first and
hard after the grace period (NornicDB's MVCC lifecycle design). What it decides comes out as the
update's ``signals``: ``["alert", body]`` or ``["expire", body]``, which the cluster stage stamps
with the cluster's identity and time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from safepoint.core.bands import LEVEL_NAMES, Band, BandSpec, band_step
from safepoint.core.ids import join_id
from safepoint.core.policy import Policy
from safepoint.core.records import Expiry, Hold, HoldRef

if TYPE_CHECKING:
    from safepoint.core.node import NodeState

__all__ = ["apply_pressure"]

Oldest = tuple[str, str, int, str | None]
"""(kind, id, opened_wall, label) of the longest-open reader or transaction."""


def _alert(node: NodeState, kind: str, aid: str, state: str, severity: str, value: int | None, threshold: int | None,
           since: int, detail: str) -> list[Any]:
    return ["alert", {"id": aid, "kind": kind, "state": state, "severity": severity, "node": node.node,
                      "value": value, "threshold": threshold, "since": since, "detail": detail}]


def _oldest_open(node: NodeState) -> Oldest | None:
    best: Oldest | None = None
    best_wall = 0
    for kind, holds in (("reader", node.readers), ("tx", node.txs)):
        for hid, h in holds.items():
            wall = h.opened_wall
            if best is None or wall < best_wall or (wall == best_wall and (kind, hid) < (best[0], best[1])):
                best, best_wall = (kind, hid, wall, h.label), wall
    return best


_specs: list[Any] = [None, None, None]
"""The last policy's band specs (building them is a dataclass per call; one policy serves a run)."""


def _band_specs(policy: Policy) -> tuple[BandSpec, BandSpec]:
    if _specs[0] is not policy:
        _specs[:] = [policy, policy.pinned_band(), policy.age_band()]
    return _specs[1], _specs[2]


def apply_pressure(node: NodeState, pinned_sample: bool, closed: list[HoldRef], policy: Policy,
                   signals: list[list[Any]]) -> None:
    """Move the node's bands, in-doubt and expiry state after one event; append what it decides."""
    now = node.last_wall_ms
    for kind, hid in closed:  # what closed is no longer in doubt, expiring, or aged
        if kind == "tx" and hid in node.in_doubt:
            node.in_doubt.remove(hid)
            signals.append(_alert(node, "in_doubt_tx", join_id("in_doubt_tx", node.node, hid), "cleared", "warning",
                                  None, policy.in_doubt_timeout_ms, now, f"transaction {hid} was decided"))
        exp = node.expiries.pop(join_id(kind, hid), None) if node.expiries else None
        if exp is not None:
            signals.append(_alert(node, "forced_expiry", join_id("forced_expiry", node.node, kind, hid), "cleared",
                                  "critical" if exp.mode == "hard" else "warning", None, None, now,
                                  f"{exp.kind} {hid} expired {exp.mode} is closed"))
    pinned_spec, age_spec = _band_specs(policy)
    if pinned_sample and node.pinned_bytes is not None:
        _band(node, "pinned_bytes", node.pinned_band, pinned_spec, now, node.pinned_bytes, signals)
    oldest = _oldest_open(node)
    age = now - oldest[2] if oldest is not None else 0
    _band(node, "reader_age", node.age_band, age_spec, now, max(age, 0), signals, oldest)
    for tid, h in node.txs.items():
        if h.prepared and h.prepared_wall is not None and tid not in node.in_doubt:
            waited = now - h.prepared_wall
            if waited >= policy.in_doubt_timeout_ms:
                node.in_doubt.append(tid)
                signals.append(_alert(
                    node, "in_doubt_tx", join_id("in_doubt_tx", node.node, tid), "raised", "warning", waited,
                    policy.in_doubt_timeout_ms, h.prepared_wall,
                    f"prepared transaction {tid} undecided for {waited} ms (coordinator {h.coordinator}, "
                    f"participants {', '.join(h.participants or [])}); it pins ts {h.ts} until decided"))
    if policy.expire_enabled:
        _expire(node, now, policy, signals)


def _band(node: NodeState, kind: str, band: Band, spec: BandSpec, now: int, value: int, signals: list[list[Any]],
          oldest: Oldest | None = None) -> None:
    change = band_step(band, spec, now, value)
    if change is None:
        return
    old, new, since = change
    what = f"pinned bytes {value}" if kind == "pinned_bytes" else f"oldest reader/transaction open {value} ms"
    if kind == "pinned_bytes" and oldest is None:
        oldest = _oldest_open(node)
    if oldest is not None:
        what += f"; oldest {oldest[0]} {oldest[1]}" + (f" ({oldest[3]})" if oldest[3] else "")
    if new == 0:
        signals.append(_alert(node, kind, join_id(kind, node.node), "cleared", LEVEL_NAMES[old], value,
                              spec.exit(old), since, f"{what}: back below the {LEVEL_NAMES[old]} exit threshold"))
    else:
        signals.append(_alert(node, kind, join_id(kind, node.node), "raised", LEVEL_NAMES[new], value,
                              spec.enter(new) if new > old else spec.exit(old), since,
                              f"{what}: {LEVEL_NAMES[new]} band"))


def _expire(node: NodeState, now: int, policy: Policy, signals: list[list[Any]]) -> None:
    """Under critical pressure sustained for expire_after_ms, expire the holds that pin the
    most (lowest ts first) among those open longer than max_reader_lifetime_ms, graceful
    first and hard after the grace period, at most max_expiries_per_window per window.
    Prepared transactions are never expired: their fate belongs to their coordinator."""
    if node.expire_walls:
        node.expire_walls = [w for w in node.expire_walls if now - w < policy.expire_window_ms]
    if node.pinned_band.level != 2:
        return  # nothing is expired, or upgraded to hard, outside the critical band
    budget = policy.max_expiries_per_window - len(node.expire_walls)

    def held(exp: Expiry) -> Hold:
        return (node.readers if exp.kind == "reader" else node.txs)[exp.id]

    def upgrade_order(kv: tuple[str, Expiry]) -> tuple[Any, ...]:
        """First expired first; among one moment's expiries, the hold that pins the most."""
        exp = kv[1]
        h = held(exp)
        return exp.at_wall, h.ts, h.opened_wall, exp.kind, exp.id

    for _key, exp in sorted(node.expiries.items(), key=upgrade_order):
        if budget <= 0:
            return
        if exp.kind == "tx" and node.txs[exp.id].prepared:
            continue  # prepared since its graceful expiry: its fate belongs to its coordinator now
        if exp.mode == "graceful" and now - exp.at_wall >= policy.expire_grace_ms:
            exp.mode, exp.at_wall = "hard", now
            _emit_expire(node, exp.kind, exp.id, "hard", now, signals)
            budget -= 1
    critical_since = node.pinned_band.since
    if budget <= 0 or critical_since is None or now - critical_since < policy.expire_after_ms:
        return
    candidates = [
        (h.ts, h.opened_wall, kind, hid)
        for kind, holds in (("reader", node.readers), ("tx", node.txs))
        for hid, h in holds.items()
        if join_id(kind, hid) not in node.expiries
        and now - h.opened_wall >= policy.max_reader_lifetime_ms
        and not (kind == "tx" and h.prepared)
    ]
    for _ts, _wall, kind, hid in sorted(candidates)[:budget]:
        node.expiries[join_id(kind, hid)] = Expiry(kind, "graceful", now, hid)
        _emit_expire(node, kind, hid, "graceful", now, signals)


def _emit_expire(node: NodeState, kind: str, hid: str, mode: str, now: int, signals: list[list[Any]]) -> None:
    node.expire_walls.append(now)
    h = (node.readers if kind == "reader" else node.txs)[hid]
    reason = (f"critical pinned-bytes pressure ({node.pinned_bytes} bytes); {kind} open "
              f"{now - h.opened_wall} ms pins ts {h.ts}")
    body: dict[str, Any] = {"v": 1, "type": "expire", "node": node.node,
                            ("reader_id" if kind == "reader" else "tx_id"): hid, "reason": reason, "mode": mode}
    signals.append(["expire", body])
    signals.append(_alert(node, "forced_expiry", join_id("forced_expiry", node.node, kind, hid), "raised",
                          "critical" if mode == "hard" else "warning", h.ts, None, now,
                          f"{mode} expiry of {kind} {hid}" + (f" ({h.label})" if h.label else "") + f": {reason}"))
