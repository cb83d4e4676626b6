"""A start on empty state (a lost checkpoint): the seed from the directives topic and the
snapshots every node must give before the round counts it again (core/recovery.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safepoint.core import DIRECTIVES, Output, Policy
from safepoint.core.cluster import ClusterState
from safepoint.core.recovery import Seed, StartPlan, seeds_from_directives

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000


def requests(outs: list[Output]) -> list[dict[str, Any]]:
    return [o.value for o in outs if o.channel == DIRECTIVES and o.value["type"] == "snapshot_request"]


def old_job() -> tuple[Run, NodeClient, NodeClient]:
    """The job before its checkpoint is lost: n1 keeps reader r1 at 500 open; safe_ts stops there."""
    run = Run(node_lease_ms=5_000)
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": [], "n2": []}), n1.hb(T0, 400), n2.hb(T0, 400))
    run.feed(n1.open("r1", 500, T0 + 10, label="report"))
    for i in range(1, 4):
        run.feed(n1.hb(T0 + i * 1000, 1000 + i * 100), n2.hb(T0 + i * 1000, 1000 + i * 100))
    assert run.last_safe_ts() == 500
    return run, n1, n2


def plan_after(run: Run, recover_all: bool = True) -> StartPlan:
    seeds = seeds_from_directives(o.value for o in run.outputs if o.channel == DIRECTIVES)
    return StartPlan(seeds, recover_all=recover_all)


def test_without_recovery_a_fresh_start_passes_the_open_reader() -> None:
    """The hole: a job on empty state that reads only new events never learns of r1."""
    _old, n1, n2 = old_job()
    fresh = Run(node_lease_ms=5_000)
    for i in range(4, 12):
        fresh.feed(n1.hb(T0 + i * 1000, 2000 + i * 100), n2.hb(T0 + i * 1000, 2000 + i * 100))
    assert fresh.last_safe_ts() is not None and fresh.last_safe_ts() > 500
    assert fresh.directives()[0]["seq"] == 1


def test_seeded_start_keeps_the_floor_continues_seq_and_waits_for_snapshots() -> None:
    old, n1, n2 = old_job()
    last = old.directives()[-1]
    new = Run(node_lease_ms=5_000, start=plan_after(old))
    outs: list[Output] = []
    for i in range(4, 12):  # past the discovery window: without snapshots the round stays aborted
        outs += new.feed(n1.hb(T0 + i * 1000, 2000 + i * 100), n2.hb(T0 + i * 1000, 2000 + i * 100))
    assert new.directives() == []
    asked = requests(outs)
    assert [(r["node"], r["reason"]) for r in asked][:2] == [("n1", "recovery"), ("n2", "recovery")]
    assert [r["seq"] for r in asked] == list(range(1, len(asked) + 1))
    raised = {a["id"] for a in new.alerts("awaiting_snapshot", "raised")}
    assert raised == {"default/awaiting_snapshot/n1", "default/awaiting_snapshot/n2"}
    # n1 answers with its complete picture: r1 is open; n2 answers with nothing open
    new.feed(n1.snapshot(T0 + 12_000, readers=[{"reader_id": "r1", "read_ts": 500}], txs=[]))
    assert new.directives() == []
    new.feed(n2.snapshot(T0 + 12_000, readers=[], txs=[]))
    new.feed(n1.hb(T0 + 12_100, 3300), n2.hb(T0 + 12_100, 3300))
    assert new.directives() == []  # r1 still holds at 500 = the seeded safe_ts: nothing advances
    assert {a["id"] for a in new.alerts("awaiting_snapshot", "cleared")} == raised
    new.feed(n1.close("r1", T0 + 13_000), n1.hb(T0 + 13_100, 3400), n2.hb(T0 + 13_100, 3400))
    ds = new.directives()
    assert ds and ds[0]["seq"] == last["seq"] + 1 and ds[0]["safe_ts"] >= 3300


def test_seeded_safe_ts_never_goes_back_and_lower_holds_are_violations() -> None:
    old, n1, n2 = old_job()
    new = Run(node_lease_ms=5_000, start=plan_after(old))
    new.feed(n1.snapshot(T0 + 5_000, readers=[{"reader_id": "r0", "read_ts": 100}], txs=[]),
             n2.snapshot(T0 + 5_000, readers=[], txs=[]))
    new.feed(n1.hb(T0 + 5_100, 200), n2.hb(T0 + 5_100, 3000))
    for i in range(6, 12):
        new.feed(n1.hb(T0 + i * 1000, 200 + i), n2.hb(T0 + i * 1000, 3000 + i))
    assert all(d["safe_ts"] >= 500 for d in new.directives())
    assert [a["node"] for a in new.alerts("horizon_violation", "raised")][:1] == ["n1"]


def test_a_request_is_repeated_after_a_lease_without_an_answer_not_before() -> None:
    old, n1, n2 = old_job()
    new = Run(node_lease_ms=5_000, start=plan_after(old))
    asked: list[dict[str, Any]] = []
    for i in range(0, 12):
        asked += requests(new.feed(n1.hb(T0 + 10_000 + i * 1000, 2000 + i)))
    assert [(r["node"], r["cluster_wall_ms"]) for r in asked] == [
        ("n1", T0 + 10_000), ("n1", T0 + 15_000), ("n1", T0 + 20_000)]


def test_a_node_of_the_last_basis_that_never_reports_blocks_until_a_topology_drops_it() -> None:
    old, n1, _n2 = old_job()
    new = Run(node_lease_ms=5_000, start=plan_after(old))
    new.feed(n1.snapshot(T0 + 5_000, readers=[], txs=[]))
    for i in range(6, 14):
        new.feed(n1.hb(T0 + i * 1000, 2000 + i * 100))
    assert new.directives() == []
    assert "default/awaiting_snapshot/n2" in {a["id"] for a in new.alerts("awaiting_snapshot", "raised")}
    new.feed(topology(2, T0 + 14_000, {"n1": []}), n1.hb(T0 + 14_100, 3500))
    assert new.directives() and new.directives()[-1]["safe_ts"] == 3500


def test_recovery_survives_state_round_trips() -> None:
    old, n1, n2 = old_job()
    new = Run(node_lease_ms=5_000, start=plan_after(old))
    new.feed(n1.hb(T0 + 5_000, 2000), n2.hb(T0 + 5_000, 2000))
    new.restore()
    new.feed(n1.snapshot(T0 + 5_100, readers=[], txs=[]))
    new.restore()
    new.feed(n2.snapshot(T0 + 5_200, readers=[], txs=[]))
    new.restore()
    for i in range(6, 12):
        new.feed(n1.hb(T0 + i * 1000, 3000 + i), n2.hb(T0 + i * 1000, 3000 + i))
    assert new.directives() and new.directives()[0]["seq"] == old.directives()[-1]["seq"] + 1


def test_seeds_take_the_newest_directive_and_the_highest_node_seq() -> None:
    values: list[dict[str, Any]] = [
        {"type": "compaction", "cluster": "c1", "seq": 3, "safe_ts": 30, "catalog_floor": None, "basis": {"a": {}}},
        {"type": "compaction", "cluster": "c1", "seq": 5, "safe_ts": 50, "catalog_floor": 2, "basis": {"b": {}, "a": {}}},
        {"type": "compaction", "cluster": "c1", "seq": 4, "safe_ts": 40, "catalog_floor": 1, "basis": {}},
        {"type": "expire", "cluster": "c1", "seq": 9, "node": "a"},
        {"type": "snapshot_request", "cluster": "c2", "seq": 2, "node": "x"},
        {"type": "compaction", "cluster": "c3", "seq": True},  # junk is skipped
        {"nothing": 1},
    ]
    seeds = seeds_from_directives(values)
    assert seeds == {"c1": Seed(50, 2, 5, 9, ("a", "b")), "c2": Seed(node_seq=2)}
    plan = StartPlan(seeds)
    assert StartPlan.from_json(plan.to_json()) == plan
    assert ClusterState.starting("c9", plan).recovery is None  # a cluster the topic never saw starts fresh
    assert ClusterState.starting("c1", plan).dseq == 5 and ClusterState.starting("c1", plan).recovery is not None
    assert ClusterState.starting("c9", StartPlan(recover_all=True)).recovery is not None


def test_after_bounded_directives_the_members_record_names_whom_to_wait_for() -> None:
    """A directive lists only the lowest minimums: the nodes a new job waits for come from the
    newest members record at or below it (a later one belongs to a directive the topic lost)."""
    values: list[dict[str, Any]] = [
        {"type": "members", "cluster": "c1", "seq": 2, "nodes": ["a", "b", "c"]},
        {"type": "compaction", "cluster": "c1", "seq": 4, "safe_ts": 40, "catalog_floor": None, "basis": {"a": {}},
         "members": 3, "positions": {"0": 9}},
        {"type": "members", "cluster": "c1", "seq": 1, "nodes": ["a"]},
        {"type": "members", "cluster": "c2", "seq": 7, "nodes": ["x", "y"]},
        {"type": "compaction", "cluster": "c2", "seq": 6, "safe_ts": 60, "catalog_floor": None, "basis": {"x": {}},
         "members": 2, "positions": {}},
    ]
    seeds = seeds_from_directives(values)
    assert seeds["c1"].nodes == ("a", "b", "c") and seeds["c1"].seq == 4
    assert seeds["c2"].nodes == (), "a members record past the newest directive is not its member set"


def test_a_lost_checkpoint_waits_for_every_member_beyond_the_basis() -> None:
    """Twelve members, eight in the basis: the new job still waits for all twelve."""
    run = Run(node_lease_ms=5_000)
    nodes = [NodeClient(f"n{i:02}") for i in range(12)]
    run.feed(topology(1, T0, {n.node: [] for n in nodes}), *[n.hb(T0 + i, 1_000 + i) for i, n in enumerate(nodes)])
    assert len(run.directives()[-1]["basis"]) == 8 and run.directives()[-1]["members"] == 12
    new = Run(node_lease_ms=5_000, start=plan_after(run))
    for n in nodes[:11]:
        new.feed(n.snapshot(T0 + 6_000, readers=[], txs=[]), n.hb(T0 + 6_001, 2_000))
    for i in range(7, 14):
        new.feed(nodes[0].hb(T0 + i * 1_000, 2_000 + i))
    assert new.directives() == [], "n11 (not in the basis) has not sent its snapshot"
    assert "default/awaiting_snapshot/n11" in {a["id"] for a in new.alerts("awaiting_snapshot", "raised")}
    new.feed(nodes[11].snapshot(T0 + 14_100, readers=[], txs=[]), *[n.hb(T0 + 14_101, 2_000) for n in nodes])
    assert new.directives() and new.directives()[-1]["safe_ts"] == 2_000


# -- property: through a lost checkpoint, the safe point never passes a live reader ------------

ops = st.lists(st.tuples(st.sampled_from(["open", "close", "hb", "hb", "hb"]), st.integers(0, 2), st.integers(0, 60)),
               min_size=5, max_size=80)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=ops, after=ops, recover_all=st.booleans())
def test_property_a_lost_checkpoint_never_passes_a_live_reader(before: list[Any], after: list[Any], recover_all: bool) -> None:
    """Nodes behave as the Reporter does: they refuse readers below the safe point they heard,
    and answer a snapshot_request with their complete set. Across the loss, every directive's
    safe_ts stays at or below every open reader, safe_ts never goes back and seq goes up by one."""
    policy = Policy(node_lease_ms=3_000)
    nodes = [NodeClient(f"n{i}") for i in range(3)]
    open_readers: list[dict[str, int]] = [{} for _ in nodes]
    mvcc = [1_000, 1_000, 1_000]
    state = {"wall": T0, "heard": -(1 << 62), "seq": 0, "ids": 0}
    seen: list[dict[str, Any]] = []

    def check(outs: list[Output], run: Run) -> None:
        for o in outs:
            v = o.value
            if o.channel == DIRECTIVES and v["type"] == "compaction":
                assert v["seq"] == state["seq"] + 1
                assert v["safe_ts"] >= state["heard"]
                live = [ts for rs in open_readers for ts in rs.values()]
                assert not live or v["safe_ts"] <= min(live), (v, live)
                state["seq"], state["heard"] = v["seq"], v["safe_ts"]
                seen.append(v)
            elif o.channel == DIRECTIVES and v["type"] == "snapshot_request":
                i = int(v["node"][1:])
                rs = [{"reader_id": r, "read_ts": ts} for r, ts in open_readers[i].items()]
                check(run.feed(nodes[i].snapshot(state["wall"], readers=rs, txs=[])), run)

    def play(run: Run, steps: list[Any]) -> None:
        for op, i, k in steps:
            state["wall"] += 250
            if op == "open":
                ts = max(mvcc[i] - k, state["heard"])  # the Reporter refuses below the safe point it heard
                state["ids"] += 1
                rid = f"r{state['ids']}"
                open_readers[i][rid] = ts
                check(run.feed(nodes[i].open(rid, ts, state["wall"])), run)
            elif op == "close" and open_readers[i]:
                rid = sorted(open_readers[i])[k % len(open_readers[i])]
                del open_readers[i][rid]
                check(run.feed(nodes[i].close(rid, state["wall"])), run)
            else:
                mvcc[i] += k
                check(run.feed(nodes[i].hb(state["wall"], mvcc[i])), run)
            for j in range(3):  # every node heartbeats at least once a second, as a Reporter does
                if j != i and state["wall"] % 1000 == 0:
                    check(run.feed(nodes[j].hb(state["wall"], mvcc[j])), run)

    first = Run(policy)
    for n in nodes:
        check(first.feed(n.hb(state["wall"], mvcc[0])), first)
    play(first, before)
    second = Run(policy, start=plan_after(first, recover_all))
    if not recover_all and not second.engine.start.seeds:
        return  # no directive yet and the job reads the whole log: covered by the other properties
    for i, n in enumerate(nodes):  # the nodes are alive: they heartbeat right after the start
        check(second.feed(n.hb(state["wall"], mvcc[i])), second)
    play(second, after)
