"""The live auditor's model (``safepoint.ops.audit``, no Kafka here): silent on everything the core
emits (the example logs, simulated clusters with restarts, namespaces, several partitions, the
events and directives interleaved in any order), and it catches each deliberately wrong directive:
a safe point past a live reader, a prepared transaction, a group's time, a retention bound, a
service hold, a namespace's hold, and a bound that goes back."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from safepoint.core import Engine, Policy
from safepoint.core.origin import control_partition, is_control, kafka_partition, position_key
from safepoint.devtools.simulate import SimConfig, generate_log
from safepoint.ops.audit import AUDIT_KIND, Auditor
from safepoint.schemas import CONTROL_EVENT_TYPES
from safepoint.settings import load_settings

from local_job import ORIGINS, position

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


def run_core(events: list[dict[str, Any]], policy: Policy, partitions: int = 1) -> tuple[list[tuple[int, int, bytes]],
                                                                                        list[dict[str, Any]]]:
    """The events as the topics would hold them (keyed by node, or by cluster, over ``partitions``;
    control events on the control topic's one partition, at its routed partition) and the
    compaction directives the core emits reading them in that order."""
    placed: dict[int, list[bytes]] = {p: [] for p in [*range(partitions), control_partition(0)]}
    order: list[tuple[int, int, bytes]] = []
    for ev in events:
        key = str(ev.get("node") or ev.get("cluster", "default"))
        p = control_partition(0) if ev["type"] in CONTROL_EVENT_TYPES else sum(key.encode()) % partitions
        raw = json.dumps(ev).encode()
        order.append((p, len(placed[p]), raw))
        placed[p].append(raw)
    engine = Engine(policy, origins=ORIGINS)
    directives = []
    for p, o, raw in order:
        for out in engine.process(raw, position(p, o)):
            if out.channel == "directives" and out.value["type"] == "compaction":
                directives.append(out.value)
    return order, directives


def audit(order: list[tuple[int, int, bytes]], directives: list[dict[str, Any]], seed: int | None = None) -> Auditor:
    """Feed the auditor both topics: in log order with each directive right after the events it
    covers, or (``seed``) shuffled, directives early, events late, as two followers may read them."""
    a = Auditor()
    if seed is None:
        items: list[tuple[str, Any]] = [("e", m) for m in order]
        for d in directives:  # after the last event its positions cover
            reach = max((i for i, (p, o, _v) in enumerate(order) if o < d["positions"].get(position_key(p), 0)),
                        default=-1)
            items.insert(reach + 1 + sum(1 for x in items[:reach + 1] if x[0] == "d"), ("d", d))
    else:
        rng = random.Random(seed)
        events, ds = [("e", m) for m in order], [("d", d) for d in directives]
        items = []
        while events or ds:
            src = ds if ds and (not events or rng.random() < 0.5) else events
            items.append(src.pop(0))
    for kind, item in items:
        if kind == "e":
            feed(a, item)
        else:
            a.directive(json.dumps(item))
    return a


def feed(a: Auditor, m: tuple[int, int, bytes]) -> list[Any]:
    """One message of ``run_core``'s order to the auditor, from its topic."""
    p, o, raw = m
    return a.event(kafka_partition(p), o, raw, None, control=is_control(p))


def example(name: str) -> tuple[list[dict[str, Any]], Policy]:
    d = ROOT / "examples" / name
    policy = load_settings(str(d / "safepoint.toml"), {}).policy()
    events = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines() if x.strip()]
    return [e for e in events if isinstance(e, dict)], policy


@pytest.mark.parametrize("name", ["worked-example", "backup-hold", "tenants"])
def test_the_example_logs_pass(name: str) -> None:
    events, policy = example(name)
    order, directives = run_core(events, policy)
    assert directives
    for seed in (None, 1, 2):
        a = audit(order, directives, seed)
        assert a.violations == [], [v.detail for v in a.violations]
        assert a.checked == len(directives) and a.unverified == 0


@pytest.mark.parametrize("seed", range(4))
def test_simulated_clusters_pass_over_several_partitions(seed: int) -> None:
    cfg = SimConfig(nodes=5, rate=300, restart_per_node_per_min=2.0, namespaces=2, long_reader_share=0.02,
                    groups_per_node=1, stuck_reader_every_ms=15_000, stuck_reader_ms=20_000)
    events = generate_log(cfg, 40_000, seed=seed, start_ms=T0)
    policy = Policy(retention=1_000_000, node_lease_ms=5_000, directive_interval_ms=500)
    order, directives = run_core(events, policy, partitions=3)
    assert len(directives) >= 5
    a = audit(order, directives, seed)
    assert a.violations == [], [v.detail for v in a.violations[:3]]
    assert a.holds_checked > 100 and a.checked == len(directives)


def _mutated(directives: list[dict[str, Any]], i: int, **fields: Any) -> list[dict[str, Any]]:
    ds = copy.deepcopy(directives)
    ds[i].update(fields)
    return ds


