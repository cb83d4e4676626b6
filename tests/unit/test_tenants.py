"""Tenants (core/tenants.py): a namespace's long reader holds back only that namespace."""

from __future__ import annotations

import hashlib
import io
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import shortcut_equals_the_walk

from safepoint.core import Engine, Position
from safepoint.core.codec import encode
from safepoint.core.policy import Policy
from safepoint.replay import final_status, replay_file

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000
R = 1_000  # retention


def cluster(**policy: Any) -> tuple[Run, NodeClient, NodeClient]:
    run = Run(retention=R, node_lease_ms=60_000, **policy)
    n1, n2 = NodeClient("n1", "c1"), NodeClient("n2", "c1")
    run.feed(n1.hb(T0, 10_000), n2.hb(T0, 10_000), topology(1, T0, {"n1": [], "n2": []}, cluster="c1"))
    return run, n1, n2


def beat(run: Run, n1: NodeClient, n2: NodeClient, wall: int, mvcc: int) -> None:
    run.feed(n1.hb(wall, mvcc), n2.hb(wall, mvcc))


def test_a_tenants_long_reader_holds_back_only_its_namespace() -> None:
    run, n1, n2 = cluster()
    assert "namespace_safe_ts" not in run.directives()[-1], "no namespace seen yet: directives as before"
    run.feed(n1.open("report", 9_500, T0 + 1, label="six-hour report", namespace="a"))
    for i in range(1, 6):
        beat(run, n1, n2, T0 + i * 1_000, 10_000 + i * 1_000)
    d = run.directives()[-1]
    assert (d["safe_ts"], d["namespace_safe_ts"], d["namespaces"]) == (9_500, 14_000, {"a": 9_500})
    beat(run, n1, n2, T0 + 9_000, 20_000)
    d = run.directives()[-1]
    assert d["safe_ts"] == 9_500, "every namespace may compact up to safe_ts, which the reader holds"
    assert d["namespace_safe_ts"] == 19_000, "a namespace without holds follows the retention bound"
    assert d["namespaces"] == {"a": 9_500}
    run.feed(n1.close("report", T0 + 9_001))
    beat(run, n1, n2, T0 + 10_000, 21_000)
    d = run.directives()[-1]
    assert d["safe_ts"] == d["namespace_safe_ts"] == 20_000 and d["namespaces"] == {}
    [st_] = final_status(run.engine)["clusters"]
    assert st_["namespace_safe_ts"] == 20_000


def test_a_hold_without_namespace_pins_every_namespace() -> None:
    run, n1, n2 = cluster()
    run.feed(n1.open("a1", 9_500, T0 + 1, namespace="a"), n2.open("all", 9_200, T0 + 2))
    beat(run, n1, n2, T0 + 5_000, 30_000)
    d = run.directives()[-1]
    assert (d["safe_ts"], d["namespace_safe_ts"], d["namespaces"]) == (9_200, 9_200, {"a": 9_200})


def test_a_new_hold_below_its_namespaces_bound_is_a_violation_naming_it() -> None:
    run, n1, n2 = cluster()
    run.feed(n1.open("a1", 9_500, T0 + 1, namespace="a"))
    beat(run, n1, n2, T0 + 5_000, 30_000)
    assert run.directives()[-1]["namespace_safe_ts"] == 29_000
    run.feed(n2.open("late", 20_000, T0 + 5_001, namespace="b"))  # above safe_ts 9_500, below b's bound 29_000
    [v] = run.alerts("horizon_violation", "raised")
    assert "namespace b" in v["detail"] and v["threshold"] == 29_000 and v["value"] == 20_000
    run.feed(n2.close("late", T0 + 5_002))
    assert run.alerts("horizon_violation", "cleared")
    run.feed(n2.open("fine", 29_000, T0 + 5_003, namespace="b"))  # at the bound: protected (inclusive)
    assert len(run.alerts("horizon_violation", "raised")) == 1


def test_namespaces_beyond_max_namespaces_pin_all_with_an_alert() -> None:
    run, n1, n2 = cluster(max_namespaces=1)
    run.feed(n1.open("a1", 9_500, T0 + 1, namespace="a"), n2.open("b1", 9_700, T0 + 2, namespace="b"))
    beat(run, n1, n2, T0 + 5_000, 30_000)
    d = run.directives()[-1]
    assert d["namespaces"] == {"a": 9_500} and d["namespace_safe_ts"] == 9_700, "b pins all namespaces"
    [a] = run.alerts("namespace_limit", "raised")
    assert "b" in a["detail"]
    run.feed(n2.close("b1", T0 + 5_001))
    beat(run, n1, n2, T0 + 6_000, 31_000)
    assert run.alerts("namespace_limit", "cleared") and run.directives()[-1]["namespace_safe_ts"] == 30_000


