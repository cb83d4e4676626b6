"""The processes that speak for one node id: a newer incarnation does not prove the older one dead.

A node process restarts with a higher ``incarnation``. Most often the old process is gone and its
readers and unprepared transactions died with it; but a copied configuration or a zombie whose
replacement started gives two live processes under one node id, and the old one's readers are
still open. So the job keeps the older incarnation's holds until it has been silent for
``incarnation_grace_ms`` of log time after the newer one appeared (a real restart still frees
them within a few heartbeats), and an older incarnation that speaks after the newer one appeared
(a new ``seq`` of its own, sent after it: a ``wall_ms`` later than the newer one's first event) is a
second live process (a message sent before, only delivered late, is applied as the old process's
last word, no more): ``duplicate_node`` (critical) names the
node and both incarnations, the holds of every incarnation count (the node's minimum is the
lowest of them), and an incarnation silent for ``node_lease_ms`` loses its holds as after a
restart (prepared transactions excepted: they wait for their decision). One that speaks again
after its holds were dropped is asked for a snapshot (its holds are unknown).

``Incarnations`` is the node's part that keeps the incarnations besides the newest (``lives``:
incarnation -> [last seq, log time of its last sign of life, twin: it spoke after a newer one
appeared]) and the last seq of those it dropped (``gone``, the newest few), to tell a repeated
message from a process that speaks again. ``NodeState`` keys the holds of an incarnation other
than the newest ``"<id>@<incarnation>"`` so that two processes' ids never collide.
"""

from __future__ import annotations

from typing import Any

from safepoint.core.ids import join_id
from safepoint.core.policy import Policy
from safepoint.core.signals import AlertChange, alert_change

__all__ = ["GONE_KEPT", "Incarnations", "LATE", "TWIN", "alt_key", "own_id"]

GONE_KEPT = 4
"""Dropped incarnations whose last seq is kept (older ones: their messages are stale)."""
TWIN = "twin"
"""``Incarnations.order``'s verdict for a message of a live older incarnation: apply it as that process's."""
LATE = "late"
"""``Incarnations.order``'s verdict for a message the older process sent before the newer one started,
delivered late: apply it as that process's, but it is no sign of a second live process."""


def alt_key(hid: str, incarnation: int) -> str:
    """The key of a hold of an incarnation other than the newest."""
    return f"{hid}@{incarnation}"


def own_id(key: str, incarnation: int) -> str | None:
    """The hold's own id when ``key`` is its ``alt_key`` for ``incarnation`` (None: it is not)."""
    suffix = f"@{incarnation}"
    return key[: -len(suffix)] if key.endswith(suffix) else None


