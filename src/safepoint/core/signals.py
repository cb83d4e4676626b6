"""What a node's rules tell its cluster: one typed record per kind of signal.

The node stage decides on the node's own clock (bands, forecasts, forced expiry, a leak, a skewed
clock, a second live process) and hands the cluster a ``NodeUpdate`` whose ``signals`` are these
records; the cluster stamps them with its identity and time and turns them into alerts and
directives (``ClusterState.apply_node_update``). A new kind of signal is a record here and a
branch there: nothing is keyed by a string.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

from safepoint.core.alert_kinds import AlertKind, Severity

__all__ = ["AlertBody", "AlertChange", "BandChange", "Compacted", "DebtReport", "ExpireOrder", "Signal", "SnapshotAsk", "alert_change"]


class AlertBody(TypedDict):
    """An alert as the ``AlertBook`` keeps it (``core/alerts.py``), before the cluster stamps its
    message: its kind and severity are the alert schema's (``core/alert_kinds.py``)."""

    id: str
    """Its id within the cluster (``kind/...``, ``core/ids.py``)."""
    kind: AlertKind
    severity: Severity
    node: str | None
    value: int | None
    threshold: int | None
    since: int
    """When it began (the node's or the cluster's time)."""
    detail: str


class AlertChange(NamedTuple):
    """An alert of the node raised or cleared: its body as the ``AlertBook`` keeps it."""

    body: AlertBody
    state: str
    """``raised`` or ``cleared``."""


class ExpireOrder(NamedTuple):
    """A forced expiry of one of the node's readers or transactions: the ``expire`` directive's body."""

    body: dict[str, Any]


class SnapshotAsk(NamedTuple):
    """The node must restate its holds (a ``snapshot_request`` directive)."""

    reason: str


class BandChange(NamedTuple):
    """The node's pinned-bytes band changed: its client admits long snapshots by it (a ``band`` directive)."""

    band: str


class DebtReport(NamedTuple):
    """Whether the node's compaction debt keeps growing, for the cluster's emergency (``core/emergency.py``)."""

    growing: bool
    rate: int
    """Bytes per second."""


class Compacted(NamedTuple):
    """What the store itself has compacted (a heartbeat's ``compacted_ts``)."""

    ts: int


Signal = AlertChange | ExpireOrder | SnapshotAsk | BandChange | DebtReport | Compacted


def alert_change(node: str, kind: AlertKind, aid: str, state: str, severity: Severity, value: int | None,
                 threshold: int | None, since: int, detail: str) -> AlertChange:
    """An ``AlertChange`` of ``node``'s alert ``aid``."""
    return AlertChange({"id": aid, "kind": kind, "severity": severity, "node": node, "value": value,
                        "threshold": threshold, "since": since, "detail": detail}, state)
