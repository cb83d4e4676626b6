"""Levers an operator pulls through the event log: service holds with a TTL, pause and resume.

Control events are cluster events (key: the cluster id, so one cluster's control events share a
partition) without a ``version``. They take effect in **log order**: their position in the
events topic, never their ``wall_ms``, orders them, so a publisher whose clock is behind or
ahead can neither silence an action nor reorder two of them. Control events do not move cluster
time (the largest ``wall_ms`` of the cluster's nodes).

* **Service hold** (``holder``, ``ts``, ``ttl_ms``, optional ``label``): a hold of the cluster.
  The safe point never passes its ``ts``. Its TTL runs on cluster time from when the job applied
  the event (or its last renewal): it expires when cluster time passes ``applied + ttl_ms``
  (``service_hold_expired`` alert, cleared when the holder sets a hold again or releases). One
  whose ``ts`` lies below a bound already sent that it would pin (``safe_ts``, and once tenants
  are in use every namespace's bound: a service hold pins every namespace) is refused
  (``service_hold_refused`` alert); the hold it would have renewed, if any, stays as it was.
* **Pause** (``reason``) / **resume**: while paused no directive advances and no forced expiry
  leaves the job (the node stage's expire decisions are dropped and counted); a ``paused``
  alert is raised and cleared.

**Actions.** A control event may carry an ``action_id`` (every publisher of the project sets
one). The job keeps the outcome of the cluster's last ``ACTIONS_KEPT`` actions (``applied``,
``refused``, ``ignored``, and ``expired`` for the action that last set a hold whose TTL ran out)
in the status, where the CLI, ``ServiceHold`` and the HTTP API read them; an action id seen
again is a repeated delivery and changes nothing.

Whatever a control event could not do is also counted by reason (``ignored``: ``repeated``,
``unknown_holder``, ``not_paused``, ``below_safe_ts``, ``below_namespace_bound``,
``expiry_while_paused``) in the status.

What must survive a lost checkpoint (the service holds and the pause) rides on every compaction
directive; ``announce`` asks the cluster for a directive when it changed (``core/cluster.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from safepoint.core.alerts import stamp_alert
from safepoint.core.ids import join_id
from safepoint.core.outputs import Output
from safepoint.schemas import CONTROL_EVENT_TYPES

if TYPE_CHECKING:
    from safepoint.core.cluster import ClusterState

__all__ = ["ACTIONS_KEPT", "CONTROL_TYPES", "Control", "apply_control", "count_ignored", "expire_service_holds",
           "paused", "service_blocker", "service_min"]

CONTROL_TYPES = frozenset(CONTROL_EVENT_TYPES)
ACTIONS_KEPT = 256
"""Outcomes of the most recent actions a cluster keeps (and its status shows)."""
PAUSED_ID = "paused/-"

Bound = tuple[int, str]
"""A bound a hold that pins every namespace must not lie below: (ts, what it is, for the alert)."""


class Control:
    """A cluster's service holds, pause, and what its control events did (its own invariants: a
    hold's deadline is on cluster time; an action id is applied once)."""

    __slots__ = ("holds", "paused", "ignored", "actions", "announce")

    def __init__(self) -> None:
        self.holds: dict[str, dict[str, Any]] = {}
        """holder -> {ts, ttl_ms, wall_ms (the event's, shown only), applied_ms (cluster time when
        applied; None: before any node reported), expires_ms (None until applied_ms is known),
        label, since_wall_ms, action_id}."""
        self.paused: dict[str, Any] | None = None
        """{reason, since_wall_ms, action_id} while paused."""
        self.ignored: dict[str, int] = {}
        self.actions: list[dict[str, Any]] = []
        """The outcomes of the last ``ACTIONS_KEPT`` actions, oldest first."""
        self.announce = False
        """The holds or the pause changed since the last directive: the next round sends one."""

    def __bool__(self) -> bool:
        return bool(self.holds or self.paused or self.ignored or self.actions or self.announce)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"holds": self.holds, "paused": self.paused, "ignored": self.ignored,
                                "actions": self.actions, "announce": self.announce}
        return {k: v for k, v in data.items() if v}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Control:
        c = cls()
        if not data:
            return c
        c.holds = {h: _hold_of(v) for h, v in (data.get("holds") or {}).items()}
        c.paused = data.get("paused")
        c.ignored = dict(data.get("ignored") or {})
        c.actions = list(data.get("actions") or [])
        c.announce = bool(data.get("announce"))
        return c

    def seed(self, holds: dict[str, Any], pause: dict[str, Any] | None) -> None:
        """Continue from a directive's ``service_holds`` and ``paused`` after a lost checkpoint:
        each hold's TTL starts again at the new job's first cluster time (a deadline from the old
        one may be on a clock this job never sees; at most one TTL is added)."""
        self.holds = {h: {**_hold_of(v), "applied_ms": None, "expires_ms": None} for h, v in holds.items()}
        self.paused = dict(pause) if pause else None

    def action(self, action_id: str | None) -> dict[str, Any] | None:
        if action_id is None:
            return None
        return next((a for a in reversed(self.actions) if a["id"] == action_id), None)

    def record(self, event: dict[str, Any], outcome: str, reason: str | None, detail: str, now: int | None) -> None:
        """Keep an action's outcome (events without an ``action_id`` keep none)."""
        aid = event.get("action_id")
        if aid is None:
            return
        self.actions.append({"id": aid, "type": event["type"], "holder": event.get("holder"), "outcome": outcome,
                             "reason": reason, "detail": detail, "cluster_wall_ms": now})
        if len(self.actions) > ACTIONS_KEPT:
            del self.actions[: len(self.actions) - ACTIONS_KEPT]


