"""The cluster stage: topology, discovery, leases, the monotonic safe point, horizon violations,
the catalog floor, directive numbering, rate limiting and alert de-duplication.

Each test cites the section of docs/contract.md ("CONTRACT") it checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from safepoint.core import ClusterState, NodeState
from safepoint.core.codec import encode
from safepoint.core.directives import BASIS_LISTED
from safepoint.core.ids import join_id, split_id

from core_helpers import NodeClient, Run, cluster_event, topology, two_node_cluster

T0 = 1_700_000_000_000
LEASE = 30_000


def catalog(version: int, catalog_version: int, activated_at: int) -> dict[str, object]:
    return cluster_event("catalog", version, T0, catalog_version=catalog_version, activated_at=activated_at)


def index_build(version: int, index: str, catalog_version: int, state: str) -> dict[str, object]:
    return cluster_event("index_build", version, T0, index=index, catalog_version=catalog_version, state=state)


def rebalance(version: int, group: str, catalog_version: int, state: str) -> dict[str, object]:
    return cluster_event("rebalance", version, T0, group=group, catalog_version=catalog_version, state=state)


# -- topology ----------------------------------------------------------------------------------


def test_global_minimum_is_over_topology_nodes_only() -> None:
    """CONTRACT Semantics: Global minimum = the minimum of local_min over the nodes of the current topology."""
    run = Run()
    n1, n2, outsider = NodeClient("n1"), NodeClient("n2"), NodeClient("n9")
    run.feed(topology(1, T0, {"n1": [], "n2": []}))
    run.feed(outsider.open("r", 5, T0), outsider.hb(T0, 10))
    run.feed(n1.hb(T0, 1_000), n2.hb(T0, 2_000))
    [d] = run.directives()
    assert d["safe_ts"] == 1_000
    assert d["blocker"]["node"] == "n1"
    assert set(d["basis"]) == {"n1", "n2"}, "basis names exactly the members"
    assert d["basis"]["n2"] == {"incarnation": 0, "seq": 0, "local_min": 2_000}


def test_topology_node_that_never_reported_aborts_the_round() -> None:
    """CONTRACT Semantics: the round is aborted when a topology node has never reported, and the
    alert names the reason from the first aborted round on (no grace hides it).

    Seed 000 (Ignite): aborted when the logical topology is missing some node required by catalog.
    """
    run = Run(node_lease_ms=LEASE)
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": [], "n2": []}), n1.hb(T0, 1_000))
    [a] = run.alerts("missing_node", "raised")
    assert a["node"] == "n2" and "never reported" in a["detail"] and a["severity"] == "warning"
    assert a["cluster"] == "default" and a["id"] == "default/missing_node/n2" and a["since_wall_ms"] == T0
    run.feed(n1.hb(T0 + LEASE, 1_000))
    assert run.directives() == []
    assert len(run.alerts()) == 1, "raised once, not again on every event"
    n2 = NodeClient("n2")
    run.feed(n2.hb(T0 + LEASE + 1, 900))
    [c] = run.alerts("missing_node", "cleared")
    assert c["node"] == "n2" and c["since_wall_ms"] == T0 and c["cluster_wall_ms"] == T0 + LEASE + 1
    assert [d["safe_ts"] for d in run.directives()] == [900]


def test_a_node_a_new_topology_adds_is_alerted_at_once() -> None:
    """A node a topology names before it said anything aborts the round at once and is alerted at
    once (``missing_node``, warning), at the cluster time the topology arrived."""
    run = Run(node_lease_ms=LEASE)
    n1 = NodeClient("n1")
    run.feed(n1.hb(T0, 1_000), n1.hb(T0 + 5_000, 1_000), topology(1, T0, {"n1": [], "late": []}))
    [a] = run.alerts("missing_node", "raised")
    assert a["node"] == "late" and a["since_wall_ms"] == T0 + 5_000
    run.feed(n1.hb(T0 + 5_000 + LEASE, 1_000))
    assert len(run.alerts()) == 1
    assert run.directives() == []


def test_missing_required_group_aborts_the_round() -> None:
    """CONTRACT Semantics: aborted when a node does not report a required group.

    Seed 000 (Ignite): abort when some node is missing a required replication group.
    """
    run = Run()
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": ["g1", "g2"], "n2": ["g2"]}))
    g1 = {"group": "g1", "leader": True, "published_min_tx_time": 1_000}
    run.feed(n1.hb(T0, 1_000, groups=[g1]),
             n2.hb(T0, 1_000, groups=[{"group": "g2", "leader": True, "published_min_tx_time": 1_000}]))
    assert run.directives() == []
    [a] = run.alerts("missing_group", "raised")
    assert a["node"] == "n1" and "g2" in a["detail"] and a["value"] == 1
    run.feed(n1.hb(T0 + 1, 1_000, groups=[g1, {"group": "g2"}]))
    assert len(run.alerts("missing_group", "cleared")) == 1
    assert [d["safe_ts"] for d in run.directives()] == [1_000]


def test_topology_change_removing_a_node_clears_its_alert_and_releases_the_round() -> None:
    """CONTRACT Semantics: the topology says which nodes must report; a later topology replaces it."""
    run = Run(node_lease_ms=LEASE)
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": [], "gone": []}), n1.hb(T0, 1_000), n1.hb(T0 + LEASE, 1_000))
    assert run.alerts("missing_node", "raised")
    run.feed(topology(2, T0, {"n1": []}))
    assert len(run.alerts("missing_node", "cleared")) == 1
    assert [d["safe_ts"] for d in run.directives()] == [1_000]


def test_stale_topology_version_is_ignored_and_counted() -> None:
    """CONTRACT Cluster events: `version` is strictly increasing per cluster and type."""
    run = Run()
    n1 = NodeClient("n1")
    run.feed(topology(5, T0, {"n1": []}), n1.hb(T0, 1_000))
    assert run.feed(topology(5, T0, {"n1": [], "n2": []}), topology(3, T0, {"n2": []})) == []
    assert run.engine.clusters["default"].members.topology == {"n1": []}
    # versions are per type: a catalog with version 1 is not stale next to topology version 5
    run.feed(catalog(1, 1, 500))
    assert run.counts == {"applied": 3, "ignored:stale_version": 2}


def test_clusters_are_independent() -> None:
    """CONTRACT Events: `cluster` names the cluster; each cluster has its own safe point and directive seq."""
    run = Run()
    a1, b1 = NodeClient("n1", cluster="a"), NodeClient("n1", cluster="b")
    run.feed(topology(1, T0, {"n1": []}, cluster="a"), topology(1, T0, {"n1": []}, cluster="b"))
    run.feed(a1.hb(T0, 100), b1.hb(T0, 5_000), a1.hb(T0, 200))
    got = [(d["cluster"], d["seq"], d["safe_ts"]) for d in run.directives()]
    assert got == [("a", 1, 100), ("b", 1, 5_000), ("a", 2, 200)]
    assert [o.key for o in run.outputs if o.value["type"] == "compaction"] == ["a", "b", "a"], \
        "CONTRACT Directives: key is the cluster id"
    assert [(o.key, o.value["nodes"]) for o in run.outputs if o.value["type"] == "members"] == [
        ("a/%members", ["n1"]), ("b/%members", ["n1"])], "each cluster's member set, once: it did not change"


def test_a_directive_stays_small_however_many_members() -> None:
    """CONTRACT Directives: the basis names at most a few nodes (the lowest minima); the member set
    goes out as a members record with the first directive after it changed."""
    run = Run()
    nodes = [NodeClient(f"n{i:02}") for i in range(40)]
    run.feed(topology(1, T0, {n.node: [] for n in nodes}))
    run.feed(*[n.hb(T0 + i, 1_000 + 7 * ((i * 13) % 40)) for i, n in enumerate(nodes)])
    [d] = run.directives()
    lowest = sorted((1_000 + 7 * ((i * 13) % 40), n.node) for i, n in enumerate(nodes))[:BASIS_LISTED]
    assert [(b["local_min"], name) for name, b in d["basis"].items()] == lowest, "the lowest minimums, lowest first"
    assert d["members"] == 40 and d["positions"] == {"0": 41}
    assert len(encode(d)) < 1_500
    [m] = [o.value for o in run.outputs if o.value["type"] == "members"]
    assert m == {"v": 1, "type": "members", "cluster": "default", "seq": 1, "nodes": sorted(n.node for n in nodes)}
    run.feed(nodes[0].hb(T0 + 100, 9_000))
    assert [o.value["type"] for o in run.outputs[-1:]] == ["compaction"], "the same members: no new record"
    blocker = run.directives()[-1]["blocker"]["node"]  # the lowest member now: its next beat advances the safe point
    run.feed(topology(2, T0 + 101, {n.node: [] for n in nodes[1:]}),
             next(n for n in nodes if n.node == blocker).hb(T0 + 102, 9_000))
    records = [o.value for o in run.outputs if o.value["type"] == "members"]
    assert len(records) == 2 and records[-1]["nodes"] == sorted(n.node for n in nodes[1:])
    assert records[-1]["seq"] == run.directives()[-1]["seq"]


# -- discovery window --------------------------------------------------------------------------


def test_discovery_window_without_topology() -> None:
    """CONTRACT Semantics: before any topology event the topology is the set of nodes seen, and no
    directive is emitted until cluster time is node_lease_ms past the cluster's first event."""
    run = Run(node_lease_ms=LEASE)
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(n1.hb(T0, 1_000))
    run.feed(n2.open("r", 400, T0 + LEASE - 1), n2.hb(T0 + LEASE - 1, 2_000))
    assert run.outputs == [], "no directive and no alert inside the window"
    run.feed(n1.hb(T0 + LEASE, 1_500))
    [d] = run.directives()
    assert d["safe_ts"] == 400 and d["cluster_wall_ms"] == T0 + LEASE
    assert set(d["basis"]) == {"n1", "n2"}


