"""What a hold costs: the bytes of history it alone keeps, from the node's history curve.

A heartbeat may carry ``history_above``: a few points ``{ts, bytes}``, each the bytes of MVCC
history on the node that only a read below ``ts`` needs (versions superseded after ``ts``). The
node stage keeps the latest curve (``History``). Between two points the curve is read as a
straight line, above the last point it falls to 0 at the node's ``mvcc_now``, below the first it
stays at the first point's bytes (what the node measured, never a guess above it).

A hold at ``ts`` keeps the history above ``ts``, and so does every hold older than it. The bytes
a hold **alone** keeps are its layer: from its own ``ts`` up to the next younger bound of its node,
that is the next hold's ``ts``, or the node's floor (its retention bound and its groups' published
times: history above the floor is kept anyway). That is what closing it frees once the holds older
than it are gone; for the node's lowest hold, what closing it frees on its node now. Holds at one
``ts`` share their layer evenly. Holds at or above the floor cost 0. The layers add up to the
history the node's holds keep beyond its floor, so ranking holds by cost shows where the bytes are.
Costs are counted on the hold's own node. A node that sends no curve has no costs (unknown).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["History", "layer_costs"]

MAX_POINTS = 64
"""Points a heartbeat's ``history_above`` may carry (the schema's ``maxItems``)."""


class History:
    """A node's history curve: points (ts, bytes above ts), ts rising, bytes never rising."""

    __slots__ = ("points",)

    def __init__(self, points: list[list[int]]) -> None:
        self.points = points

    @classmethod
    def of(cls, raw: Iterable[Mapping[str, Any]]) -> History:
        """The curve of a heartbeat's ``history_above``: read in ts order (a ts listed twice keeps its
        lower bytes), and where bytes rise with ts it is read as its running minimum (a younger
        version set cannot outweigh an older one that contains it)."""
        by_ts: dict[int, int] = {}
        for p in raw:
            ts, size = p["ts"], p["bytes"]
            by_ts[ts] = min(size, by_ts.get(ts, size))
        points: list[list[int]] = []
        low: int | None = None
        for ts in sorted(by_ts):
            low = by_ts[ts] if low is None else min(low, by_ts[ts])
            points.append([ts, low])
        return cls(points)

    def to_json(self) -> list[list[int]]:
        return self.points

    def above(self, ts: int, mvcc_now: int | None) -> int:
        """The bytes of history above ``ts`` on the curve."""
        pts = self.points
        if not pts:
            return 0
        if ts <= pts[0][0]:
            return pts[0][1]
        for (t0, b0), (t1, b1) in zip(pts, pts[1:], strict=False):
            if ts <= t1:
                return b1 + (b0 - b1) * (t1 - ts) // (t1 - t0)
        last_ts, last_b = pts[-1]
        if mvcc_now is None or mvcc_now <= last_ts:
            return last_b
        if ts >= mvcc_now:
            return 0
        return last_b * (mvcc_now - ts) // (mvcc_now - last_ts)


def layer_costs(holds: Iterable[tuple[int, Any]], floor: int | None, history: History, mvcc_now: int | None) -> dict[Any, int]:
    """Each hold's layer (``holds``: (ts, key) pairs; ``floor``: the node's lowest own bound, None
    when unknown, then the layers reach up to ``mvcc_now``). Holds at one ts share their layer
    evenly (rounded down); holds at or above the floor cost 0."""
    top = floor if floor is not None else mvcc_now
    below: list[tuple[int, Any]] = []
    costs: dict[Any, int] = {}
    for ts, key in holds:
        if top is None or ts < top:
            below.append((ts, key))
        else:
            costs[key] = 0
    below.sort(key=lambda x: x[0])
    i = 0
    while i < len(below):
        ts = below[i][0]
        j = i
        while j < len(below) and below[j][0] == ts:
            j += 1
        upper = below[j][0] if j < len(below) else top
        layer = history.above(ts, mvcc_now) - (history.above(upper, mvcc_now) if upper is not None else 0)
        share = max(layer, 0) // (j - i)
        for k in range(i, j):
            costs[below[k][1]] = share
        i = j
    return costs