def test_a_hold_without_namespace_below_a_namespaces_bound_is_a_violation_naming_it() -> None:
    run, n1, n2 = cluster()
    run.feed(n1.open("a1", 9_500, T0 + 1, namespace="a"))
    beat(run, n1, n2, T0 + 5_000, 30_000)
    d = run.directives()[-1]
    assert (d["safe_ts"], d["namespace_safe_ts"]) == (9_500, 29_000)
    run.feed(n2.open("etl", 20_000, T0 + 5_001))  # above safe_ts, below namespace_safe_ts: it pins them all
    [v] = run.alerts("horizon_violation", "raised")
    assert v["threshold"] == 29_000 and v["value"] == 20_000 and "namespace_safe_ts" in v["detail"]
    run.feed(n2.begin("load", 21_000, T0 + 5_002))
    assert len(run.alerts("horizon_violation", "raised")) == 2, "a transaction too"
    beat(run, n1, n2, T0 + 6_000, 31_000)
    d2 = run.directives()[-1]
    assert d2["namespace_safe_ts"] >= 29_000 and d2["namespaces"]["a"] >= 9_500, "no bound goes back"
    run.feed(n2.open("fine", 30_000, T0 + 6_001))  # at or above every bound: protected
    assert len(run.alerts("horizon_violation", "raised")) == 2


def test_a_service_hold_below_a_namespaces_bound_is_refused() -> None:
    run, n1, n2 = cluster()
    run.feed(n1.open("a1", 9_500, T0 + 1, namespace="a"))
    beat(run, n1, n2, T0 + 5_000, 30_000)
    hold = {"v": 1, "type": "service_hold", "cluster": "c1", "wall_ms": T0 + 5_001, "holder": "backup",
            "ts": 20_000, "ttl_ms": 60_000, "action_id": "b1"}
    run.feed(hold)
    [a] = run.alerts("service_hold_refused", "raised")
    assert a["threshold"] == 29_000 and "namespace_safe_ts" in a["detail"]
    state = run.engine.clusters["c1"]
    assert state.control.holds == {} and state.control.ignored == {"below_namespace_bound": 1}
    [st_] = final_status(run.engine)["clusters"]
    assert [(x["outcome"], x["reason"]) for x in st_["actions"]] == [("refused", "below_namespace_bound")]
    run.feed({**hold, "ts": 29_000, "action_id": "b2"})  # at the highest bound: accepted
    beat(run, n1, n2, T0 + 6_000, 40_000)
    d = run.directives()[-1]
    assert d["namespace_safe_ts"] == 29_000 and d["service_holds"]["backup"]["ts"] == 29_000


# -- generated logs -------------------------------------------------------------------------------


def tenant_log(seed: int, namespaces: tuple[str | None, ...] = (None, "a", "b", "c")) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    nodes = [NodeClient(f"n{i}", "c1") for i in range(3)]
    events: list[dict[str, Any]] = [topology(1, T0, {n.node: [] for n in nodes}, cluster="c1")]
    open_: dict[str, tuple[NodeClient, str]] = {}
    mvcc, wall = 10_000, T0
    for i in range(150):
        wall += rng.randint(1, 300)
        mvcc += rng.randint(0, 400)
        n = rng.choice(nodes)
        r = rng.random()
        if r < 0.35:
            rid = f"r{i}"
            ns = rng.choice(namespaces)
            ts = mvcc - rng.randint(0, 3 * R)
            fields = {} if ns is None else {"namespace": ns}
            events.append(n.open(rid, ts, wall, **fields))
            open_[rid] = (n, rid)
        elif r < 0.6 and open_:
            rid = rng.choice(sorted(open_))
            owner, _ = open_.pop(rid)
            events.append(owner.close(rid, wall))
        else:
            events.append(n.hb(wall, mvcc))
    return events