def test_discovery_window_node_silent_since_first_event_is_stale() -> None:
    """CONTRACT Semantics (discovery): every live node has had a lease to report; one that went
    silent is stale and aborts the round until a topology says otherwise."""
    run = Run(node_lease_ms=LEASE)
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(n2.hb(T0, 100), n1.hb(T0 + LEASE + 1, 1_000))
    assert run.directives() == []
    [a] = run.alerts("missing_node", "raised")
    assert a["node"] == "n2" and a["value"] == LEASE + 1 and a["threshold"] == LEASE
    run.feed(topology(1, T0 + LEASE + 1, {"n1": []}))
    assert run.alerts("missing_node", "cleared")
    assert [d["safe_ts"] for d in run.directives()] == [1_000]


def test_topology_ends_the_discovery_window() -> None:
    """CONTRACT Semantics: the discovery window applies only before any `topology` event."""
    run = Run(node_lease_ms=LEASE)
    n1 = NodeClient("n1")
    run.feed(n1.hb(T0, 1_000))
    assert run.directives() == []
    run.feed(topology(1, T0, {"n1": []}))
    assert [d["safe_ts"] for d in run.directives()] == [1_000]


# -- leases ------------------------------------------------------------------------------------


def test_lease_stale_node_aborts_and_alert_is_raised_then_cleared() -> None:
    """CONTRACT Semantics: Lease: a node whose last event is older than node_lease_ms in cluster
    time is stale; a stale topology node aborts the round (the safe point holds where it is)."""
    run = Run(node_lease_ms=LEASE)
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    assert [d["safe_ts"] for d in run.directives()] == [1_000]
    run.feed(n2.hb(T0 + 10, 2_000))
    run.feed(n1.hb(T0 + 10 + LEASE, 2_000))  # n2 is exactly node_lease_ms old: not older, not stale
    assert run.alerts() == []
    assert [d["safe_ts"] for d in run.directives()] == [1_000, 2_000]
    run.feed(n1.hb(T0 + 11 + LEASE, 3_000))
    [a] = run.alerts("missing_node", "raised")
    assert a["node"] == "n2" and a["value"] == LEASE + 1 and a["threshold"] == LEASE
    assert "stale" in a["detail"]
    run.feed(n1.hb(T0 + 12 + LEASE, 4_000), n1.hb(T0 + 13 + LEASE, 5_000))
    assert [d["safe_ts"] for d in run.directives()] == [1_000, 2_000], "the safe point holds"
    assert len(run.alerts()) == 1, "raised once, not on every event"
    run.feed(n2.hb(T0 + 14 + LEASE, 6_000))
    [c] = run.alerts("missing_node", "cleared")
    assert c["node"] == "n2" and c["since_wall_ms"] == T0 + 11 + LEASE
    assert [d["safe_ts"] for d in run.directives()] == [1_000, 2_000, 5_000]