def _hold_of(v: dict[str, Any]) -> dict[str, Any]:
    """A hold as stored, from this version or one before it (which ordered by the publisher's
    ``wall_ms`` and expired at ``wall_ms + ttl_ms``)."""
    h = dict(v)
    if "expires_ms" not in h:
        h["applied_ms"] = None
        h["expires_ms"] = None  # its deadline restarts at the next cluster time: at most one TTL more
    h.setdefault("action_id", None)
    h.setdefault("since_wall_ms", h.get("wall_ms"))
    return h


def seed_control(state: ClusterState, holds: dict[str, Any], pause: Mapping[str, Any] | None) -> None:
    """Continue from a directive's service holds and pause (``Control.seed``); a pause is alerted
    as raised again, so that the resume clears it."""
    state.control.seed(holds, dict(pause) if pause else None)
    if pause:
        state.raised[PAUSED_ID] = {"id": PAUSED_ID, "kind": "paused", "node": None, "severity": "warning", "value": None,
                                   "threshold": None, "since": pause.get("since_wall_ms"),
                                   "detail": f"paused: {pause.get('reason')} (carried over a lost checkpoint)"}


def paused(state: ClusterState) -> dict[str, Any] | None:
    return state.control.paused


def count_ignored(state: ClusterState, reason: str) -> None:
    ignored = state.control.ignored
    ignored[reason] = ignored.get(reason, 0) + 1


def service_min(state: ClusterState) -> tuple[int, str] | None:
    """The lowest service hold: (ts, holder), or None."""
    holds = state.control.holds
    if not holds:
        return None
    return min((h["ts"], holder) for holder, h in holds.items())


def service_blocker(state: ClusterState, now: int) -> dict[str, Any] | None:
    """The lowest service hold as a directive's ``blocker`` (``node`` null, ``kind`` service)."""
    lowest = service_min(state)
    if lowest is None:
        return None
    h = state.control.holds[lowest[1]]
    since = h["since_wall_ms"]
    return {"node": None, "kind": "service", "id": lowest[1], "ts": h["ts"],
            "age_ms": now - since if since is not None else None, "label": h.get("label")}


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


