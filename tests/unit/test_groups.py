"""A replication group's time during a leader hand-over (core/cluster.py, ``leaderless_group``).

A group's ``published_min_tx_time`` is a hold; the leader publishes it. When the leader steps down
before the new one has published, no current leader's time stands for the group: the round must
abort (an alert names the group), never skip the group's time. Seed 000 (Ignite catalog
compaction): a round aborts while a replication group's minimum is not known.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from safepoint.core.policy import Policy
from safepoint.replay import final_status

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000
OLD, NEW = 700, 750  # the old leader's published time, the new leader's (the group's time only grows)


def g(leader: bool, published: int | None) -> list[dict[str, Any]]:
    return [{"group": "g", "leader": leader, "published_min_tx_time": published}]


def handover_cluster(with_topology: bool = True) -> tuple[Run, NodeClient, NodeClient, NodeClient]:
    """n1 leads g at 700, n2 follows it, n3 holds no group; every node's own bound is 1,000."""
    run = Run(node_lease_ms=60_000)
    n1, n2, n3 = NodeClient("n1", "c1"), NodeClient("n2", "c1"), NodeClient("n3", "c1")
    if with_topology:
        run.feed(topology(1, T0, {"n1": ["g"], "n2": ["g"], "n3": []}, cluster="c1"))
    run.feed(n1.hb(T0, 1_000, groups=g(True, OLD)), n2.hb(T0, 1_000, groups=g(False, None)), n3.hb(T0, 1_000))
    if not with_topology:
        run.feed(n3.hb(T0 + 60_000, 1_000))  # past the discovery window
    assert run.last_safe_ts() == OLD
    return run, n1, n2, n3


def safe_points(run: Run) -> list[int]:
    return [d["safe_ts"] for d in run.directives()]


def test_a_step_down_before_the_new_leader_publishes_aborts_the_round_naming_the_group() -> None:
    run, n1, n2, n3 = handover_cluster()
    run.feed(n1.hb(T0 + 1_000, 1_100, groups=g(False, None)))  # the old leader steps down
    run.feed(n3.hb(T0 + 1_001, 1_100))
    assert safe_points(run) == [OLD], "the group's time is not skipped (the old code jumped to 1,000 here)"
    [a] = run.alerts("leaderless_group", "raised")
    assert a["node"] is None and "group g" in a["detail"] and "n1, n2" in a["detail"]
    [st_] = final_status(run.engine)["clusters"]
    assert [r["kind"] for r in st_["round"]["reasons"]] == ["leaderless_group"]
    run.feed(n2.hb(T0 + 2_000, 1_100, groups=g(True, NEW)))  # the new leader publishes
    assert run.alerts("leaderless_group", "cleared")
    assert safe_points(run) == [OLD, NEW] and run.alerts("horizon_violation") == []


def test_a_new_leader_before_the_step_down_holds_the_round_until_it_publishes() -> None:
    run, n1, n2, n3 = handover_cluster()
    run.feed(n2.hb(T0 + 1_000, 1_100, groups=g(True, None)))  # two leaders for a moment; n2 has no time yet
    run.feed(n1.hb(T0 + 1_001, 1_100, groups=g(False, None)), n3.hb(T0 + 1_002, 1_100))
    assert safe_points(run) == [OLD]
    assert run.alerts("unknown_node_min", "raised") and run.alerts("leaderless_group") == []
    run.feed(n2.hb(T0 + 2_000, 1_100, groups=g(True, NEW)))
    assert safe_points(run) == [OLD, NEW]


def test_a_replica_that_leaves_the_group_with_its_leadership_is_no_leader_either() -> None:
    run, n1, n2, n3 = handover_cluster(with_topology=False)
    run.feed(n1.hb(T0 + 61_000, 1_100, groups=[]))  # n1 no longer holds g at all (no topology to miss it)
    run.feed(n3.hb(T0 + 61_001, 1_100))
    assert safe_points(run) == [OLD] and run.alerts("leaderless_group", "raised")
    run.feed(n2.hb(T0 + 62_000, 1_100, groups=g(True, NEW)))
    assert safe_points(run) == [OLD, NEW]


