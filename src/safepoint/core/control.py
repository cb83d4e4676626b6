"""Levers an operator pulls through the event log: service holds with a TTL, pause and resume.

Control events are cluster events (key: the cluster id) without a ``version``: each names its
own order by ``wall_ms`` (the publisher's clock), per holder for ``service_hold`` and
``service_release``, per cluster for ``pause`` and ``resume``; one not newer than the last of
its kind is an old or repeated delivery and changes nothing.

* **Service hold** (``holder``, ``ts``, ``ttl_ms``, optional ``label``): a hold of the cluster.
  The safe point never passes its ``ts``. It expires when cluster time passes its last
  renewal's ``wall_ms + ttl_ms`` (``service_hold_expired`` alert, cleared when the holder sets a
  hold again or releases). One whose ``ts`` is below the current ``safe_ts`` is refused
  (``service_hold_refused`` alert); so is a renewal sent before its hold's expiry that arrives
  after it (the hold is gone: set it again).
* **Pause** (``reason``) / **resume**: while paused no directive advances and no forced expiry
  leaves the job (the node stage's expire decisions are dropped and counted); a ``paused``
  alert is raised and cleared.

Whatever a control event could not do is counted by reason (``ignored``: ``older``,
``unknown_holder``, ``not_paused``, ``expired``, ``below_safe_ts``, ``expiry_while_paused``) in the
status. Everything lives in ``ClusterState.control`` (one JSON object in the cluster's state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from safepoint.core.alerts import stamp_alert
from safepoint.core.ids import join_id
from safepoint.core.outputs import Output
from safepoint.schemas import CONTROL_EVENT_TYPES

if TYPE_CHECKING:
    from safepoint.core.cluster import ClusterState

__all__ = ["CONTROL_TYPES", "apply_control", "count_ignored", "expire_service_holds", "paused", "service_blocker",
           "service_min"]

CONTROL_TYPES = frozenset(CONTROL_EVENT_TYPES)


def paused(state: ClusterState) -> dict[str, Any] | None:
    p: dict[str, Any] | None = state.control.get("paused")
    return p


def count_ignored(state: ClusterState, reason: str) -> None:
    ignored = state.control.setdefault("ignored", {})
    ignored[reason] = ignored.get(reason, 0) + 1


def service_min(state: ClusterState) -> tuple[int, str] | None:
    """The lowest service hold: (ts, holder), or None."""
    holds = state.control.get("holds")
    if not holds:
        return None
    return min((h["ts"], holder) for holder, h in holds.items())


def service_blocker(state: ClusterState, now: int) -> dict[str, Any] | None:
    """The lowest service hold as a directive's ``blocker`` (``node`` null, ``kind`` service)."""
    lowest = service_min(state)
    if lowest is None:
        return None
    h = state.control["holds"][lowest[1]]
    return {"node": None, "kind": "service", "id": lowest[1], "ts": h["ts"], "age_ms": now - h["since_wall_ms"],
            "label": h.get("label")}


def _raise(state: ClusterState, aid: str, kind: str, severity: str, value: int | None, threshold: int | None,
           detail: str, now: int, out: list[Output]) -> None:
    body = {"id": aid, "kind": kind, "node": None, "severity": severity, "value": value, "threshold": threshold,
            "since": now, "detail": detail}
    state.raised[aid] = body
    out.append(stamp_alert(state, body, "raised", now))


def _clear(state: ClusterState, aid: str, now: int, out: list[Output]) -> None:
    body = state.raised.pop(aid, None)
    if body is not None:
        out.append(stamp_alert(state, body, "cleared", now))


def apply_control(state: ClusterState, event: dict[str, Any], out: list[Output]) -> None:
    c = state.control
    kind, wall = event["type"], event["wall_ms"]
    now = state.cluster_time if state.cluster_time is not None else wall
    if kind in ("pause", "resume"):
        if wall <= c.get("pause_wall", -1):
            count_ignored(state, "older")
            return
        c["pause_wall"] = wall
        if kind == "pause":
            c["paused"] = {"reason": event["reason"], "since_wall_ms": wall}
            state.raised.pop("paused/-", None)
            _raise(state, "paused/-", "paused", "warning", None, None,
                   f"paused: {event['reason']}; no directive advances and no forced expiry is issued until resume", now, out)
        elif c.get("paused") is None:
            count_ignored(state, "not_paused")
        else:
            c["paused"] = None
            _clear(state, "paused/-", now, out)
            state.dirty = True  # what the pause held back goes out at the next round
        return
    holder = event["holder"]
    last = c.setdefault("last", {})
    if wall <= last.get(holder, -1):
        count_ignored(state, "older")
        return
    last[holder] = wall
    holds = c.setdefault("holds", {})
    expired = c.setdefault("expired", {})
    if kind == "service_release":
        if holds.pop(holder, None) is None:
            count_ignored(state, "unknown_holder")
        expired.pop(holder, None)
        state.dirty = True
    else:
        if holder not in holds and holder in expired and wall <= expired[holder]:
            count_ignored(state, "expired")  # a renewal of a hold that is gone
            return
        ts = event["ts"]
        if state.safe_ts is not None and ts < state.safe_ts:
            count_ignored(state, "below_safe_ts")
            aid = join_id("service_hold_refused", holder)
            state.raised.pop(aid, None)
            _raise(state, aid, "service_hold_refused", "warning", ts, state.safe_ts,
                   f"service hold {holder} at ts {ts} refused: below safe_ts {state.safe_ts} already sent "
                   "(that history may be compacted)", now, out)
            return
        previous = holds.get(holder)
        holds[holder] = {"ts": ts, "ttl_ms": event["ttl_ms"], "wall_ms": wall, "label": event.get("label"),
                         "since_wall_ms": previous["since_wall_ms"] if previous else wall}
        expired.pop(holder, None)
        state.dirty = True
    _clear(state, join_id("service_hold_refused", holder), now, out)
    _clear(state, join_id("service_hold_expired", holder), now, out)


def expire_service_holds(state: ClusterState, now: int, out: list[Output]) -> None:
    """Drop every service hold whose last renewal's wall_ms + ttl_ms cluster time has passed."""
    holds = state.control.get("holds")
    if not holds:
        return
    for holder in sorted(holder for holder, h in holds.items() if now > h["wall_ms"] + h["ttl_ms"]):
        h = holds.pop(holder)
        deadline = h["wall_ms"] + h["ttl_ms"]
        state.control.setdefault("expired", {})[holder] = deadline
        label = f" ({h['label']})" if h.get("label") else ""
        _raise(state, join_id("service_hold_expired", holder), "service_hold_expired", "warning", now - deadline,
               h["ttl_ms"], f"service hold {holder}{label} at ts {h['ts']} expired: not renewed within its TTL of "
               f"{h['ttl_ms']} ms (last renewal at {h['wall_ms']})", now, out)
        state.dirty = True
