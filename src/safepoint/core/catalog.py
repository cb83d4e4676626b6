"""A cluster's catalog versions and what holds them back: the catalog floor.

Catalog events say when each catalog version became active; index builds and rebalances that
have started and not finished pin the catalog version they began under. The *catalog floor* for a
safe point is the newest version activated at or before it, held back by those pins, and never
below the floor already sent (versions below it are dropped: nothing needs them again).
"""

from __future__ import annotations

from typing import Any

from safepoint.core.event_records import Catalog as CatalogEvent
from safepoint.core.event_records import IndexBuild, Rebalance

__all__ = ["Catalog"]


class Catalog:
    """Activation times of the catalog versions, the unfinished index builds and rebalances, and
    the floor already sent (``floor``: it only goes forward)."""

    __slots__ = ("activated", "index_builds", "rebalances", "floor", "held")

    def __init__(self) -> None:
        self.activated: dict[int, int] = {}  # catalog version -> activated_at
        self.index_builds: dict[str, int] = {}  # index -> the catalog version it started under
        self.rebalances: dict[str, int] = {}  # group -> the catalog version it started under
        self.floor: int | None = None
        self.held = False
        """Catalog events may have been lost (a gap in the events topic, ``core/gaps.py``): the floor
        stays where it is until an operator acknowledges the gap."""

    def to_stored(self) -> dict[str, Any]:
        """Its fields of the cluster's stored form (``ClusterState.to_json``)."""
        return {"catalogs": [[v, a] for v, a in self.activated.items()], "index_builds": self.index_builds,
                "rebalances": self.rebalances, "catalog_floor": self.floor, **({"catalog_held": True} if self.held else {})}

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> Catalog:
        c = cls()
        c.activated = {v: a for v, a in data["catalogs"]}
        c.index_builds = data["index_builds"]
        c.rebalances = data["rebalances"]
        c.floor = data["catalog_floor"]
        c.held = bool(data.get("catalog_held"))
        return c

    def hold(self, held: bool) -> None:
        """Hold the floor where it is while catalog events may have been lost (``core/gaps.py``), or not."""
        self.held = held

    def advance(self, floor: int | None) -> None:
        """The floor a directive now carries (it only goes forward: ``floor_at``), or a seed's after a
        lost checkpoint."""
        self.floor = floor

    def apply(self, event: CatalogEvent | IndexBuild | Rebalance) -> None:
        """Take a ``catalog``, ``index_build`` or ``rebalance`` event (past its version gate)."""
        if event["type"] == "catalog":
            self.activated[event["catalog_version"]] = event["activated_at"]
        elif event["type"] == "index_build":
            if event["state"] == "started":
                self.index_builds[event["index"]] = event["catalog_version"]
            else:
                self.index_builds.pop(event["index"], None)
        else:
            if event["state"] == "started":
                self.rebalances[event["group"]] = event["catalog_version"]
            else:
                self.rebalances.pop(event["group"], None)

    def floor_at(self, safe: int) -> int | None:
        """The catalog floor for ``safe`` (drops the versions below it); the floor sent while ``held``."""
        if self.held:
            return self.floor
        eligible = [v for v, at in self.activated.items() if at <= safe]
        if not eligible:
            return self.floor
        candidate = max(eligible)
        pins = list(self.index_builds.values()) + list(self.rebalances.values())
        if pins:
            candidate = min(candidate, min(pins))
        if self.floor is not None and candidate < self.floor:
            return self.floor
        for v in [v for v in self.activated if v < candidate]:
            del self.activated[v]  # dropped versions are never needed again
        return candidate