def apply_control(state: ClusterState, event: dict[str, Any], bound: Callable[[], Bound | None],
                  out: list[Output]) -> None:
    """Apply one control event in log order. ``bound()`` is the highest bound already sent that a
    hold pinning every namespace must respect (``safe_ts``, or a namespace's bound above it)."""
    c = state.control
    if c.action(event.get("action_id")) is not None:
        count_ignored(state, "repeated")  # the same action delivered again
        return
    kind = event["type"]
    known = state.cluster_time
    now = known if known is not None else event["wall_ms"]  # only stamps alerts before any node reported
    if kind == "pause":
        was = c.paused
        c.paused = {"reason": event["reason"], "since_wall_ms": was["since_wall_ms"] if was else now,
                    "action_id": event.get("action_id")}
        state.raised.pop(PAUSED_ID, None)
        _raise(state, PAUSED_ID, "paused", "warning", None, None,
               f"paused: {event['reason']}; no directive advances and no forced expiry is issued until resume", now, out)
        c.announce = True
        c.record(event, "applied", None, f"paused: {event['reason']}", known)
    elif kind == "resume":
        if c.paused is None:
            count_ignored(state, "not_paused")
            c.record(event, "ignored", "not_paused", "the cluster was not paused", known)
            return
        c.paused = None
        _clear(state, PAUSED_ID, now, out)
        state.dirty = True  # what the pause held back goes out at the next round
        c.announce = True
        c.record(event, "applied", None, "resumed", known)
    elif kind == "service_release":
        holder = event["holder"]
        if c.holds.pop(holder, None) is None:
            count_ignored(state, "unknown_holder")
            c.record(event, "ignored", "unknown_holder", f"no service hold of {holder}", known)
        else:
            state.dirty = True
            c.announce = True
            c.record(event, "applied", None, f"service hold of {holder} released", known)
        _clear(state, join_id("service_hold_refused", holder), now, out)
        _clear(state, join_id("service_hold_expired", holder), now, out)
    else:
        _set_hold(state, event, bound(), known, now, out)


def _set_hold(state: ClusterState, event: dict[str, Any], bound: Bound | None, known: int | None, now: int,
              out: list[Output]) -> None:
    c = state.control
    holder, ts, ttl = event["holder"], event["ts"], event["ttl_ms"]
    if bound is not None and ts < bound[0]:
        reason = "below_safe_ts" if bound[1] == "safe_ts" else "below_namespace_bound"
        count_ignored(state, reason)
        detail = (f"service hold {holder} at ts {ts} refused: below {bound[1]} {bound[0]} already sent "
                  "(that history may be compacted)")
        aid = join_id("service_hold_refused", holder)
        state.raised.pop(aid, None)
        _raise(state, aid, "service_hold_refused", "warning", ts, bound[0], detail, now, out)
        c.record(event, "refused", reason, detail, known)
        return
    previous = c.holds.get(holder)
    c.holds[holder] = {"ts": ts, "ttl_ms": ttl, "wall_ms": event["wall_ms"], "applied_ms": known,
                       "expires_ms": None if known is None else known + ttl, "label": event.get("label"),
                       "since_wall_ms": previous["since_wall_ms"] if previous else now,
                       "action_id": event.get("action_id")}
    if previous is None or previous["ts"] != ts:
        state.dirty = True
        c.announce = True  # a new or moved hold rides on a directive at once (a renewal need not)
    c.record(event, "applied", None, f"service hold {holder} at ts {ts} for {ttl} ms of cluster time", known)
    _clear(state, join_id("service_hold_refused", holder), now, out)
    _clear(state, join_id("service_hold_expired", holder), now, out)


def expire_service_holds(state: ClusterState, now: int, out: list[Output]) -> None:
    """Start the TTL of holds applied before any cluster time; drop every hold whose deadline
    cluster time has passed (its last action's outcome becomes ``expired``)."""
    c = state.control
    if not c.holds:
        return
    gone: list[str] = []
    for holder, h in c.holds.items():
        if h["expires_ms"] is None:
            h["applied_ms"], h["expires_ms"] = now, now + h["ttl_ms"]
        elif now > h["expires_ms"]:
            gone.append(holder)
    for holder in sorted(gone):
        h = c.holds.pop(holder)
        label = f" ({h['label']})" if h.get("label") else ""
        detail = (f"service hold {holder}{label} at ts {h['ts']} expired: not renewed within its TTL of "
                  f"{h['ttl_ms']} ms of cluster time (last applied at {h['applied_ms']})")
        _raise(state, join_id("service_hold_expired", holder), "service_hold_expired", "warning",
               now - h["expires_ms"], h["ttl_ms"], detail, now, out)
        last = c.action(h.get("action_id"))
        if last is not None:
            last.update(outcome="expired", reason="ttl", detail=detail, cluster_wall_ms=now)
        state.dirty = True
        c.announce = True
