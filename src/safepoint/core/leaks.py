"""Leaked holds: readers and transactions the job holds for a node that the node no longer has.

A lost ``reader_close`` (a bug in the node's integration, a message lost before the fix of a
producer) would pin history until the node restarts. Heartbeats count the node's open readers and
transactions (``active_readers``, ``active_txs``). When the job holds more of either than the node
reports, for ``leak_window_ms`` of the node's clock, the node stage raises ``leaked_hold`` naming
the oldest suspects and asks the node for a snapshot (a ``snapshot_request`` directive, reason
``leaked_hold``, again every window while it lasts). The snapshot replaces the node's set, which
clears the alert. Holding fewer than the node reports is normal (lazy registration publishes only
the holds that can matter), and a node that does not send the counts is never judged.
"""

from __future__ import annotations

from typing import Any

from safepoint.core.event_records import NodeEvent
from safepoint.core.holds import KINDS, HoldSet
from safepoint.core.ids import join_id
from safepoint.core.policy import Policy
from safepoint.core.signals import AlertChange, Signal, SnapshotAsk, alert_change

__all__ = ["LeakWatch"]

SUSPECTS_NAMED = 5


class LeakWatch:
    """A node's leak state: since when (node time) the job holds more than the node reports, whether
    that was alerted, and when a snapshot was last requested. Stored as ``{"since", "alerted",
    "requested"}`` (absent: no leak)."""

    __slots__ = ("node", "state")

    def __init__(self, node: str, state: dict[str, Any] | None = None) -> None:
        self.node = node
        self.state = state

    def __bool__(self) -> bool:
        return self.state is not None

    def _alert(self, state: str, value: int | None, threshold: int | None, since: int, detail: str) -> AlertChange:
        return alert_change(self.node, "leaked_hold", join_id("leaked_hold", self.node), state, "warning", value,
                            threshold, since, detail)

    def _end(self, why: str) -> list[Signal]:
        leak = self.state
        self.state = None
        if leak is not None and leak.get("alerted"):
            return [self._alert("cleared", None, None, leak["since"], why)]
        return []

    def still(self, kind: str, policy: Policy) -> bool:
        """``check`` after an event of type ``kind`` would say and change nothing: it is no snapshot and
        no heartbeat (only those are counted), and no leak is under way that a window of 0 would end.
        The node runs ``check`` only when this is false, and its shortcut asks it."""
        return kind != "snapshot" and kind != "heartbeat" and (self.state is None or bool(policy.leak_window_ms))

    def check(self, held: HoldSet, event: NodeEvent, now: int, policy: Policy) -> list[Signal]:
        """After one applied event of the node (at its time ``now``; ``held``: the holds of the process
        that sent it): start, raise, repeat the request for, or clear a leak; what it says."""
        if event["type"] == "snapshot" or not policy.leak_window_ms:
            return self._end("the node's snapshot replaced its holds")
        counts = [k.count_in(event) for k in KINDS]
        if event["type"] != "heartbeat" or None in counts:
            return []
        extra = [len(held.of(k.name)) - (n or 0) for k, n in zip(KINDS, counts, strict=True)]
        if all(n <= 0 for n in extra):
            return self._end("the node's counts match again")
        leak = self.state
        if leak is None:
            self.state = {"since": now}
            return []
        waited = now - leak["since"]
        if waited < policy.leak_window_ms:
            return []
        signals: list[Signal] = []
        if not leak.get("alerted"):
            named = [f"{k.noun} {hid}" for k, n in zip(KINDS, extra, strict=True)
                     for hid, _ in sorted(held.of(k.name).items(), key=lambda kv: (kv[1].opened_wall, kv[0]))[:max(n, 0)]]
            more = f" and {len(named) - SUSPECTS_NAMED} more" if len(named) > SUSPECTS_NAMED else ""
            holds = " and ".join(f"{len(held.of(k.name))} {k.plural}" for k in KINDS)
            said = " and ".join(str(n) for n in counts)
            signals.append(self._alert(
                "raised", sum(max(n, 0) for n in extra), policy.leak_window_ms, leak["since"],
                f"the job holds {holds} of node {self.node}, which reports {said} for {waited} ms: suspects "
                f"(oldest first) {', '.join(named[:SUSPECTS_NAMED])}{more}; a snapshot was requested"))
            leak["alerted"] = True
        elif now - leak.get("requested", now) < policy.leak_window_ms:
            return signals
        leak["requested"] = now
        signals.append(SnapshotAsk("leaked_hold"))
        return signals