def test_cluster_time_is_the_largest_wall_ms_seen() -> None:
    """CONTRACT Time: cluster time = the largest wall_ms seen from any node of the cluster."""
    run = Run(node_lease_ms=LEASE)
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(n1.hb(T0 + 5_000, 1_500), n2.hb(T0 + 100, 2_000))  # n2's clock lags
    assert run.directives()[-1]["cluster_wall_ms"] == T0 + 5_000


def test_lease_uses_event_time_not_arrival() -> None:
    """CONTRACT Principle: every decision is computed from the events' own fields (a late batch
    of old events does not make a node stale)."""
    run = Run(node_lease_ms=LEASE)
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    for i in range(1, 50):
        run.feed(n1.hb(T0 + i * 1_000, 1_000 + i), n2.hb(T0 + i * 1_000, 1_000 + i))
    assert run.alerts() == []
    assert run.last_safe_ts() == 1_049


# -- the safe point ------------------------------------------------------------------------------


def test_safe_ts_never_goes_backwards() -> None:
    """CONTRACT Semantics: Safe point: safe_ts = max(previous safe_ts, global minimum); it never goes backwards.

    Seed 001 (YugabyteDB): the committed history cutoff only grows; seed 003: the floor never regresses.
    """
    run = Run()
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(n1.hb(T0, 3_000), n2.hb(T0, 3_000))
    assert run.last_safe_ts() == 3_000
    n3 = NodeClient("n3")
    run.feed(topology(2, T0, {"n1": [], "n2": [], "n3": []}), n3.hb(T0, 500))
    run.feed(n1.hb(T0, 100))  # a node's clock goes back
    assert run.last_safe_ts() == 3_000
    assert len(run.directives()) == 2, "no directive: neither safe_ts nor catalog_floor advanced"
    run.feed(n1.hb(T0, 4_000), n3.hb(T0, 4_000))
    assert run.last_safe_ts() == 3_000
    run.feed(n2.hb(T0, 4_500))
    assert run.last_safe_ts() == 4_000


