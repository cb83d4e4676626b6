"""A node's heartbeats: its clock and figures, every interval, from a thread of its reporter.

A heartbeat carries ``mvcc_now`` and the figures the node's ``figures()`` callable returns
(``pinned_bytes``, ``debt_bytes``, ``groups``, ``history_above``: the node's history curve, as
``(ts, bytes)`` pairs or ``{"ts", "bytes"}`` objects, from which the job tells what each hold
costs; ``compacted_ts``: what the store itself has compacted, as an etcd agent says), and lets the reporter publish a repair snapshot
first when a delivery failed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from safepoint.errors import ClientClosed

if TYPE_CHECKING:
    from safepoint.connectors.reporter import Reporter

__all__ = ["FIGURE_KEYS", "Figures", "start_heartbeats"]

log = logging.getLogger("safepoint.reporter")

FIGURE_KEYS = ("groups", "pinned_bytes", "debt_bytes", "active_readers", "active_txs", "history_above", "compacted_ts",
               "wraparound_left", "purged_ts", "history_length")
MAX_HISTORY_POINTS = 64
"""Points of ``history_above`` a heartbeat carries (the contract's limit): more are thinned evenly."""


def history_points(raw: Any) -> list[dict[str, int]]:
    """``history_above`` as the contract writes it: ``{"ts", "bytes"}`` objects, at most 64 (a longer
    curve keeps its first and last points and evenly spaced ones between)."""
    points = [{"ts": int(p["ts"]), "bytes": int(p["bytes"])} if isinstance(p, Mapping)
              else {"ts": int(p[0]), "bytes": int(p[1])} for p in raw]
    if len(points) > MAX_HISTORY_POINTS:
        step = (len(points) - 1) / (MAX_HISTORY_POINTS - 1)
        points = [points[round(i * step)] for i in range(MAX_HISTORY_POINTS)]
    return points


class Figures:
    """The node's ``figures()`` callable, read for each heartbeat: unknown keys are dropped (with one
    warning per key) and None values left out."""

    def __init__(self, figures: Callable[[], Mapping[str, Any]] | None, node: str) -> None:
        self.figures = figures
        self.node = node
        self.warned: set[str] = set()

    def read(self) -> dict[str, Any]:
        if self.figures is None:
            return {}
        raw = self.figures()
        figures = {k: raw[k] for k in FIGURE_KEYS if k in raw and raw[k] is not None}
        if "history_above" in figures:
            figures["history_above"] = history_points(figures["history_above"])
        unknown = set(raw) - set(FIGURE_KEYS) - self.warned
        if unknown:
            self.warned |= unknown
            log.warning("reporter %s: figures() returned unknown keys %s; they are not published", self.node, unknown)
        return figures


def start_heartbeats(reporter: Reporter, interval_s: float, stop: threading.Event) -> threading.Thread:
    """A daemon thread that calls ``reporter.heartbeat()`` every ``interval_s`` until ``stop`` is set
    or the reporter is closed; a failed heartbeat is logged and retried at the next interval."""

    def loop() -> None:
        while not stop.is_set():
            try:
                reporter.heartbeat()
            except ClientClosed:
                return
            except Exception:
                log.exception("reporter %s: heartbeat failed; retrying in %.1f s", reporter.node, interval_s)
            stop.wait(interval_s)

    thread = threading.Thread(target=loop, name=f"safepoint-heartbeat-{reporter.node}", daemon=True)
    thread.start()
    return thread
