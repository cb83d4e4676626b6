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

from typing import TYPE_CHECKING, Any

from safepoint.core.ids import join_id

if TYPE_CHECKING:
    from safepoint.core.node import NodeState
    from safepoint.core.policy import Policy

__all__ = ["check_leaks"]

SUSPECTS_NAMED = 5


def _alert(node: NodeState, state: str, value: int | None, threshold: int | None, since: int, detail: str) -> list[Any]:
    return ["alert", {"id": join_id("leaked_hold", node.node), "kind": "leaked_hold", "state": state,
                      "severity": "warning", "node": node.node, "value": value, "threshold": threshold, "since": since,
                      "detail": detail}]


def check_leaks(node: NodeState, event: dict[str, Any], policy: Policy, signals: list[list[Any]]) -> None:
    """After one applied event of ``node``: start, raise, repeat the request for, or clear a leak."""
    now = node.last_wall_ms
    if event["type"] == "snapshot" or not policy.leak_window_ms:
        if node.leak is not None:
            if node.leak.get("alerted"):
                signals.append(_alert(node, "cleared", None, None, node.leak["since"], "the node's snapshot replaced its holds"))
            node.leak = None
        return
    if event["type"] != "heartbeat" or "active_readers" not in event or "active_txs" not in event:
        return
    extra_r = len(node.readers) - event["active_readers"]
    extra_t = len(node.txs) - event["active_txs"]
    if extra_r <= 0 and extra_t <= 0:
        if node.leak is not None:
            if node.leak.get("alerted"):
                signals.append(_alert(node, "cleared", None, None, node.leak["since"], "the node's counts match again"))
            node.leak = None
        return
    if node.leak is None:
        node.leak = {"since": now}
        return
    waited = now - node.leak["since"]
    if waited < policy.leak_window_ms:
        return
    if not node.leak.get("alerted"):
        suspects = sorted(node.readers.items(), key=lambda kv: (kv[1].opened_wall, kv[0]))[:max(extra_r, 0)]
        tx_suspects = sorted(node.txs.items(), key=lambda kv: (kv[1].opened_wall, kv[0]))[:max(extra_t, 0)]
        named = [f"reader {rid}" for rid, _ in suspects] + [f"tx {tid}" for tid, _ in tx_suspects]
        more = f" and {len(named) - SUSPECTS_NAMED} more" if len(named) > SUSPECTS_NAMED else ""
        signals.append(_alert(
            node, "raised", max(extra_r, 0) + max(extra_t, 0), policy.leak_window_ms, node.leak["since"],
            f"the job holds {len(node.readers)} reader(s) and {len(node.txs)} transaction(s) of node {node.node}, which "
            f"reports {event['active_readers']} and {event['active_txs']} for {waited} ms: suspects (oldest first) "
            f"{', '.join(named[:SUSPECTS_NAMED])}{more}; a snapshot was requested"))
        node.leak["alerted"] = True
    elif now - node.leak.get("requested", now) < policy.leak_window_ms:
        return
    node.leak["requested"] = now
    signals.append(["snapshot_request", {"v": 1, "type": "snapshot_request", "node": node.node, "reason": "leaked_hold"}])