def test_directive_seq_grows_by_one() -> None:
    """CONTRACT Directives: `seq` grows by one with every directive of the cluster."""
    run = Run()
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": []}))
    for i in range(10):
        run.feed(n1.hb(T0 + i, 1_000 + i * 10))
        run.feed(n1.hb(T0 + i, 1_000 + i * 10))  # no advance, no directive
    ds = run.directives()
    assert [d["seq"] for d in ds] == list(range(1, 11))
    assert [d["safe_ts"] for d in ds] == [1_000 + i * 10 for i in range(10)]


def test_reader_at_safe_ts_is_protected_and_not_a_violation() -> None:
    """CONTRACT Semantics: a reader with read_ts >= safe_ts is always protected (the bound is inclusive)."""
    run = Run()
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(n1.open("r", 1_000, T0), n1.hb(T0, 5_000), n2.hb(T0, 5_000))
    assert run.alerts() == []
    assert run.last_safe_ts() == 1_000


def test_horizon_violation_raised_and_cleared_and_safe_ts_not_lowered() -> None:
    """CONTRACT Semantics: Horizon violation: a hold below the current safe_ts raises a critical
    horizon_violation alert naming the node and the hold; it never lowers safe_ts."""
    run = Run()
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    outs = run.feed(n2.open("late", 700, T0 + 5))
    assert [o.channel for o in outs] == ["alerts"]
    [a] = run.alerts("horizon_violation", "raised")
    assert a["severity"] == "critical" and a["node"] == "n2"
    assert a["value"] == 700 and a["threshold"] == 1_000
    assert "late" in a["detail"] and a["id"] == "default/horizon_violation/n2/reader/late"
    assert outs[0].key == "n2", "CONTRACT Topics: alerts are keyed by node id (or cluster id)"
    run.feed(n1.hb(T0 + 6, 2_000), n2.hb(T0 + 6, 2_000))
    assert [d["safe_ts"] for d in run.directives()] == [1_000], "the violating reader still holds"
    run.feed(n2.close("late", T0 + 7))
    [c] = run.alerts("horizon_violation", "cleared")
    assert c["node"] == "n2" and c["since_wall_ms"] == T0 + 5 and c["severity"] == "critical"
    assert [d["safe_ts"] for d in run.directives()] == [1_000, 2_000]