def effective(d: dict[str, Any], ns: str | None) -> int:
    """The bound a hold of ``ns`` must lie at or above to be protected: its namespace's, or for a
    hold without a namespace (it pins every namespace) the highest of them all."""
    if "namespace_safe_ts" not in d:
        return d["safe_ts"]
    if ns is None:
        return max(d["safe_ts"], d["namespace_safe_ts"], *d["namespaces"].values())
    return d["namespaces"].get(ns, d["namespace_safe_ts"])


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=100_000))
def test_namespace_bounds_are_monotonic_and_never_pass_a_protected_hold(seed: int) -> None:
    run = Run(retention=R, node_lease_ms=60_000)
    protected: dict[str, tuple[int, str | None]] = {}  # reader -> (ts, namespace), open and protected when opened
    last: dict[str, Any] | None = None
    for ev in tenant_log(seed):
        outs = run.feed(ev)
        if ev["type"] == "reader_open" and (last is None or ev["read_ts"] >= effective(last, ev.get("namespace"))):
            protected[ev["reader_id"]] = (ev["read_ts"], ev.get("namespace"))
        elif ev["type"] == "reader_close":
            protected.pop(ev["reader_id"], None)
        for d in (o.value for o in outs if o.value.get("type") == "compaction"):
            if "namespace_safe_ts" in d:
                assert d["namespace_safe_ts"] >= d["safe_ts"]
                assert all(b >= d["safe_ts"] and b <= d["namespace_safe_ts"] for b in d["namespaces"].values())
            if last is not None:
                for ns in {None, "a", "b", "c"}:
                    assert effective(d, ns) >= effective(last, ns), f"bound of {ns} went back"
            for rid, (ts, ns) in protected.items():
                assert effective(d, ns) <= ts, f"{rid} of {ns} at {ts} passed by {effective(d, ns)}"
            last = d


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=100_000))
def test_namespaces_do_not_change_the_clusters_safe_point(seed: int) -> None:
    """The regression property: the same log with its namespaces removed gives the same safe_ts
    sequence, and then directives without any namespace field (exactly the earlier shape)."""
    with_ns, without = Run(retention=R, node_lease_ms=60_000), Run(retention=R, node_lease_ms=60_000)
    for ev in tenant_log(seed):
        with_ns.feed(ev)
        without.feed({k: v for k, v in ev.items() if k != "namespace"})
    plain = without.directives()
    assert all("namespace_safe_ts" not in d and "namespaces" not in d for d in plain)
    # with namespaces a directive also comes when only a namespace's bound moved: compare the advances
    advances = [d["safe_ts"] for i, d in enumerate(with_ns.directives())
                if i == 0 or d["safe_ts"] != with_ns.directives()[i - 1]["safe_ts"]]
    assert advances == [d["safe_ts"] for d in plain]


# What the core before tenants (commit 7ed4cd0) wrote for tenant_log(0..299) with every namespace
# removed: 4,723 directive and alert lines, replayed with retention R and a 60 s lease. To recompute:
# check that commit out, replay the same files with its safepoint.replay, hash the outputs in order.
BEFORE_TENANTS = ("8116e06c94d69f5e22fa0c8c179cb4587da5a658d18cfcf10a3977add9e56d0b", 4_723)


def test_without_namespaces_the_outputs_are_exactly_those_of_the_core_before_tenants() -> None:
    digest, lines = hashlib.sha256(), 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(300):
            log = Path(tmp) / f"log{seed}.jsonl"
            log.write_text("".join(json.dumps({k: v for k, v in ev.items() if k != "namespace"}) + "\n"
                                   for ev in tenant_log(seed)))
            out = io.StringIO()
            replay_file(str(log), out, Policy(retention=R, node_lease_ms=60_000), io.StringIO())
            text = as_before_bounded_directives(out.getvalue())
            digest.update(text.encode())
            lines += text.count("\n")
    assert (digest.hexdigest(), lines) == BEFORE_TENANTS


def as_before_bounded_directives(text: str) -> str:
    """Replay's output as the core wrote it before directives were bounded: no ``members`` records,
    no ``members`` and ``positions`` in a directive, and its basis (here every member: these logs
    have at most 8 nodes) in node order."""
    lines = []
    for line in text.splitlines(keepends=True):
        value = json.loads(line)
        if value.get("type") == "members":
            continue
        if value.get("type") == "compaction":
            assert len(value["basis"]) == value["members"] <= 8, "the basis lists every member"
            value["basis"] = dict(sorted(value["basis"].items()))
            del value["members"], value["positions"]
            line = encode(value) + "\n"
        lines.append(line)
    return "".join(lines)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=100_000))
def test_the_nodes_shortcut_equals_walking_its_holds_with_namespaces(seed: int) -> None:
    shortcut_equals_the_walk(Policy(retention=R, node_lease_ms=60_000), list(tenant_log(seed)))


