"""The invariants of the cluster's parts that no other property test holds, on random steps: the
``Catalog``'s floor (``core/catalog.py``) and the ``Emergency`` (``core/emergency.py``). Each part
is driven alone, through its own methods, as ``ClusterState`` drives it; the others' are held by
``test_properties.py`` (the members' indexes, the alert book), ``test_control.py``,
``test_gaps.py``, ``test_tenants.py`` and ``test_recovery.py``."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from safepoint.core.alerts import AlertBook
from safepoint.core.catalog import Catalog
from safepoint.core.emergency import EMERGENCY_ID, Emergency
from safepoint.core.policy import Policy

VERSIONS = st.integers(1, 12)

catalog_steps = st.lists(st.one_of(
    st.tuples(st.just("catalog"), VERSIONS, st.integers(0, 1_000)),
    st.tuples(st.just("index_build"), st.sampled_from(["i1", "i2"]), VERSIONS, st.sampled_from(["started", "finished"])),
    st.tuples(st.just("rebalance"), st.sampled_from(["g1", "g2"]), VERSIONS, st.sampled_from(["started", "finished"])),
    st.tuples(st.just("hold"), st.booleans()),
    st.tuples(st.just("round"), st.integers(0, 200)),
), max_size=60)


def _catalog_event(step: tuple[Any, ...]) -> Any:
    kind = step[0]
    if kind == "catalog":
        return {"v": 1, "type": "catalog", "cluster": "c", "wall_ms": 0, "version": 1, "catalog_version": step[1],
                "activated_at": step[2]}
    what = "index" if kind == "index_build" else "group"
    return {"v": 1, "type": kind, "cluster": "c", "wall_ms": 0, "version": 1, what: step[1],
            "catalog_version": step[2], "state": step[3]}


@settings(max_examples=300, deadline=None)
@given(catalog_steps)
def test_the_catalog_floor_only_goes_forward_and_never_past_a_pin(steps: list[tuple[Any, ...]]) -> None:
    """A round's floor is a version activated at or before its safe point, or the version an unfinished
    index build or rebalance began under, never above such a version, never below the floor already
    sent, and it stands still while held (catalog events may have been lost)."""
    catalog = Catalog()
    activated: dict[int, int] = {}
    pins: dict[tuple[str, str], int] = {}
    held = False
    safe = 0
    for step in steps:
        if step[0] == "hold":
            held = step[1]
            catalog.hold(held)
            continue
        if step[0] != "round":
            catalog.apply(_catalog_event(step))
            if step[0] == "catalog":
                activated[step[1]] = step[2]
            elif step[3] == "started":
                pins[(step[0], step[1])] = step[2]
            else:
                pins.pop((step[0], step[1]), None)
            continue
        safe += step[1]  # the safe point only goes forward
        before = catalog.floor
        floor = catalog.floor_at(safe)
        catalog.advance(floor)
        if before is not None:
            assert floor is not None and floor >= before, "the floor went back"
        if held or floor == before:
            assert floor == before or not held, "a held floor moved"
            continue
        assert floor is not None
        assert activated.get(floor, safe + 1) <= safe or floor in pins.values(), (
            f"floor {floor} is neither active at safe point {safe} nor pinned")
        assert all(floor <= pin for pin in pins.values()), f"floor {floor} passed a pin {pins}"


emergency_steps = st.lists(st.one_of(
    st.tuples(st.just("debt"), st.sampled_from(["n1", "n2", "n3"]), st.booleans()),
    st.tuples(st.just("step"), st.integers(0, 40_000)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(emergency_steps)
def test_the_emergency_alert_is_raised_exactly_while_in_emergency(steps: list[tuple[Any, ...]]) -> None:
    """The cluster is in emergency after any round at which a node says its debt still grows in the
    critical band; it leaves only once no node has said so for ``emergency_exit_ms`` of cluster time;
    its ``emergency`` alert is in the book exactly while it is in emergency, each raise and clear said
    once; and its stored form restores the same state."""
    policy = Policy(emergency_exit_ms=60_000)
    book = AlertBook("c")
    emergency = Emergency()
    growing: set[str] = set()
    now = 0
    calm_from: int | None = None  # the first round with no node growing since the last with one
    said: list[str] = []
    for step in steps:
        if step[0] == "debt":
            emergency.take(step[1], step[2], 1_000)
            (growing.add if step[2] else growing.discard)(step[1])
            continue
        now += step[1]
        was = emergency.since is not None
        changed, out = emergency.step(now, policy, book)
        said += [o.value["state"] for o in out]
        inside = emergency.since is not None
        if growing:
            calm_from = None
            assert inside, "a node's debt grows in the critical band and the cluster is not in emergency"
        elif was:
            calm_from = now if calm_from is None else calm_from
            assert inside == (now - calm_from < policy.emergency_exit_ms), (now, calm_from)
        assert changed == (was != inside)
        assert (EMERGENCY_ID in book) == inside
        again = Emergency.from_json(emergency.to_json())
        assert (again.nodes, again.since, again.calm_since) == (emergency.nodes, emergency.since, emergency.calm_since)
    assert said == ["raised", "cleared"] * (len(said) // 2) + (["raised"] if len(said) % 2 else [])