def test_horizon_violation_for_a_transaction_cleared_by_restart() -> None:
    """CONTRACT Semantics: horizon violation names the hold (transactions too); a restart that drops
    the hold ends it."""
    run = Run()
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(n1.begin("t", 10, T0))
    [a] = run.alerts("horizon_violation", "raised")
    assert a["id"] == "default/horizon_violation/n1/tx/t"
    n1.restart()
    run.feed(n1.hb(T0 + 1, 1_200))
    assert len(run.alerts("horizon_violation", "cleared")) == 1


def test_horizon_violation_in_snapshot() -> None:
    """CONTRACT Events snapshot + Horizon violation: a hold first seen in a snapshot below safe_ts is a violation."""
    run = Run()
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(n1.snapshot(T0, readers=[{"reader_id": "r", "read_ts": 10}], txs=[]))
    [a] = run.alerts("horizon_violation", "raised")
    assert a["value"] == 10
    run.feed(n1.snapshot(T0, readers=[], txs=[]))
    assert len(run.alerts("horizon_violation", "cleared")) == 1


# -- catalog floor -------------------------------------------------------------------------------


def test_catalog_floor_is_newest_version_activated_at_or_before_safe_ts() -> None:
    """CONTRACT Semantics: Catalog floor = the newest catalog version activated at or before safe_ts."""
    run = Run()
    run.feed(catalog(1, 1, 100), catalog(2, 2, 500), catalog(3, 3, 2_000))
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=500)
    [d] = run.directives()
    assert (d["safe_ts"], d["catalog_floor"]) == (500, 2), "activated exactly at safe_ts counts"
    run.feed(n1.hb(T0, 1_999), n2.hb(T0, 1_999))
    assert run.directives()[-1]["catalog_floor"] == 2
    run.feed(n1.hb(T0, 5_000), n2.hb(T0, 5_000))
    assert run.directives()[-1]["catalog_floor"] == 3


def test_catalog_floor_is_null_before_any_catalog() -> None:
    """compaction.json: catalog_floor is an integer or null (no catalog version known yet)."""
    run = Run()
    two_node_cluster(run, wall=T0, mvcc=500)
    assert run.directives()[-1]["catalog_floor"] is None
    run.feed(catalog(1, 4, 600))
    assert len(run.directives()) == 1, "not active at safe_ts yet"
    run.feed(catalog(2, 3, 100))
    d = run.directives()[-1]
    assert (d["seq"], d["safe_ts"], d["catalog_floor"]) == (2, 500, 3)


def test_catalog_floor_advance_alone_emits_a_directive() -> None:
    """CONTRACT Directives: a directive is emitted when safe_ts *or catalog_floor* advances."""
    run = Run()
    two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(catalog(1, 7, 900))
    ds = run.directives()
    assert [(d["seq"], d["safe_ts"], d["catalog_floor"]) for d in ds] == [(1, 1_000, None), (2, 1_000, 7)]


def test_index_build_holds_back_the_catalog_floor() -> None:
    """CONTRACT Semantics: the floor does not advance past a version pinned by an unfinished index build.

    Seed 000 (Ignite): abort when the calculated catalog version has an index that is still building.
    """
    run = Run()
    run.feed(catalog(1, 1, 100), catalog(2, 2, 200), index_build(1, "idx_a", 2, "started"))
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(catalog(3, 3, 300))
    assert run.directives()[-1]["catalog_floor"] == 2
    run.feed(n1.hb(T0, 2_000), n2.hb(T0, 2_000))
    assert run.directives()[-1]["catalog_floor"] == 2
    run.feed(index_build(2, "idx_a", 2, "finished"))
    d = run.directives()[-1]
    assert (d["safe_ts"], d["catalog_floor"]) == (2_000, 3)


