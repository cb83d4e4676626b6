"""SortedPairs against a sorted list of the same pairs, through any sequence of adds and discards."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from safepoint.core.sortedpairs import SortedPairs

PAIRS = st.tuples(st.integers(0, 40), st.sampled_from(["a", "b", "c", "n1", "n2"]))
OPS = st.lists(st.tuples(st.booleans(), PAIRS), max_size=300)


def check(sp: SortedPairs, model: set[tuple[int, str]]) -> None:
    want = sorted(model)
    assert list(sp) == want
    assert len(sp) == len(want)
    assert bool(sp) == bool(want)
    assert sp.lowest() == (want[0] if want else None)
    for k in (0, 1, 3, 7, len(want), len(want) + 2):
        assert sp.head(k) == want[:k]
    runs = sp._runs  # noqa: SLF001 - the layout's own rules
    assert all(runs) and [r[-1] for r in runs] == sp._lasts  # noqa: SLF001
    assert all(len(r) <= 2 * sp._load for r in runs)  # noqa: SLF001


@settings(max_examples=300, deadline=None)
@given(st.lists(PAIRS, max_size=30), OPS, st.sampled_from([1, 2, 3, 4, 256]))
def test_sorted_pairs_match_a_sorted_list(start: list[tuple[int, str]], ops: list[tuple[bool, tuple[int, str]]], load: int) -> None:
    sp = SortedPairs(start, load=load)
    model = set(start)
    check(sp, model)
    for add, pair in ops:
        if add:
            sp.add(pair)
            model.add(pair)
        else:
            sp.discard(pair)
            model.discard(pair)
        check(sp, model)


def test_runs_split_and_join() -> None:
    sp = SortedPairs(load=4)
    for i in range(40):
        sp.add((i, "n"))
    assert max(len(r) for r in sp._runs) <= 8 and len(sp._runs) >= 5  # noqa: SLF001 - split as they grew
    for i in range(40):
        if i % 8:
            sp.discard((i, "n"))
    assert list(sp) == [(i, "n") for i in range(0, 40, 8)]
    assert len(sp._runs) <= 2  # noqa: SLF001 - runs left short joined their neighbours
    for i in range(0, 40, 8):
        sp.discard((i, "n"))
    assert not sp and sp.lowest() is None and sp.head(3) == []