class Incarnations:
    """A node's incarnations besides the newest. Stored as ``[lives, gone, raised]``, with
    ``lost_above`` after them where it is set (absent: one process, and no event lost)."""

    __slots__ = ("node", "lives", "gone", "raised", "lost_above")

    def __init__(self, node: str, stored: list[Any] | None = None) -> None:
        self.node = node
        self.lives: dict[int, list[Any]] = {}
        """incarnation -> [last seq, log time of its last sign of life, 1 if it spoke after a newer one
        appeared (for the newest: if an older one speaks), the wall_ms of the newer one's first event
        (None: not known)]."""
        self.gone: dict[int, list[Any]] = {}
        """incarnation -> [its last seq, the wall_ms of the newer one's first event], of the newest few
        whose holds were dropped."""
        self.raised = False
        """``duplicate_node`` is raised."""
        self.lost_above: int | None = None
        """The node's events may have been lost (a gap, a start on empty state) while this was its
        newest incarnation (the lowest such): an older incarnation above it that the job never heard
        from may have spoken in them, so when it speaks it is a second live process, not stale."""
        if stored:
            self.lives = {int(k): [*v, None][:4] for k, v in (stored[0] or {}).items()}
            self.gone = {int(k): list(v) for k, v in (stored[1] or {}).items()}
            self.raised = bool(stored[2]) if len(stored) > 2 else False
            self.lost_above = stored[3] if len(stored) > 3 else None

    def __bool__(self) -> bool:
        return bool(self.lives)

    def to_stored(self) -> list[Any] | None:
        if not self.lives and not self.gone and self.lost_above is None:
            return None
        stored = [self.lives or None, self.gone or None, 1 if self.raised else 0]
        if self.lost_above is not None:
            stored.append(self.lost_above)
        return stored

    def lost_since(self, newest: int) -> None:
        """The node's events may have been lost while ``newest`` was its newest incarnation
        (``lost_above``; -1: before the job knew any)."""
        if self.lost_above is None or newest < self.lost_above:
            self.lost_above = newest

    def order(self, incarnation: int, seq: int, wall: int) -> str:
        """For a message of an incarnation below the newest: why it is ignored (``stale_incarnation``,
        ``duplicate``, ``older_seq``), ``LATE`` when the process sent it before the newer one started
        (``wall``: its ``wall_ms``; not known: ``supersede``), or ``TWIN`` when it is that live process's
        next message, or the first the job read of one never heard from above ``lost_above`` (it may
        have spoken in events that were lost; ``speak`` asks it to restate)."""
        live = self.lives.get(incarnation)
        entry = [live[0], live[3]] if live is not None else self.gone.get(incarnation)
        if entry is None:  # never heard from: stale, unless it may have spoken in events that were lost
            lost = self.lost_above
            return TWIN if lost is not None and incarnation > lost else "stale_incarnation"
        last, since = entry
        if seq == last:
            return "duplicate"
        if seq < last:
            return "older_seq"
        if since is not None and wall <= since:
            if live is None:
                return "stale_incarnation"  # its holds are gone already: a late word changes nothing
            live[0] = seq
            return LATE
        return TWIN

    def supersede(self, incarnation: int, seq: int, log: int, wall: int | None) -> None:
        """The newest incarnation ``incarnation`` (its last ``seq``) was just superseded at log time
        ``log`` by an event sent at ``wall``: its silence is measured from then. ``wall`` None: when
        the newer one started is not known (its first events may have been lost), so the older one
        may have spoken after it: it is taken as a second live process (its holds kept for a lease,
        every later message its own, none late)."""
        self.lives[incarnation] = [seq, log, 0 if wall is not None else 1, wall]

    def still(self, incarnation: int) -> bool:
        """An event of ``incarnation`` (the newest) settles nothing here: no other process lives, and
        its own holds did not go with a silence (it would be a second live process speaking again).
        The node's identity step reads it (no shortcut otherwise), and so does its shortcut."""
        return not self.lives and incarnation not in self.gone

    def dropped(self, incarnation: int) -> bool:
        """The incarnation's holds were dropped (and it has not spoken since)."""
        return incarnation in self.gone and incarnation not in self.lives

    def speak(self, incarnation: int, seq: int, log: int, newest: int, newest_seq: int) -> tuple[bool, bool]:
        """A message that is not simply the one process's next: an older incarnation's, or the newest's
        after its holds were dropped. Returns (``duplicate_node`` is to be raised now, its holds had been
        dropped: it must restate them)."""
        live = self.lives.get(incarnation)
        was_dropped = live is None
        if live is None:
            gone = self.gone.pop(incarnation, None)
            self.lives[incarnation] = [seq, log, 1, None if gone is None else gone[1]]
        else:
            live[0] = seq
            live[1] = max(live[1], log)
            live[2] = 1
        if incarnation != newest and newest not in self.lives and newest not in self.gone:
            self.lives[newest] = [newest_seq, log, 1, None]  # the newest's silence is measured from now on
        raise_now = not self.raised and len(self.live(newest)) > 1
        self.raised = self.raised or raise_now
        return raise_now, was_dropped

    def heard(self, incarnation: int, seq: int, log: int) -> None:
        """A message of the newest incarnation while others live."""
        live = self.lives.get(incarnation)
        if live is not None:
            live[0] = seq
            if log > live[1]:
                live[1] = log

    def due(self, log: int, policy: Policy, newest: int) -> list[int]:
        """The incarnations whose holds go at log time ``log``: silent ``incarnation_grace_ms`` after
        being superseded, or ``node_lease_ms`` as a second live process (the newest too, when an older
        one speaks); and beyond the ``GONE_KEPT`` newest others, the oldest."""
        out = []
        for inc, (_seq, last, twin, _since) in sorted(self.lives.items()):
            if inc == newest and not twin:
                continue
            if log - last >= (policy.node_lease_ms if twin else policy.incarnation_grace_ms):
                out.append(inc)
        alive = sorted(k for k in self.lives if k != newest and k not in out)
        out += alive[:max(0, len(alive) - GONE_KEPT)]
        return sorted(set(out))

    def drop(self, incarnation: int) -> None:
        live = self.lives.pop(incarnation, None)
        if live is not None:
            self.gone[incarnation] = [live[0], live[3]]
            for old in sorted(self.gone)[:max(0, len(self.gone) - GONE_KEPT)]:
                del self.gone[old]

    def live(self, newest: int) -> list[int]:
        """Every incarnation that still speaks for the node."""
        return sorted(set(self.lives) | ({newest} if not self.dropped(newest) else set()))

    def settle(self, newest: int, log: int, policy: Policy) -> AlertChange | None:
        """After drops: clear ``duplicate_node`` once one process is left (the clearing), and forget the
        newest's own entry once no other incarnation lives."""
        cleared = None
        if self.raised and len(self.live(newest)) <= 1:
            self.raised = False
            cleared = self.alert("cleared", newest, log, policy)
        if set(self.lives) <= {newest}:
            self.lives.clear()
        return cleared

    def alert(self, state: str, newest: int, log: int, policy: Policy) -> AlertChange:
        live = self.live(newest)
        if state == "raised":
            detail = (f"node {self.node} is spoken for by {len(live)} live processes (incarnations "
                      f"{', '.join(map(str, live))}): a copied configuration, or a process that outlived its "
                      f"replacement; the holds of each count until it is silent for {policy.node_lease_ms} ms "
                      "(node_lease_ms); give each process its own node id")
        else:
            detail = f"node {self.node} is spoken for by one process again (incarnation {', '.join(map(str, live)) or '-'})"
        older = [i for i in live if i != newest]
        return alert_change(self.node, "duplicate_node", join_id("duplicate_node", self.node), state, "critical",
                            min(older) if older else None, newest, log, detail)