def test_rebalance_holds_back_the_catalog_floor() -> None:
    """CONTRACT Semantics: the floor does not advance past a version pinned by an unfinished rebalance.

    Seed 000 (Ignite): abort when an active rebalance refers to the calculated (or a lower) catalog version.
    """
    run = Run()
    run.feed(catalog(1, 1, 100), rebalance(1, "g1", 1, "started"), catalog(2, 2, 200))
    two_node_cluster(run, wall=T0, mvcc=1_000)
    assert run.directives()[-1]["catalog_floor"] == 1
    run.feed(rebalance(2, "g2", 2, "started"), rebalance(3, "g1", 1, "finished"))
    assert run.directives()[-1]["catalog_floor"] == 2
    run.feed(catalog(3, 3, 300))
    assert run.directives()[-1]["catalog_floor"] == 2
    run.feed(rebalance(4, "g2", 2, "finished"))
    assert run.directives()[-1]["catalog_floor"] == 3


def test_catalog_floor_never_goes_backwards() -> None:
    """CONTRACT Semantics: versions below the floor may be dropped, so the floor cannot come back down."""
    run = Run()
    run.feed(catalog(1, 5, 100))
    two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(index_build(1, "late", 2, "started"))
    run.feed(catalog(2, 6, 200))
    assert [d["catalog_floor"] for d in run.directives()] == [5]


# -- rate limiting and alerts ---------------------------------------------------------------------


def test_directive_interval_rate_limits_directives() -> None:
    """Policy directive_interval_ms: least cluster time between two directives of one cluster;
    the held-back advance goes out with the next event after the interval."""
    run = Run(directive_interval_ms=1_000)
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    run.feed(n1.hb(T0 + 500, 2_000), n2.hb(T0 + 500, 2_000))
    run.feed(n1.hb(T0 + 999, 3_000), n2.hb(T0 + 999, 3_000))
    assert [d["safe_ts"] for d in run.directives()] == [1_000]
    run.feed(n1.hb(T0 + 1_000, 3_000))  # nothing changes, but the held-back advance is due
    ds = run.directives()
    assert [(d["seq"], d["safe_ts"], d["cluster_wall_ms"]) for d in ds] == [(1, 1_000, T0), (2, 3_000, T0 + 1_000)]


def test_alerts_only_on_change() -> None:
    """CONTRACT Alerts: an alert is emitted on a change of state or severity, not on every batch."""
    run = Run(node_lease_ms=LEASE)
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": ["g"], "n2": []}))
    for i in range(20):
        wall = T0 + i * LEASE // 4
        run.feed(n1.hb(wall, 1_000 + i, groups=[{"group": "g", "leader": True, "published_min_tx_time": None}]))
    kinds = sorted((a["kind"], a["state"]) for a in run.alerts())
    assert kinds == [("missing_node", "raised"), ("unknown_node_min", "raised")]
    run.feed(topology(2, T0, {"n1": ["g"]}))
    for i in range(5):
        run.feed(n1.hb(T0 + 5 * LEASE + i, 2_000 + i, groups=[{"group": "g", "leader": True, "published_min_tx_time": 1_500}]))
    kinds = [(a["kind"], a["state"]) for a in run.alerts()]
    assert sorted(kinds) == sorted(
        [("missing_node", "raised"), ("unknown_node_min", "raised"), ("missing_node", "cleared"), ("unknown_node_min", "cleared")]
    )
    assert [d["safe_ts"] for d in run.directives()] == [1_500]


def test_abort_alert_raised_again_after_recovery() -> None:
    """CONTRACT Alerts: each change of state is one message: raised, cleared, raised again."""
    run = Run(node_lease_ms=LEASE)
    n1, n2 = two_node_cluster(run, wall=T0, mvcc=1_000)
    t = T0
    for _ in range(2):
        t += LEASE + 1
        run.feed(n1.hb(t, 1_000))
        t += 1
        run.feed(n2.hb(t, 1_000))
    assert [(a["kind"], a["state"]) for a in run.alerts()] == [("missing_node", "raised"), ("missing_node", "cleared")] * 2


# -- holds that became visible late, and determinism ------------------------------------------------