def node_log() -> list[dict[str, Any]]:
    """n1 reads at 500 then 900 (prepared tx at 700 on n2), groups and heartbeats move on."""
    seqs: dict[str, int] = {}

    def ev(node: str, type_: str, wall: int, **f: Any) -> dict[str, Any]:
        seqs[node] = seqs.get(node, -1) + 1
        return {"v": 1, "type": type_, "cluster": "c1", "node": node, "incarnation": 0, "seq": seqs[node],
                "wall_ms": T0 + wall, **f}

    return [
        {"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": T0, "nodes": {"n1": ["g1"], "n2": []}},
        ev("n1", "reader_open", 0, reader_id="r1", read_ts=500),
        ev("n2", "tx_begin", 0, tx_id="t1", begin_ts=700),
        ev("n2", "tx_prepare", 0, tx_id="t1", coordinator="n2", participants=["n2"]),
        ev("n1", "heartbeat", 10, mvcc_now=1_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": 800}]),
        ev("n2", "heartbeat", 10, mvcc_now=1_000),
        ev("n1", "heartbeat", 1_000, mvcc_now=2_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": 850}]),
        ev("n2", "heartbeat", 1_000, mvcc_now=2_000),
        ev("n1", "reader_close", 1_100, reader_id="r1"),
        ev("n1", "heartbeat", 2_000, mvcc_now=3_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": 950}]),
        ev("n2", "heartbeat", 2_000, mvcc_now=3_000),
    ]


def test_each_deliberately_wrong_directive_is_caught() -> None:
    policy = Policy(retention=100, node_lease_ms=60_000)
    order, ds = run_core(node_log(), policy)
    assert [d["safe_ts"] for d in ds] == [500, 700], ds
    assert audit(order, ds).violations == []
    cases = {
        "reader": _mutated(ds, 0, safe_ts=600),  # past r1 at 500
        "prepared tx": _mutated(ds, 1, safe_ts=750),  # past t1 (prepared) at 700
        "group": _mutated(ds, 1, safe_ts=720, retention=0),  # ... and past nothing else? t1 is 700: caught either way
        "went back": _mutated(ds, 1, safe_ts=400),
        "seq": _mutated(ds, 1, seq=5),
    }
    for what, mutated in cases.items():
        found = audit(order, mutated).violations
        assert found, f"{what}: a wrong directive went unnoticed"
        alert = found[0].alert(T0)
        assert alert["kind"] == AUDIT_KIND and alert["severity"] == "critical" and alert["cluster"] == "c1"
    detail = audit(order, cases["reader"]).violations[0].detail
    assert "passed live reader r1" in detail and "at ts 500" in detail, detail


def test_a_retention_bound_and_a_group_time_are_holds_too() -> None:
    policy = Policy(retention=100, node_lease_ms=60_000)
    order, ds = run_core(node_log(), policy)
    # after r1 closed and t1 is still open at 700: lift t1 out of the way and check the floors alone
    order = [(p, o, v) for p, o, v in order if b'"tx_begin"' not in v and b'"tx_prepare"' not in v]
    order = [(0, i, v) for i, (_p, _o, v) in enumerate(order)]
    d = {**ds[-1], "seq": 1, "positions": {"0": len(order)}, "safe_ts": 2_950}  # past the group's 950
    found = audit(order, [d]).violations
    assert any("group g1" in v.detail for v in found), [v.detail for v in found]
    d = {**d, "safe_ts": 2_901, "retention": 100}
    found = audit(order, [{**d, "safe_ts": 3_000}]).violations
    assert any("retention bound 2900" in v.detail for v in found), [v.detail for v in found]


def test_a_service_hold_binds_until_released_or_expired() -> None:
    events, policy = example("backup-hold")
    order, ds = run_core(events, policy)
    holds = [e for e in events if e["type"] == "service_hold"]
    assert holds
    held = [d for d in ds if d.get("service_holds")]
    assert held, "the example's directives carry the hold"
    i = ds.index(held[0])
    ts = min(h["ts"] for h in held[0]["service_holds"].values())
    found = audit(order, _mutated(ds, i, safe_ts=ts + 1)).violations
    assert any("service hold" in v.detail for v in found), [v.detail for v in found]


def test_a_namespaces_bound_binds_its_own_holds() -> None:
    events, policy = example("tenants")
    order, ds = run_core(events, policy)
    with_ns = [i for i, d in enumerate(ds) if d.get("namespaces")]
    assert with_ns
    i = with_ns[-1]
    ns, bound = sorted(ds[i]["namespaces"].items())[0]
    a = audit(order, ds)
    assert a.violations == []
    lifted = _mutated(ds, i, namespaces={**ds[i]["namespaces"], ns: bound + 10_000_000})
    found = audit(order, lifted).violations
    assert found, "a namespace bound moved past its own holds went unnoticed"


def test_a_directive_waits_for_the_events_it_covers() -> None:
    policy = Policy(retention=100, node_lease_ms=60_000)
    order, ds = run_core(node_log(), policy)
    a = Auditor()
    for d in _mutated(ds, 0, safe_ts=600):
        assert a.directive(json.dumps(d)) == []  # nothing read yet: it waits
    assert a.checked == 0
    found = []
    for m in order:
        found += feed(a, m)
    assert found and "reader r1" in found[0].detail
    assert a.checked == 2


def test_events_the_auditor_missed_make_it_unsure_not_wrong() -> None:
    """The auditor read a reader's open; its close was deleted before it read it (offsets skip). The job,
    which read the close, passes the reader: the auditor must not call that a violation; it checks the
    node again once the node restates its holds."""
    hb = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1", "incarnation": 1}
    events = [{"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": T0, "nodes": {"n1": []}},
              {**hb, "seq": 1, "wall_ms": T0, "mvcc_now": 1_000},
              {**hb, "type": "reader_open", "seq": 2, "wall_ms": T0 + 1, "reader_id": "r", "read_ts": 1_100},
              {**hb, "type": "reader_close", "seq": 3, "wall_ms": T0 + 2, "reader_id": "r"},
              {**hb, "seq": 4, "wall_ms": T0 + 3, "mvcc_now": 2_000},
              {**hb, "type": "snapshot", "seq": 5, "wall_ms": T0 + 4, "cut": 2_000, "readers": [], "txs": []},
              {**hb, "seq": 6, "wall_ms": T0 + 5, "mvcc_now": 3_000}]
    order, directives = run_core(events, Policy())
    assert [d["safe_ts"] for d in directives] == [1_000, 2_000, 3_000]
    seen = [m for m in order if m[1] != 3]  # the close was deleted before the auditor read it
    a = audit(seen, directives)
    assert a.violations == [] and a.unsure_holds >= 1, "unsure of n1 until its snapshot, not wrong"
    assert a.checked == 3
    full = audit(order, directives)
    assert full.violations == [] and full.unsure_holds == 0


def test_a_control_event_on_the_events_topic_holds_nothing_unless_the_policy_takes_it() -> None:
    """The job refuses a control event found on the events topic (``core/origin.py``): a forged hold
    there is no hold the directives must respect, unless ``control_on_events_topic`` applies it."""
    policy = Policy(retention=100, node_lease_ms=60_000)
    order, ds = run_core(node_log(), policy)
    forged = json.dumps({"v": 1, "type": "service_hold", "cluster": "c1", "holder": "forged", "ts": 1,
                         "ttl_ms": 3_600_000, "wall_ms": T0 + 1, "action_id": "forged"}).encode()
    first = order[0]
    shifted = [first, (first[0], first[1] + 1, forged)] + [(p, o + (p == first[0]), v) for p, o, v in order[1:]]
    moved = [{**d, "positions": {k: o + (k == position_key(first[0])) for k, o in d["positions"].items()}} for d in ds]
    assert audit(shifted, moved).violations == [], "refused by the job: it holds nothing"
    a = Auditor(control_on_events_topic=lambda cluster: cluster == "c1")
    for m in shifted:
        feed(a, m)
    found = [v for d in moved for v in a.directive(json.dumps(d))]
    assert any("service hold forged" in v.detail for v in found), [v.detail for v in found]


def test_an_event_without_the_signature_its_cluster_requires_holds_nothing() -> None:
    """With ``node_key_secret`` the job refuses a node event its node did not sign: the auditor,
    given the same settings, does not take the forged reader for a live hold."""
    from safepoint.core.policy import Policies
    from safepoint.core.signing import node_key, sign_node
    from safepoint.ops.audit import signatures

    secret = "audit-secret"
    policy = Policy(retention=100, node_lease_ms=60_000, node_key_secret=secret)
    signed_log = [e if "node" not in e else {**e, "sig": sign_node(e, node_key(secret, "c1", e["node"]))}
                  for e in node_log()]
    order, ds = run_core(signed_log, policy)
    forged = json.dumps({"v": 1, "type": "reader_open", "cluster": "c1", "node": "n1", "incarnation": 0, "seq": 99,
                         "wall_ms": T0 + 1, "reader_id": "forged", "read_ts": 1}).encode()
    first = order[0]
    shifted = [first, (first[0], first[1] + 1, forged)] + [(p, o + (p == first[0]), v) for p, o, v in order[1:]]
    moved = [{**d, "positions": {k: o + (k == position_key(first[0])) for k, o in d["positions"].items()}} for d in ds]
    checked = Auditor(signed=signatures(Policies(policy)))
    for m in shifted:
        feed(checked, m)
    assert [v for d in moved for v in checked.directive(json.dumps(d))] == [], "refused by the job: it holds nothing"
    blind = Auditor()
    for m in shifted:
        feed(blind, m)
    assert any("forged" in v.detail for d in moved for v in blind.directive(json.dumps(d)))