def test_a_restart_during_the_hand_over_keeps_the_round_aborted() -> None:
    run, n1, n2, n3 = handover_cluster()
    run.feed(n1.hb(T0 + 1_000, 1_100, groups=g(False, None)))
    n2.restart()
    run.feed(n2.hb(T0 + 1_001, 1_100, groups=[{"group": "g"}]), n3.hb(T0 + 1_002, 1_200))
    assert safe_points(run) == [OLD]
    run.feed(n2.hb(T0 + 2_000, 1_200, groups=g(True, NEW)))
    assert safe_points(run) == [OLD, NEW]


# -- every order -----------------------------------------------------------------------------------

def node_scripts(new_leader_first: bool, restart: str | None, leave: bool) -> dict[str, list[tuple[str, Any]]]:
    """Each node's own steps of a hand-over from n1 to n2 (a node's order is fixed; the nodes'
    steps interleave in any order): ("hb", groups) or ("restart", None)."""
    n1: list[tuple[str, Any]] = [("hb", g(True, OLD)), ("hb", [] if leave else g(False, None)), ("hb", g(False, None))]
    n2: list[tuple[str, Any]] = [("hb", g(False, None))]
    if new_leader_first:
        n2.append(("hb", g(True, None)))
    n2 += [("hb", g(True, NEW)), ("hb", g(True, NEW))]
    if restart == "old":
        n1.insert(2, ("restart", None))
    elif restart == "new":
        n2.insert(1, ("restart", None))
    return {"n1": n1, "n2": n2, "n3": [("hb", None)] * 4}


@st.composite
def handovers(draw: st.DrawFn) -> tuple[list[dict[str, Any]], bool]:
    scripts = node_scripts(draw(st.booleans()), draw(st.sampled_from([None, "old", "new"])), draw(st.booleans()))
    with_topology = draw(st.booleans())
    clients = {n: NodeClient(n, "c1") for n in scripts}
    log: list[dict[str, Any]] = []
    if with_topology:
        log.append(topology(1, T0, {"n1": ["g"], "n2": ["g"], "n3": []}, cluster="c1"))
    wall, mvcc = T0, 1_000
    left = {n: list(steps) for n, steps in scripts.items()}
    while any(left.values()):
        node = draw(st.sampled_from(sorted(n for n, steps in left.items() if steps)))
        kind, groups = left[node].pop(0)
        c = clients[node]
        if kind == "restart":
            c.restart()
            continue
        wall += draw(st.integers(min_value=0, max_value=2_000))
        mvcc += draw(st.integers(min_value=0, max_value=200))
        log.append(c.hb(wall, mvcc) if groups is None else c.hb(wall, mvcc, groups=groups))
    return log, with_topology


@settings(max_examples=300, deadline=None)
@given(handovers())
def test_in_every_order_the_safe_point_never_passes_the_groups_time(case: tuple[list[dict[str, Any]], bool]) -> None:
    log, _with_topology = case
    run = Run(node_lease_ms=600_000)
    for ev in log:
        run.feed(ev)
        assert all(s <= NEW for s in safe_points(run)), f"passed the new leader's {NEW} after {json.dumps(ev)}"
    assert run.alerts("horizon_violation") == [], "no group time lands below a safe point already sent"


@settings(max_examples=25, deadline=None)
@given(handovers(), st.lists(st.integers(min_value=1, max_value=20), max_size=4))
def test_the_jobs_batches_equal_replay_through_a_hand_over(case: tuple[list[dict[str, Any]], bool],
                                                            cuts: list[int]) -> None:
    from test_batch import job_equals_replay

    log, _ = case
    msgs = [(0, i, (ev.get("node") or "c1").encode(), json.dumps(ev).encode()) for i, ev in enumerate(log)]
    job_equals_replay(msgs, sorted(set(cuts)), Policy(node_lease_ms=600_000), buckets=2)