def test_node_joining_the_topology_with_a_hold_below_safe_ts_raises_a_violation() -> None:
    """CONTRACT Semantics: Horizon violation: *a hold below the current safe_ts* raises a critical
    alert naming the node and the hold. A node outside the topology does not hold the safe point
    back (Global minimum), so when it joins, its older holds are already below safe_ts."""
    run = Run()
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": []}), n1.hb(T0, 1_000))
    run.feed(n2.open("r-low", 1_200, T0), n2.open("r-mid", 1_500, T0), n2.hb(T0, 3_000))
    run.feed(n1.hb(T0 + 1, 2_000))
    assert run.last_safe_ts() == 2_000 and run.alerts() == [], "n2 is not a member: its readers do not count"
    outs = run.feed(topology(2, T0, {"n1": [], "n2": []}))
    a, b = run.alerts("horizon_violation", "raised")  # every hold below safe_ts, at once
    assert [o.channel for o in outs] == ["alerts", "alerts"]
    assert (a["node"], a["value"], a["threshold"], a["severity"]) == ("n2", 1_200, 2_000, "critical")
    assert a["id"] == "default/horizon_violation/n2/reader/r-low"
    assert (b["id"], b["value"]) == ("default/horizon_violation/n2/reader/r-mid", 1_500)
    run.feed(catalog(1, 3, 1_500))
    d = run.directives()[-1]
    assert (d["safe_ts"], d["catalog_floor"]) == (2_000, 3), "the floor may advance, safe_ts is not lowered"
    # the lowest closes: its alert clears, the other stays raised
    run.feed(n2.close("r-low", T0 + 2))
    assert [(x["state"], x["id"].rsplit("/", 1)[1]) for x in run.alerts("horizon_violation")] == [
        ("raised", "r-low"),
        ("raised", "r-mid"),
        ("cleared", "r-low"),
    ]
    run.feed(n2.close("r-mid", T0 + 3))
    assert len(run.alerts("horizon_violation", "cleared")) == 2
    assert run.last_safe_ts() == 2_000
    run.feed(n1.hb(T0 + 4, 2_500))
    assert run.last_safe_ts() == 2_500


def test_node_joining_with_holds_above_safe_ts_raises_nothing() -> None:
    """CONTRACT Semantics: Horizon violation is only for holds *below* safe_ts (the bound is inclusive)."""
    run = Run()
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": []}), n1.hb(T0, 1_000))
    run.feed(n2.open("r", 1_000, T0), n2.hb(T0, 3_000), topology(2, T0, {"n1": [], "n2": []}))
    assert run.alerts() == []
    run.feed(n1.hb(T0, 5_000))
    assert run.last_safe_ts() == 1_000


def discovery_end_with_unknown_nodes() -> list[dict[str, object]]:
    """Many nodes open a reader before their first heartbeat; the discovery window then ends."""
    nodes = [NodeClient(f"n{i}") for i in range(12)]
    events: list[dict[str, object]] = [n.open("r", 5, T0) for n in reversed(nodes)]
    events.append(nodes[0].hb(T0 + LEASE, 10))
    events.append(topology(1, T0, {f"ghost{i}": [] for i in range(10)} | {"n0": []}))
    events.append(nodes[0].hb(T0 + 3 * LEASE, 20))
    return events


def test_alert_order_does_not_depend_on_state_restore() -> None:
    """CONTRACT Principle: the same events give the same alerts whatever the micro-batch boundaries.
    Several abort alerts raised by one event come out in one order (sorted by alert id), also
    after the state was rebuilt from JSON."""
    events = discovery_end_with_unknown_nodes()
    whole = Run(node_lease_ms=LEASE)
    whole.feed(*events)
    split = Run(node_lease_ms=LEASE)
    for i, ev in enumerate(events):
        if i in (len(events) - 3, len(events) - 1):
            engine = split.engine
            engine.nodes = {k: NodeState.from_json(json.loads(json.dumps(s.to_json()))) for k, s in engine.nodes.items()}
            engine.clusters = {k: ClusterState.from_json(json.loads(json.dumps(s.to_json()))) for k, s in engine.clusters.items()}
        split.feed(ev)
    assert split.outputs == whole.outputs
    ids = [a["id"] for a in whole.alerts(state="raised")]
    assert ids[:11] == sorted(ids[:11]) and len(ids) > 11


