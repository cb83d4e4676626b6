"""Each member's newest event time, with the lowest at hand: the lease check after every event.

A member whose newest event's log time (``core/clock.py``) is more than ``node_lease_ms`` of cluster time behind is stale
and aborts the round. The check runs after every applied event, and every event moves one
member's time, so ``LastWalls`` keeps a heap whose entries may lag: a later time only updates the
member's time, and its entry in the heap (a lower bound) moves up when it reaches the top; an
earlier time is pushed, and the entry above it is dropped when it reaches the top (or when the heap
has grown to twice the members).
"""

from __future__ import annotations

import heapq

__all__ = ["LastWalls"]


class LastWalls:
    """member -> its newest event's log time; ``lowest()`` and ``older_than(limit)`` in (wall, node) order."""

    __slots__ = ("_last", "_heap")

    def __init__(self, last: dict[str, int] | None = None) -> None:
        self._last: dict[str, int] = dict(last) if last else {}
        self._heap: list[tuple[int, str]] = [(w, n) for n, w in self._last.items()]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._last)

    def set(self, node: str, wall: int) -> None:
        old = self._last.get(node)
        if old == wall:
            return
        self._last[node] = wall
        if old is not None and wall > old:
            return  # its entry in the heap is older: moved up when it reaches the top (``lowest``)
        heapq.heappush(self._heap, (wall, node))
        if len(self._heap) > 2 * len(self._last) + 64:
            self._heap = [(w, n) for n, w in self._last.items()]
            heapq.heapify(self._heap)

    def lowest(self) -> int | None:
        """The lowest newest time over the members, or None without members."""
        heap, last = self._heap, self._last
        while heap:
            wall, node = heap[0]
            now = last.get(node)
            if now == wall:
                return wall
            if now is None or now < wall:
                heapq.heappop(heap)  # an entry above the member's time: a later push has its time
            else:
                heapq.heapreplace(heap, (now, node))  # the member has spoken since: its entry moves up
        return None

    def entries(self) -> list[tuple[int, str]]:
        """(wall, node) of every member, lowest first."""
        return sorted((w, n) for n, w in self._last.items())

    def older_than(self, limit: int) -> list[tuple[int, str]]:
        """(wall, node) of every member whose newest time is below ``limit``, lowest first."""
        return sorted((w, n) for n, w in self._last.items() if w < limit)
