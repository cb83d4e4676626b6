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

from safepoint.core.ids import join_id
from safepoint.core.policy import Policy
from safepoint.core.records import Hold
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

    def _end(self, why: str, signals: list[Signal]) -> None:
        leak = self.state
        if leak is not None:
            if leak.get("alerted"):
                signals.append(self._alert("cleared", None, None, leak["since"], why))
            self.state = None

    def check(self, readers: dict[str, Hold], txs: dict[str, Hold], event: dict[str, Any], now: int, policy: Policy,
              signals: list[Signal]) -> None:
        """After one applied event of the node (at its time ``now``): start, raise, repeat the
        request for, or clear a leak."""
        if event["type"] == "snapshot" or not policy.leak_window_ms:
            self._end("the node's snapshot replaced its holds", signals)
            return
        if event["type"] != "heartbeat" or "active_readers" not in event or "active_txs" not in event:
            return
        extra_r = len(readers) - event["active_readers"]
        extra_t = len(txs) - event["active_txs"]
        if extra_r <= 0 and extra_t <= 0:
            self._end("the node's counts match again", signals)
            return
        leak = self.state
        if leak is None:
            self.state = {"since": now}
            return
        waited = now - leak["since"]
        if waited < policy.leak_window_ms:
            return
        if not leak.get("alerted"):
            suspects = sorted(readers.items(), key=lambda kv: (kv[1].opened_wall, kv[0]))[:max(extra_r, 0)]
            tx_suspects = sorted(txs.items(), key=lambda kv: (kv[1].opened_wall, kv[0]))[:max(extra_t, 0)]
            named = [f"reader {rid}" for rid, _ in suspects] + [f"tx {tid}" for tid, _ in tx_suspects]
            more = f" and {len(named) - SUSPECTS_NAMED} more" if len(named) > SUSPECTS_NAMED else ""
            signals.append(self._alert(
                "raised", max(extra_r, 0) + max(extra_t, 0), policy.leak_window_ms, leak["since"],
                f"the job holds {len(readers)} reader(s) and {len(txs)} transaction(s) of node {self.node}, which "
                f"reports {event['active_readers']} and {event['active_txs']} for {waited} ms: suspects (oldest "
                f"first) {', '.join(named[:SUSPECTS_NAMED])}{more}; a snapshot was requested"))
            leak["alerted"] = True
        elif now - leak.get("requested", now) < policy.leak_window_ms:
            return
        leak["requested"] = now
        signals.append(SnapshotAsk("leaked_hold"))
