"""Levers an operator pulls through the event log: service holds with a TTL, pause and resume.

Control events are cluster events (key: the cluster id, so one cluster's control events share a
partition) without a ``version``, on the control topic (``core/origin.py``). They take effect in
**log order**: their position in the control topic, merged with the events topic's by log time
(the broker's append time), never their ``wall_ms``, orders them, so a publisher whose clock is behind or
ahead can neither silence an action nor reorder two of them. Control events do not move cluster
time (the largest log time of the cluster's node events, ``core/clock.py``).

* **Service hold** (``holder``, ``ts``, ``ttl_ms``, optional ``label``): a hold of the cluster.
  The safe point never passes its ``ts``. Its TTL runs on cluster time from when the job applied
  the event (or its last renewal): it expires when cluster time passes ``applied + ttl_ms``
  (``service_hold_expired`` alert, cleared when the holder sets a hold again or releases). One
  whose ``ts`` lies below a bound already sent that it would pin (``safe_ts``, and once tenants
  are in use every namespace's bound: a service hold pins every namespace), or below what the
  store has compacted already (``compacted_ts``, an agent's heartbeat: ``connectors/etcd_agent.py``)
  is refused (``service_hold_refused`` alert); the hold it would have renewed, if any, stays as it was.
* **Owners**: a hold set with ``owner`` (the SHA-256 of its holder's token; ``ServiceHold`` always
  sets one) is renewed or moved only by a set with the same ``owner`` and released only with
  ``owner_token``; ``force`` (an operator's override) does either and is recorded (``forced``).
  Others are refused (``not_owner``). A hold set without ``owner`` has none, as before.
* **Pause** (``reason``) / **resume**: while paused no directive advances and no forced expiry
  leaves the job (the node stage's expire decisions are dropped and counted); a ``paused``
  alert is raised and cleared.

**Actions.** A control event may carry an ``action_id`` (every publisher of the project sets
one). The job keeps the outcome of the cluster's last ``ACTIONS_KEPT`` actions (``applied``,
``refused``, ``ignored``, and ``expired`` for the action that last set a hold whose TTL ran out)
in the status, where the CLI, ``ServiceHold`` and the HTTP API read them; an action id seen
again is a repeated delivery and changes nothing.

Whatever a control event could not do is also counted by reason (``ignored``: ``repeated``,
``unknown_holder``, ``not_paused``, ``below_safe_ts``, ``below_namespace_bound``, ``below_compacted_ts``,
``expiry_while_paused``) in the status.

What must survive a lost checkpoint (the service holds and the pause) rides on every compaction
directive; ``announce`` asks the cluster for a directive when it changed (``core/cluster.py``).

``Control`` is the cluster's part that owns all of it; its alerts go through the cluster's
``AlertBook``, and a method that changes what the round may pass returns True (the cluster is
dirty: its next round runs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from safepoint.core.alert_kinds import AlertKind, Severity
from safepoint.core.alerts import AlertBook, Bound
from safepoint.core.clock import log_time
from safepoint.core.event_records import ControlEvent, ServiceHold, ServiceRelease
from safepoint.core.ids import join_id
from safepoint.core.outputs import Output
from safepoint.core.signals import AlertBody
from safepoint.core.signing import owner_digest, verify

__all__ = ["ACTIONS_KEPT", "Control", "GAP_ACK"]

GAP_ACK: Final = "gap_ack"
"""An operator's acknowledgement of a gap in the log (``core/gaps.py``; the cluster applies it)."""
ACTIONS_KEPT = 256
"""Outcomes of the most recent actions a cluster keeps (and its status shows)."""
PAUSED_ID = "paused/-"
CONTROL_REFUSED_ID = "control_refused/-"
SIGNATURE_WORDS = {"unsigned": "it carries no signature (sig)", "bad_signature": "its signature is not one of the "
                   "cluster's control keys", "stale_signature": "its signature is older than "
                   "control_signature_window_ms (an event sent again)"}
