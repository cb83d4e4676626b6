"""The round's abort alerts kept in step with the cluster after every event, in time independent of its size.

``problems`` lists every reason the round must abort and ``sync_abort_alerts`` raises what is new
and clears what is gone: both walk every member, so running them after each event made a cluster
with many problems (10,000 nodes named by a topology before they report, each event removing
one) cost O(members) per event, O(members^2) until the last node reported (measured: 2.3 ms per
event at 10,000 nodes against 35 us at 1,000).

Only the members touched since the last sync can have a different problem, besides those whose
lease ran out or came back (the stale set, kept as of the last sync). ``sync_aborts`` looks at
those alone and emits exactly what the full walk would: the clears in the order they were raised,
then the new ones by id. After a restore, a topology, a recovery start (anything that runs
``Members.rebuild``) it does the full walk once; so a log whose every state is read back before
each message walks every member every time, and must give the same outputs
(``tests/unit/test_properties.py``).
"""

from __future__ import annotations

from safepoint.core.alerts import (
    ABORT_KINDS,
    AlertBook,
    Problem,
    awaiting_problem,
    group_problem,
    leaderless_problem,
    never_problem,
    problems,
    raise_new,
    stale_problem,
    sync_abort_alerts,
    unknown_problem,
)
from safepoint.core.ids import join_id
from safepoint.core.members import Members
from safepoint.core.outputs import Output
from safepoint.core.policy import Policy
from safepoint.core.recovery import Recovery

__all__ = ["AbortSync", "sync_aborts"]


class AbortSync:
    """What the last sync saw: not serialised (a restored state starts with a full walk)."""

    __slots__ = ("full", "touched", "stale", "ids", "leaderless")

    def __init__(self) -> None:
        self.full = True
        """The next sync walks every member."""
        self.touched: set[str] = set()
        """Members whose record, recovery or never-reported mark changed since the last sync."""
        self.stale: set[str] = set()
        """Members stale at the last sync."""
        self.ids: dict[str, tuple[str, ...]] = {}
        """Each node's abort alert ids, one per kind (made once: ids are pure functions of the name)."""
        self.leaderless: set[str] = set()
        """Groups without a leader's published time at the last sync."""

    def ids_of(self, node: str) -> tuple[str, ...]:
        ids = self.ids.get(node)
        if ids is None:
            ids = self.ids[node] = tuple(join_id(kind, node) for kind in ABORT_KINDS)
        return ids


def _stale_now(members: Members, limit: int) -> dict[str, int]:
    low = members.walls.lowest()
    if low is None or low >= limit:
        return {}
    return {node: last for last, node in members.walls.older_than(limit)}


def _node_problems(members: Members, recovery: Recovery | None, node: str, stale: dict[str, int], now: int,
                   policy: Policy) -> dict[str, Problem]:
    """``problems`` restricted to one node (the same ids and bodies)."""
    found: dict[str, Problem] = {}
    if node in members.never:
        found[join_id("missing_node", node)] = never_problem(node)
    if node in stale:
        found[join_id("missing_node", node)] = stale_problem(node, stale[node], now, policy)
    why = members.unknown.get(node)
    if why is not None:
        found[join_id("unknown_node_min", node)] = unknown_problem(node, why)
    groups = members.missing_groups.get(node)
    if groups is not None:
        found[join_id("missing_group", node)] = group_problem(node, groups)
    if recovery is not None and node in recovery.awaiting:
        found[join_id("awaiting_snapshot", node)] = awaiting_problem(recovery, node)
    return found


def sync_aborts(sync: AbortSync, members: Members, recovery: Recovery | None, book: AlertBook, now: int,
                policy: Policy) -> tuple[bool, list[Output]]:
    """Bring the book's abort alerts in step with the problems now: (the round aborts, the alerts'
    messages)."""
    stale = _stale_now(members, now - policy.node_lease_ms)
    leaderless = members.leaderless
    aborted = bool(members.aborting() or (recovery is not None and recovery.awaiting) or stale)
    if sync.full:
        said = sync_abort_alerts(book, problems(members, recovery, now, policy), now)
        sync.full = False
        sync.touched = set()
        sync.stale = set(stale)
        sync.leaderless = set(leaderless)
        return aborted, said
    look = sync.touched
    if stale or sync.stale:
        look = look | (sync.stale ^ stale.keys())
    groups = sync.leaderless ^ leaderless if (sync.leaderless or leaderless) else set()
    sync.touched = set()
    sync.stale = set(stale)
    sync.leaderless = set(leaderless)
    if not look and not groups:
        return aborted, []
    found: dict[str, Problem] = {}
    for node in look:
        found.update(_node_problems(members, recovery, node, stale, now, policy))
    for group in groups & leaderless:
        found[join_id("leaderless_group", group)] = leaderless_problem(members, group)
    raised = book.raised
    gone = [aid for node in look for aid in sync.ids_of(node) if aid in raised and aid not in found]
    gone += [aid for group in groups - leaderless if (aid := join_id("leaderless_group", group)) in raised]
    if len(gone) > 1:
        order = {aid: i for i, aid in enumerate(raised)}
        gone.sort(key=order.__getitem__)
    out = book.clear_each(gone, now)
    if found:
        out += raise_new(book, found, now)
    return aborted, out
