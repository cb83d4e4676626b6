"""The cluster stage's alerts: raised and cleared on cluster time, each with a stable id.

- **Abort alerts** (``missing_node``, ``unknown_node_min``, ``missing_group``,
  ``awaiting_snapshot``, ``leaderless_group``): one per reason the round aborts (a ``Problem``), raised when it appears
  and cleared when it is gone, from the first aborted round on: a node the topology names but
  that never reported is alerted at once (every aborted round names its reason).
- **stall**: the safe point has not advanced for ``stall_ms`` of cluster time.
- **horizon_violation**: a hold below a ``safe_ts`` already sent (a reader or transaction that
  arrived too late, a node that joined, a clock or group that went back); cleared when it closes
  or comes back above.

An ``AlertBook`` is a cluster's part that owns its raised alerts (id -> body): raising puts an alert
in the book and returns what goes out, clearing takes it out. The checks below read the members'
records and indexes (``core/members.py``) and write only to the book.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, cast

from safepoint.core.alert_kinds import AlertKind
from safepoint.core.holds import HELD_AS
from safepoint.core.ids import escape, hold_key, join_id, split_id
from safepoint.core.members import Members
from safepoint.core.outputs import Output, alert
from safepoint.core.policy import Policy
from safepoint.core.records import FLOOR_KINDS, Blocker, Floor
from safepoint.core.recovery import Recovery
from safepoint.core.signals import AlertBody

__all__ = ["ABORT_KINDS", "AlertBook", "Problem", "below_sent", "check_floor", "check_horizon", "check_join",
           "problems", "stall_alert", "sync_abort_alerts", "violation"]

ABORT_KINDS: tuple[AlertKind, ...] = ("missing_node", "unknown_node_min", "missing_group", "awaiting_snapshot",
                                      "leaderless_group")
Bound = tuple[int, str]
"""A bound already sent that a hold must not lie below: (ts, what it is, for the alert)."""


class Problem(NamedTuple):
    """One reason the current round must abort."""

    kind: AlertKind
    """One of ``ABORT_KINDS``."""
    node: str | None
    """The node it is about (None: a group's, ``leaderless_group``)."""
    value: int | None
    threshold: int | None
    detail: str


class AlertBook:
    """A cluster's raised alerts, id -> body (``since`` is the cluster time it was raised at).

    Invariant: an id is raised at most once until it is cleared; every raise and clear returns the
    one message that says so. ``floor`` remembers, per node, its raised retention or group
    violation (so that the next check clears it when the floor comes back or moves)."""

    __slots__ = ("cluster", "raised", "floor")

    def __init__(self, cluster: str, raised: dict[str, AlertBody] | None = None) -> None:
        self.cluster = cluster
        self.raised: dict[str, AlertBody] = raised if raised is not None else {}
        self.floor: dict[str, str] = {}  # node -> its raised retention/group violation
        for aid in self.raised:
            parts = split_id(aid)
            if parts[0] == "horizon_violation" and len(parts) == 4 and parts[2] in FLOOR_KINDS:
                self.floor[parts[1]] = aid

    def __bool__(self) -> bool:
        return bool(self.raised)

    def __contains__(self, aid: object) -> bool:
        return aid in self.raised

    def raise_(self, body: AlertBody, now: int) -> Output:
        """Put ``body`` in the book (replacing one of the same id) and say it is raised."""
        self.raised[body["id"]] = body
        return self.stamp(body, "raised", now)

    def raise_again(self, body: AlertBody, now: int) -> Output:
        """Raise ``body`` anew: said again even when its id is raised (a newer pause, another
        refusal), and kept as the book's newest."""
        self.raised.pop(body["id"], None)
        return self.raise_(body, now)

    def carry(self, body: AlertBody) -> None:
        """Put ``body`` in the book as raised without saying so: it was said before a lost checkpoint
        (``core/recovery.py``), and its clearing will be said."""
        self.raised[body["id"]] = body

    def clear(self, aid: str, now: int, **changes: Any) -> Output | None:
        """Take ``aid`` out of the book and say it is cleared, with ``changes`` to its body (its
        ``value``, its ``detail``); None: it was not raised."""
        body = self.raised.pop(aid, None)
        return None if body is None else self.stamp(cast(AlertBody, {**body, **changes}) if changes else body,
                                                    "cleared", now)

    def clear_each(self, aids: Iterable[str], now: int) -> list[Output]:
        """``clear`` each of ``aids`` in turn: the messages of those that were raised."""
        return [cleared for aid in aids if (cleared := self.clear(aid, now)) is not None]

    def floor_of(self, node: str) -> str | None:
        """The id of ``node``'s raised retention or group violation, if any."""
        return self.floor.get(node)

    def set_floor(self, node: str, aid: str | None) -> None:
        """``node``'s raised retention or group violation is now ``aid`` (None: none)."""
        if aid is None:
            self.floor.pop(node, None)
        else:
            self.floor[node] = aid

    def stamp(self, body: AlertBody, state: str, now: int) -> Output:
        """The alert message of ``body`` in ``state`` (raised or cleared) at cluster time ``now``."""
        return alert(
            kind=body["kind"],
            state=state,
            severity=body["severity"],
            cluster=self.cluster,
            node=body["node"],
            value=body["value"],
            threshold=body["threshold"],
            since_wall_ms=body["since"],
            cluster_wall_ms=now,
            detail=body["detail"],
            alert_id=f"{escape(self.cluster)}/{body['id']}",
        )


def sync_abort_alerts(book: AlertBook, found: dict[str, Problem], now: int) -> list[Output]:
    """Raise what ``found`` has and the book lacks, clear the other way round (every abort kind); the
    messages that say so, in order."""
    if not found and not book:
        return []
    said = book.clear_each([a for a in book.raised if a.split("/", 1)[0] in ABORT_KINDS and a not in found], now)
    return said + raise_new(book, found, now)


def raise_new(book: AlertBook, found: dict[str, Problem], now: int) -> list[Output]:
    """Raise each problem of ``found`` not raised yet, in id order; the messages that say so."""
    # sorted: ``found`` comes partly from sets whose order depends on the hash seed and on how the
    # state was rebuilt, and replay, the job and every batch split must emit the same sequence
    return [book.raise_({"id": aid, "kind": kind, "node": node, "severity": "warning", "value": value,
                         "threshold": threshold, "since": now,
                         "detail": f"{detail}; the safe point holds until it recovers"}, now)
            for aid, (kind, node, value, threshold, detail) in sorted(found.items()) if aid not in book.raised]


def stall_alert(book: AlertBook, members: Members, recovery: Recovery | None, since: int, now: int,
                policy: Policy) -> Output | None:
    """Cluster time moved on by stall_ms since the safe point last advanced (``since``)."""
    waited = now - since
    if not policy.stall_ms or waited < policy.stall_ms or "stall/-" in book:
        return None
    why = "; ".join(sorted(p.detail for p in problems(members, recovery, now, policy).values())[:3])
    lowest = members.lowest()
    if not why and lowest is not None:
        lmin, gnode = lowest
        b = members.nodes[gnode].blocker or Blocker("?", None, lmin, None, None)
        why = f"held by {b.kind} {b.id or ''} on node {gnode} at ts {b.ts}".replace("  ", " ")
        if b.cost is not None:
            why += f" (it alone keeps {b.cost} bytes of history there)"
    return book.raise_({"id": "stall/-", "kind": "stall", "node": None, "severity": "warning", "value": waited,
                        "threshold": policy.stall_ms, "since": since,
                        "detail": f"safe point has not advanced for {waited} ms of cluster time: "
                                  f"{why or 'no directive yet'}"}, now)


def violation(book: AlertBook, node: str, kind: str, hid: str, ts: int, bound: Bound, now: int) -> Output:
    """Raise a hold below a bound already sent (``bound``: (ts, what), ``safe_ts`` or a namespace's)."""
    limit, what = bound
    return book.raise_({
        "id": join_id("horizon_violation", node, kind, hid),
        "kind": "horizon_violation",
        "node": node,
        "severity": "critical",
        "value": ts,
        "threshold": limit,
        "since": now,
        "detail": (f"the retention bound (mvcc_now - retention) of node {node} is {ts}" if kind == "retention"
                   else f"group {hid} on node {node} publishes min tx time {ts}" if kind == "group"
                   else f"{kind} {hid} on node {node} needs ts {ts}")
        + f", below {what} {limit} already sent: versions it reads may be compacted",
    }, now)


def below_sent(ts: int | None, safe_ts: int | None) -> bool:
    """A hold (or a node's minimum) at ``ts`` lies below ``safe_ts`` already sent: the versions it reads
    may be compacted (a ``horizon_violation``). The rules that raise one ask it, and so do the
    shortcuts that must raise none (``NodeState.quiet``, ``ClusterState.take_quiet``)."""
    return ts is not None and safe_ts is not None and ts < safe_ts


def check_horizon(book: AlertBook, members: Members, node: str, safe_ts: int | None, now: int) -> Output | None:
    """A member whose lowest hold is a reader or transaction below safe_ts has it alerted (the
    alert's message, or None).

    Holds that arrive below safe_ts are alerted on arrival. This catches the others: those of
    a node that joins the topology after safe_ts passed them (they did not count before), and,
    once that hold closes, the node's next one still below safe_ts.
    """
    rec = members.nodes.get(node)
    if rec is None or not below_sent(rec.local_min, safe_ts):
        return None
    assert safe_ts is not None
    blocker = rec.blocker
    if blocker is None or blocker.kind not in HELD_AS or blocker.id is None:
        return None
    kind = HELD_AS[blocker.kind]
    if join_id("horizon_violation", node, kind, blocker.id) in book:
        return None
    return violation(book, node, kind, blocker.id, blocker.ts, (safe_ts, "safe_ts"), now)


def check_join(book: AlertBook, members: Members, node: str, holds: Iterable[tuple[str, str, int]], safe_ts: int | None,
               now: int) -> list[Output]:
    """A node that joins the round: every open hold of it below safe_ts (``holds``: its (kind, id,
    ts), ``NodeState.open_holds``), lowest first, and its own floor (retention bound or group time)
    if that is its lowest hold, is alerted now; the alerts' messages."""
    rec = members.nodes.get(node)
    if safe_ts is None or rec is None:
        return []
    out = [violation(book, node, kind, hid, ts, (safe_ts, "safe_ts"), now)
           for kind, hid, ts in sorted((h for h in holds if below_sent(h[2], safe_ts)), key=lambda h: (h[2], hold_key(h[0], h[1])))
           if join_id("horizon_violation", node, kind, hid) not in book]
    blocker = rec.blocker
    if blocker is not None and blocker.kind in FLOOR_KINDS:
        out += check_floor(book, node, blocker.floor, (safe_ts, "safe_ts"), now)
    return out


def check_floor(book: AlertBook, node: str, floor: Floor | None, limit: Bound | None, now: int) -> list[Output]:
    """A member's retention bound or group published time below the highest bound it pins
    (``limit``: ``safe_ts``, or once namespaces are in use ``core/tenants.Tenants.pins_all``) is a
    hold below the safe point (a clock or a group that went back): alerted, and cleared once
    it is back at or above; the messages that say so."""
    out: list[Output] = []
    aid = None
    if floor is not None and limit is not None and floor.ts < limit[0]:
        aid = join_id("horizon_violation", node, floor.kind, floor.id or "-")
    prev = book.floor_of(node)
    if prev is not None and prev != aid:
        book.set_floor(node, None)
        cleared = book.clear(prev, now)
        if cleared is not None:
            out.append(cleared)
    if aid is not None and aid not in book:
        assert floor is not None and limit is not None
        out.append(violation(book, node, floor.kind, floor.id or "-", floor.ts, limit, now))
        book.set_floor(node, aid)
    return out


def never_problem(node: str) -> Problem:
    return Problem("missing_node", node, None, None, f"node {node} is in the topology but never reported")


def stale_problem(node: str, last: int, now: int, policy: Policy) -> Problem:
    age = now - last
    return Problem("missing_node", node, age, policy.node_lease_ms,
                   f"node {node} is stale: last event {age} ms ago in cluster time (lease {policy.node_lease_ms} ms)")


def unknown_problem(node: str, why: str) -> Problem:
    return Problem("unknown_node_min", node, None, None, f"minimum of node {node} is unknown: {why}")


def group_problem(node: str, groups: list[str]) -> Problem:
    return Problem("missing_group", node, len(groups), None,
                   f"node {node} does not report required group(s) {', '.join(groups)}")


def awaiting_problem(recovery: Recovery | None, node: str) -> Problem:
    asked = recovery is not None and node in recovery.requested
    gap = recovery.cause.get(node) if recovery is not None else None
    since = ("the job started on empty state" if gap is None else
             f"events of it were lost from the log before the job read them (gap {gap})")
    return Problem(
        "awaiting_snapshot",
        node,
        None,
        None,
        f"node {node} has not sent a snapshot since {since}, so the readers and transactions it opened before "
        "are unknown" + ("; a snapshot_request was sent to it" if asked else "; it has not reported since"),
    )


def leaderless_problem(members: Members, group: str) -> Problem:
    holders = sorted(members.group_members.get(group, ()))
    shown = ", ".join(holders[:5]) + (f" and {len(holders) - 5} more" if len(holders) > 5 else "")
    return Problem("leaderless_group", None, len(holders), None,
                   f"group {group} has no leader (reported by {shown}, none as its leader: a leader hand-over in "
                   "progress), so no current leader's published min tx time stands for it")


def problems(members: Members, recovery: Recovery | None, now: int, policy: Policy) -> dict[str, Problem]:
    """Every reason the current round must abort, by alert id."""
    found: dict[str, Problem] = {}
    awaiting = recovery.awaiting if recovery is not None else ()
    walls = members.walls
    if (not members.aborting() and not awaiting
            and (not walls or walls.lowest() >= now - policy.node_lease_ms)):  # type: ignore[operator]
        return found  # the common case, nothing wrong: what the loops below would find
    for node in members.never:
        found[join_id("missing_node", node)] = never_problem(node)
    for last, node in walls.older_than(now - policy.node_lease_ms):
        found[join_id("missing_node", node)] = stale_problem(node, last, now, policy)
    for node, why in members.unknown.items():
        found[join_id("unknown_node_min", node)] = unknown_problem(node, why)
    for node, groups in members.missing_groups.items():
        found[join_id("missing_group", node)] = group_problem(node, groups)
    for node in awaiting:
        found[join_id("awaiting_snapshot", node)] = awaiting_problem(recovery, node)
    for group in members.leaderless:
        found[join_id("leaderless_group", group)] = leaderless_problem(members, group)
    return found