REASONS = {"safe_ts": "below_safe_ts", "compacted_ts": "below_compacted_ts"}
"""What a refused hold lay below -> the reason of its outcome (else ``below_namespace_bound``)."""


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

    def announced(self) -> None:
        """A compaction directive carries the holds and the pause as they are now."""
        self.announce = False

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

    def seed(self, holds: Mapping[str, Any], pause: Mapping[str, Any] | None, book: AlertBook) -> None:
        """Continue from a directive's ``service_holds`` and ``paused`` after a lost checkpoint:
        each hold's TTL starts again at the new job's first cluster time (a deadline from the old
        one may be on a clock this job never sees; at most one TTL is added). A pause is put in
        the book as raised again, so that the resume clears it."""
        self.holds = {h: {**_hold_of(v), "applied_ms": None, "expires_ms": None} for h, v in holds.items()}
        self.paused = dict(pause) if pause else None
        if pause:
            book.carry({"id": PAUSED_ID, "kind": "paused", "node": None, "severity": "warning", "value": None,
                        "threshold": None, "since": pause["since_wall_ms"],  # (required by the directive's schema)
                        "detail": f"paused: {pause.get('reason')} (carried over a lost checkpoint)"})

    def action(self, action_id: str | None) -> dict[str, Any] | None:
        if action_id is None:
            return None
        for i in range(len(self.actions) - 1, -1, -1):
            if self.actions[i]["id"] == action_id:
                return self.actions[i]
        return None

    def record(self, event: ControlEvent, outcome: str, reason: str | None, detail: str, now: int | None) -> None:
        """Keep an action's outcome (events without an ``action_id`` keep none)."""
        aid = event.get("action_id")
        if aid is None:
            return
        self.actions.append({"id": aid, "type": event["type"], "holder": event.get("holder"), "outcome": outcome,
                             "reason": reason, "detail": detail, "cluster_wall_ms": now,
                             **({"by": event["by"]} if event.get("by") else {})})
        if len(self.actions) > ACTIONS_KEPT:
            del self.actions[: len(self.actions) - ACTIONS_KEPT]

    def count(self, reason: str) -> None:
        """Count what a control event (or an expiry while paused) could not do, by reason."""
        self.ignored[reason] = self.ignored.get(reason, 0) + 1

    def lowest(self) -> tuple[int, str] | None:
        """The lowest service hold: (ts, holder), or None."""
        if not self.holds:
            return None
        return min((h["ts"], holder) for holder, h in self.holds.items())

    def blocker(self, now: int) -> dict[str, Any] | None:
        """The lowest service hold as a directive's ``blocker`` (``node`` null, ``kind`` service)."""
        lowest = self.lowest()
        if lowest is None:
            return None
        h = self.holds[lowest[1]]
        since = h["since_wall_ms"]
        return {"node": None, "kind": "service", "id": lowest[1], "ts": h["ts"],
                "age_ms": now - since if since is not None else None, "label": h.get("label")}

    # -- control events, in log order ---------------------------------------------------------
    def apply(self, event: ControlEvent, bound: Callable[[], Bound | None], known: int | None, book: AlertBook,
              max_ttl: int = 0) -> tuple[bool, list[Output]]:
        """Apply one control event in log order at cluster time ``known`` (None: no node reported
        yet). ``bound()`` is the highest bound already sent that a hold pinning every namespace
        must respect (``safe_ts``, or a namespace's bound above it); ``max_ttl``: the longest TTL a
        service hold may have (0: any). Returns (the cluster is dirty, the alerts' messages)."""
        if self.action(event.get("action_id")) is not None:
            self.count("repeated")  # the same action delivered again
            return False, []
        now = known if known is not None else log_time(event)  # only stamps alerts before any node reported
        if event["type"] == "pause":
            was = self.paused
            self.paused = {"reason": event["reason"], "since_wall_ms": was["since_wall_ms"] if was else now,
                           "action_id": event.get("action_id")}
            raised = book.raise_again(_body(PAUSED_ID, "paused", None, None, now,
                                            f"paused: {event['reason']}; no directive advances and no forced expiry "
                                            "is issued until resume"), now)
            self.announce = True
            self.record(event, "applied", None, f"paused: {event['reason']}", known)
            return False, [raised]
        if event["type"] == "resume":
            if self.paused is None:
                self.count("not_paused")
                self.record(event, "ignored", "not_paused", "the cluster was not paused", known)
                return False, []
            self.paused = None
            self.announce = True
            self.record(event, "applied", None, "resumed", known)
            return True, book.clear_each([PAUSED_ID], now)  # what the pause held back goes out at the next round
        if event["type"] == "service_release":
            holder = event["holder"]
            held = self.holds.get(holder)
            refused = self._not_owner(event, held, "release", now, book, known) if held is not None else None
            if refused is not None:
                return False, [refused]
            dirty = self.holds.pop(holder, None) is not None
            if not dirty:
                self.count("unknown_holder")
                self.record(event, "ignored", "unknown_holder", f"no service hold of {holder}", known)
            else:
                self.announce = True
                forced = bool(event.get("force")) and held is not None and held.get("owner") is not None
                self.record(event, "applied", "forced" if forced else None,
                            f"service hold of {holder} released" + (" by force, without its owner's token" if forced
                                                                     else ""), known)
            return dirty, book.clear_each([join_id("service_hold_refused", holder),
                                          join_id("service_hold_expired", holder)], now)
        assert event["type"] == "service_hold", "a gap_ack is the cluster's (ClusterState._ack_gap)"
        return self._set_hold(event, bound(), known, now, book, max_ttl)

    def check_signature(self, event: ControlEvent, keys: list[str], window_ms: int, known: int | None,
                        book: AlertBook) -> tuple[str | None, list[Output]]:
        """With ``keys`` (the cluster's ``control_keys``), a control event must be signed by one of them
        (``core/signing.py``): (None, ...) when it is, else (why not, ...), with the refusal recorded,
        counted and alerted (critical ``control_refused``, cleared by the next accepted signed event);
        and the alerts' messages."""
        log = log_time(event)
        now = known if known is not None else log
        why = verify(event, keys, log, window_ms)
        if why is None:
            return None, book.clear_each([CONTROL_REFUSED_ID], now)
        self.count(why)
        holder = event.get("holder")  # (a service hold's or release's)
        what = f"{event['type']}" + (f" of {holder}" if holder is not None else "")
        detail = (f"{what} refused: {SIGNATURE_WORDS[why]}; only a holder of the cluster's control key steers it "
                  f"(action {event.get('action_id') or '-'}, wall_ms {event['wall_ms']}, log time {log})")
        raised = book.raise_again(_body(CONTROL_REFUSED_ID, "control_refused", None, None, now, detail, "critical"), now)
        if self.action(event.get("action_id")) is None:  # a forged copy of a known action cannot change its outcome
            self.record(event, "refused", why, detail, known)
        return why, [raised]

    def _set_hold(self, event: ServiceHold, bound: Bound | None, known: int | None, now: int, book: AlertBook,
                  max_ttl: int = 0) -> tuple[bool, list[Output]]:
        holder, ts, ttl = event["holder"], event["ts"], event["ttl_ms"]
        if max_ttl and ttl > max_ttl:
            # the TTL bounds how long a hold lost with events (core/gaps.py) can matter: it must be bounded
            self.count("ttl_too_long")
            detail = (f"service hold {holder} at ts {ts} refused: its ttl_ms {ttl} is above max_service_hold_ttl_ms "
                      f"{max_ttl}; renew it more often with a shorter TTL")
            aid = join_id("service_hold_refused", holder)
            raised = book.raise_again(_body(aid, "service_hold_refused", ttl, max_ttl, now, detail), now)
            self.record(event, "refused", "ttl_too_long", detail, known)
            return False, [raised]
        if bound is not None and ts < bound[0]:
            reason = REASONS.get(bound[1], "below_namespace_bound")
            self.count(reason)
            detail = (f"service hold {holder} at ts {ts} refused: below compacted_ts {bound[0]}: the store has "
                      "compacted that history already" if reason == "below_compacted_ts" else
                      f"service hold {holder} at ts {ts} refused: below {bound[1]} {bound[0]} already sent "
                      "(that history may be compacted)")
            aid = join_id("service_hold_refused", holder)
            raised = book.raise_again(_body(aid, "service_hold_refused", ts, bound[0], now, detail), now)
            self.record(event, "refused", reason, detail, known)
            return False, [raised]
        previous = self.holds.get(holder)
        refused = self._not_owner(event, previous, "set", now, book, known) if previous is not None else None
        if refused is not None:
            return False, [refused]
        self.holds[holder] = {"ts": ts, "ttl_ms": ttl, "wall_ms": event["wall_ms"], "applied_ms": known,
                              "expires_ms": None if known is None else known + ttl, "label": event.get("label"),
                              "since_wall_ms": previous["since_wall_ms"] if previous else now,
                              "action_id": event.get("action_id"),
                              **({"owner": event["owner"]} if event.get("owner") else {})}
        moved = previous is None or previous["ts"] != ts
        if moved:
            self.announce = True  # a new or moved hold rides on a directive at once (a renewal need not)
        self.record(event, "applied", None, f"service hold {holder} at ts {ts} for {ttl} ms of cluster time", known)
        return moved, book.clear_each([join_id("service_hold_refused", holder),
                                          join_id("service_hold_expired", holder)], now)

    def _not_owner(self, event: ServiceHold | ServiceRelease, held: dict[str, Any], what: str, now: int, book: AlertBook,
                   known: int | None) -> Output | None:
        """A hold with an owner (``owner``: the SHA-256 of its owner's token) is renewed or moved only
        with the same ``owner`` and released only with ``owner_token``, unless the event says
        ``force`` (an operator's override, recorded). Refused (recorded, counted, alerted): the alert's
        message; None: allowed."""
        owner = held.get("owner")
        if owner is None or event.get("force"):
            return None
        if what == "set":
            proven = event.get("owner") == owner
        else:
            token = event.get("owner_token")
            proven = isinstance(token, str) and owner_digest(token) == owner
        if proven:
            return None
        holder = event["holder"]
        self.count("not_owner")
        detail = (f"{event['type']} of {holder} refused: the hold belongs to another owner "
                  f"({'a different owner digest' if what == 'set' else 'no matching owner_token'}); its owner's "
                  "token, or --force by an operator, is needed")
        aid = join_id("service_hold_refused", holder)
        raised = book.raise_again(_body(aid, "service_hold_refused", None, None, now, detail), now)
        self.record(event, "refused", "not_owner", detail, known)
        return raised

    def expire(self, now: int, book: AlertBook) -> list[Output]:
        """Start the TTL of holds applied before any cluster time; drop every hold whose deadline
        cluster time has passed (its last action's outcome becomes ``expired``). The alert of each that
        expired (none: none did)."""
        if not self.holds:
            return []
        out: list[Output] = []
        gone: list[str] = []
        for holder, h in self.holds.items():
            if h["expires_ms"] is None:
                h["applied_ms"], h["expires_ms"] = now, now + h["ttl_ms"]
            elif now > h["expires_ms"]:
                gone.append(holder)
        for holder in sorted(gone):
            h = self.holds.pop(holder)
            label = f" ({h['label']})" if h.get("label") else ""
            detail = (f"service hold {holder}{label} at ts {h['ts']} expired: not renewed within its TTL of "
                      f"{h['ttl_ms']} ms of cluster time (last applied at {h['applied_ms']})")
            aid = join_id("service_hold_expired", holder)
            out.append(book.raise_(_body(aid, "service_hold_expired", now - h["expires_ms"], h["ttl_ms"], now, detail),
                                   now))
            last = self.action(h.get("action_id"))
            if last is not None:
                last.update(outcome="expired", reason="ttl", detail=detail, cluster_wall_ms=now)
            self.announce = True
        return out


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


def _body(aid: str, kind: AlertKind, value: int | None, threshold: int | None, now: int, detail: str,
          severity: Severity = "warning") -> AlertBody:
    return {"id": aid, "kind": kind, "node": None, "severity": severity, "value": value, "threshold": threshold,
            "since": now, "detail": detail}


