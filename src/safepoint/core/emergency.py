"""Emergency mode: a cluster whose history keeps piling up although a node is already critical.

A node in the critical pinned-bytes band whose ``debt_bytes`` still grow (the growth rate fitted
over ``forecast_window_ms``, ``core/pressure.py``) is not being helped by what the cluster does
so far. The node stage says when that starts and stops (a ``debt`` signal); the cluster enters
**emergency** at once when one member is so, and leaves it, with hysteresis, once none has been
for ``emergency_exit_ms`` of cluster time. While in emergency:

* an ``emergency`` alert (critical) is raised, naming the nodes, and cleared on leaving;
* every compaction directive carries ``emergency``: ``since_wall_ms`` and ``compaction_budget``,
  the ceiling (a multiple of a node's normal compaction budget, ``emergency_compaction_budget``)
  up to which nodes should raise their compaction effort; a directive goes out at once when it
  starts or ends;
* the node client tightens admission: long snapshots are refused in the warning band too
  (``connectors/admission.py``).

``Emergency`` is the cluster's part that keeps it.
"""

from __future__ import annotations

from typing import Any

from safepoint.core.alerts import AlertBook
from safepoint.core.outputs import Output
from safepoint.core.policy import Policy

__all__ = ["EMERGENCY_ID", "Emergency"]

EMERGENCY_ID = "emergency/-"


class Emergency:
    """The nodes in the critical band with growing debt, and the cluster's emergency state."""

    __slots__ = ("nodes", "since", "calm_since")

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        """node -> its debt growth (bytes/s) when it said so."""
        self.since: int | None = None
        """Cluster time the emergency began (None: not in emergency)."""
        self.calm_since: int | None = None
        """In emergency with no node so: since when (the exit hysteresis runs from it)."""

    def __bool__(self) -> bool:
        return bool(self.nodes) or self.since is not None

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "since": self.since, "calm_since": self.calm_since}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Emergency:
        e = cls()
        if data:
            e.nodes = dict(data.get("nodes") or {})
            e.since = data.get("since")
            e.calm_since = data.get("calm_since")
        return e

    def take(self, node: str, growing: bool, rate: int) -> None:
        """A node's ``debt`` signal: in the critical band with debt growing, or no longer."""
        if growing:
            self.nodes[node] = rate
        else:
            self.nodes.pop(node, None)

    def step(self, now: int, policy: Policy, book: AlertBook) -> tuple[bool, list[Output]]:
        """Enter or leave emergency at cluster time ``now``: (it changed: a directive must say so, the
        alert's message)."""
        if self.nodes:
            self.calm_since = None
            if self.since is not None:
                return False, []
            self.since = now
            named = ", ".join(f"{n} (+{r} bytes/s)" for n, r in sorted(self.nodes.items())[:5])
            more = f" and {len(self.nodes) - 5} more" if len(self.nodes) > 5 else ""
            return True, [book.raise_({
                "id": EMERGENCY_ID, "kind": "emergency", "node": None, "severity": "critical", "value": len(self.nodes),
                "threshold": None, "since": now,
                "detail": f"emergency: in the critical pinned-bytes band with debt still growing: {named}{more}; "
                          f"nodes may raise their compaction budget up to {policy.emergency_compaction_budget}x and "
                          "long snapshots are refused in the warning band too"}, now)]
        if self.since is None:
            return False, []
        if self.calm_since is None:
            self.calm_since = now
        if now - self.calm_since < policy.emergency_exit_ms:
            return False, []
        calm = self.calm_since
        self.since = self.calm_since = None
        cleared = book.clear(EMERGENCY_ID, now, value=0, detail=(
            f"emergency over: no node has been in the critical band with growing debt for {now - calm} ms of "
            f"cluster time (emergency_exit_ms {policy.emergency_exit_ms})"))
        return True, [] if cleared is None else [cleared]

    def directive_fields(self, policy: Policy) -> dict[str, Any]:
        """``emergency`` for a compaction directive while in emergency."""
        if self.since is None:
            return {}
        return {"emergency": {"since_wall_ms": self.since, "compaction_budget": policy.emergency_compaction_budget}}
