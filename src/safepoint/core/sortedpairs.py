"""(value, name) pairs kept in order: the members' known minimums, lowest first (``Members.mins``).

A list of short sorted runs, each at most ``2 * load`` pairs (a longer one is split in two, one
shorter than ``load // 2`` joins its neighbour), with the last pair of each run beside them: a
pair is found by bisecting the runs' last pairs and then its run, so adding or removing one moves
at most one run's pointers, however many members the cluster has. It does what the cluster
asked of ``sortedcontainers.SortedList`` (add, discard, the lowest, the first k, in order) in code
the compiled core compiles: that pure-Python list took about a twentieth of the operator task's
Python samples (py-spy of a ``local[1]`` run).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator

__all__ = ["SortedPairs"]

Pair = tuple[int, str]


class SortedPairs:
    """Distinct (value, name) pairs in ascending order."""

    __slots__ = ("_runs", "_lasts", "_len", "_load")

    def __init__(self, pairs: Iterable[Pair] = (), load: int = 256) -> None:
        self._load = load
        ordered = sorted(set(pairs))
        self._runs: list[list[Pair]] = [ordered[i:i + load] for i in range(0, len(ordered), load)]
        self._lasts: list[Pair] = [run[-1] for run in self._runs]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Pair]:
        for run in self._runs:
            yield from run

    def lowest(self) -> Pair | None:
        """The lowest pair, or None when there is none."""
        return self._runs[0][0] if self._runs else None

    def head(self, k: int) -> list[Pair]:
        """The ``k`` lowest pairs, lowest first (all of them when there are fewer)."""
        out: list[Pair] = []
        for run in self._runs:
            if len(out) >= k:
                break
            out.extend(run[:k - len(out)])
        return out

    def add(self, pair: Pair) -> None:
        """Add ``pair`` (a pair already there stays once)."""
        runs, lasts = self._runs, self._lasts
        if not runs:
            runs.append([pair])
            lasts.append(pair)
            self._len = 1
            return
        i = bisect_left(lasts, pair)
        if i == len(runs):  # above every pair: the last run
            i -= 1
            runs[i].append(pair)
            lasts[i] = pair
        else:
            run = runs[i]
            j = bisect_left(run, pair)
            if run[j] == pair:
                return
            run.insert(j, pair)
        self._len += 1
        self._split(i)

    def discard(self, pair: Pair) -> None:
        """Remove ``pair`` if it is there."""
        runs, lasts = self._runs, self._lasts
        i = bisect_left(lasts, pair)
        if i == len(runs):
            return
        run = runs[i]
        j = bisect_left(run, pair)
        if j == len(run) or run[j] != pair:
            return
        del run[j]
        self._len -= 1
        if not run:
            del runs[i]
            del lasts[i]
            return
        if j == len(run):
            lasts[i] = run[-1]
        if len(run) < self._load // 2 and len(runs) > 1:  # join it with its neighbour
            k = i if i + 1 < len(runs) else i - 1
            runs[k].extend(runs[k + 1])
            del runs[k + 1]
            del lasts[k]  # the joined run ends where the second did
            self._split(k)

    def _split(self, i: int) -> None:
        """Split run ``i`` in two when it has grown past ``2 * load``."""
        run = self._runs[i]
        if len(run) > 2 * self._load:
            half = len(run) // 2
            self._runs.insert(i + 1, run[half:])
            del run[half:]
            self._lasts.insert(i, run[-1])