def test_the_jobs_batches_equal_replay_with_namespaces() -> None:
    from test_batch import job_equals_replay

    msgs = []
    offsets = [0, 0]
    for ev in tenant_log(11):
        part = 0 if ev.get("node") in ("n0", None) else 1
        msgs.append((part, offsets[part], (ev.get("node") or "c1").encode(), json.dumps(ev).encode()))
        offsets[part] += 1
    got = job_equals_replay(msgs, list(range(17, len(msgs), 23)), Policy(retention=R, node_lease_ms=60_000), buckets=3)
    assert any("namespaces" in d for _, d in got["dir"]), "the log exercises namespaces"


def test_engine_and_file_order_agree_on_namespace_bounds() -> None:
    engine = Engine(Policy(retention=R, node_lease_ms=60_000))
    for i, ev in enumerate(tenant_log(5)):
        engine.process(json.dumps(ev), Position("ev", 0, i, None))
    t = engine.clusters["c1"].tenants
    assert t and t.base is not None and t.base >= engine.clusters["c1"].safe_ts


def test_namespace_bounds_outlive_a_lost_checkpoint() -> None:
    """A job that lost its checkpoint seeds each namespace's bound from the newest directive, so
    none goes back (core/recovery.py)."""
    from safepoint.core.recovery import StartPlan, seeds_from_directives

    run, n1, n2 = cluster()
    run.feed(n1.open("a1", 9_500, T0 + 1, namespace="a"))
    beat(run, n1, n2, T0 + 5_000, 30_000)
    last = run.directives()[-1]
    seeds = seeds_from_directives(o.value for o in run.outputs if o.channel == "directives")
    again = Run(retention=R, node_lease_ms=60_000, start=StartPlan(seeds))
    m1, m2 = NodeClient("n1", "c1", incarnation=1), NodeClient("n2", "c1", incarnation=1)
    again.feed(topology(2, T0 + 6_000, {"n1": [], "n2": []}, cluster="c1"),
               m1.snapshot(T0 + 6_000, [], []), m2.snapshot(T0 + 6_000, [], []))
    again.feed(m1.open("a2", 20_000, T0 + 6_001, namespace="a"))  # below a's bound? no: a's bound was 9_500
    again.feed(m1.hb(T0 + 7_000, 30_500), m2.hb(T0 + 7_000, 30_500))
    d = again.directives()[-1]
    assert d["namespace_safe_ts"] >= last["namespace_safe_ts"] and d["namespaces"]["a"] >= last["namespaces"]["a"]
    assert d["namespaces"]["a"] == 20_000


def test_lowering_max_namespaces_never_evicts_a_tracked_namespace() -> None:
    run, n1, n2 = cluster(max_namespaces=2)
    run.feed(n1.open("a1", 9_500, T0 + 1, namespace="a"))
    beat(run, n1, n2, T0 + 5_000, 30_000)
    assert run.directives()[-1]["namespaces"] == {"a": 9_500}
    state = run.engine.clusters["c1"]
    again = Run(policy=run.engine.policy.__class__(retention=R, node_lease_ms=60_000, max_namespaces=0))
    again.engine.clusters["c1"] = state  # the same cluster state under a lower cap (a changed setting)
    again.engine.nodes.update(run.engine.nodes)
    again.feed(n1.hb(T0 + 6_000, 31_000), n2.hb(T0 + 6_000, 31_000))
    d = again.directives()[-1]
    assert d["namespaces"] == {"a": 9_500} and d["namespace_safe_ts"] == 30_000, "a stays protected"


def test_compact_up_to_reads_a_namespaces_bound_from_a_directive_or_its_json() -> None:
    from safepoint.connectors.directive_models import Directive, compact_up_to

    raw = {"v": 1, "type": "compaction", "cluster": "c1", "seq": 4, "safe_ts": 100, "catalog_floor": None,
           "cluster_wall_ms": 1, "blocker": None, "basis": {}, "namespace_safe_ts": 300, "namespaces": {"a": 150}}
    for d in (raw, Directive.from_json(raw)):
        assert compact_up_to(d, None) == 100
        assert compact_up_to(d, None, namespace="a") == 150
        assert compact_up_to(d, None, namespace="b") == 300
        assert compact_up_to(d, 120, namespace="b") == 120
    assert compact_up_to({"safe_ts": 7}, 9, namespace="a") == 7, "a directive without namespaces: safe_ts"