_SEED_SCRIPT = """
import json, sys
sys.path.insert(0, {path!r})
from core_helpers import Run
from test_cluster import discovery_end_with_unknown_nodes
run = Run(node_lease_ms={lease})
run.feed(*discovery_end_with_unknown_nodes())
print(json.dumps([o.value for o in run.outputs]))
"""


def test_outputs_do_not_depend_on_the_hash_seed() -> None:
    """CONTRACT Operator interface: for the same configuration, replay and run emit the same
    directives and alerts for the same event log: the job's Python workers and replay run with
    different PYTHONHASHSEEDs, so no output order may come from iterating a set."""
    script = _SEED_SCRIPT.format(path=str(Path(__file__).parent), lease=LEASE)
    results = set()
    for seed in ("0", "1", "2", "3"):
        env = os.environ | {"PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=60)
        results.add(done.stdout)
    assert len(results) == 1


# -- horizon violations and alert ids at the edges ------------------------------------------------


def raised_ids(run: Run, kind: str = "horizon_violation") -> list[str]:
    return [a["id"] for a in run.alerts(kind, "raised")]


def test_a_joining_node_has_every_hold_below_safe_ts_alerted_even_behind_a_lower_group() -> None:
    run = Run()
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": []}), n1.hb(T0, 1_000))
    run.feed(n2.open("r1", 1_300, T0), n2.begin("t1", 1_400, T0),
             n2.hb(T0, 3_000, groups=[{"group": "g", "leader": False, "published_min_tx_time": 1_100}]))
    run.feed(n1.hb(T0 + 1, 2_000))
    assert run.last_safe_ts() == 2_000 and run.alerts() == []
    run.feed(topology(2, T0 + 2, {"n1": [], "n2": []}))
    assert sorted(raised_ids(run)) == [
        "default/horizon_violation/n2/group/g",
        "default/horizon_violation/n2/reader/r1",
        "default/horizon_violation/n2/tx/t1",
    ]


def test_ids_with_slashes_stay_apart() -> None:
    """Node "n1" with reader "reader/x" and node "n1/reader" with reader "x" once shared one alert id."""
    run = Run()
    a, b = NodeClient("n1"), NodeClient("n1/reader")
    run.feed(topology(1, T0, {"n1": [], "n1/reader": []}), a.hb(T0, 1_000), b.hb(T0, 1_000))
    run.feed(a.open("reader/x", 10, T0 + 1), b.open("x", 20, T0 + 1))
    ids = raised_ids(run)
    assert len(set(ids)) == 2, ids
    assert ids == ["default/horizon_violation/n1/reader/reader%2Fx", "default/horizon_violation/n1%2Freader/reader/x"]
    run.feed(b.close("x", T0 + 2))
    cleared = [x["id"] for x in run.alerts("horizon_violation", "cleared")]
    assert cleared == [ids[1]], "a clear of one is not a clear of the other"
    assert split_id(ids[0].split("/", 1)[1]) == ["horizon_violation", "n1", "reader", "reader/x"]
    assert join_id("c/1", "n%", "x") == "c%2F1/n%25/x"


def test_mvcc_now_or_a_group_time_below_safe_ts_is_a_horizon_violation() -> None:
    run = Run()
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": [], "n2": []}), n1.hb(T0, 1_000), n2.hb(T0, 1_000))
    assert run.last_safe_ts() == 1_000
    run.feed(n1.hb(T0 + 1, 800))  # the node's clock went back below the safe point
    [a] = run.alerts("horizon_violation", "raised")
    assert (a["id"], a["value"], a["threshold"]) == ("default/horizon_violation/n1/retention/-", 800, 1_000)
    assert "retention bound" in a["detail"]
    run.feed(n1.hb(T0 + 2, 1_200))
    assert [x["id"] for x in run.alerts("horizon_violation", "cleared")] == [a["id"]]
    run.feed(n2.hb(T0 + 3, 1_500, groups=[{"group": "g7", "leader": True, "published_min_tx_time": 900}]))
    assert raised_ids(run)[-1] == "default/horizon_violation/n2/group/g7"
    assert run.last_safe_ts() == 1_000, "never lowered"
