"""Cost per hold: a node's history curve (``history_above`` on its heartbeats) turns into the
bytes each hold alone keeps, in the status (holds ranked by cost), the directive's blocker and the
stall alert; without a curve costs are unknown and holds rank by age."""

from __future__ import annotations

import json
from typing import Any

from safepoint.core import Policy
from safepoint.core.cost import History, layer_costs
from safepoint.core.engine import Engine, Position
from safepoint.core.status import by_cost
from safepoint.replay import final_status

from core_helpers import NodeClient, Run, restore_engine, topology

T0 = 1_700_000_000_000
POLICY = Policy(retention=1_000, node_lease_ms=600_000, stall_ms=5_000, expire_enabled=False)
CURVE = [{"ts": 100, "bytes": 9_000}, {"ts": 400, "bytes": 6_000}, {"ts": 900, "bytes": 1_000}]
"""Bytes above ts: 9,000 above 100, falling by 10 a unit to 6,000 at 400, then by 10 a unit to
1,000 at 900, then to 0 at ``mvcc_now`` (2,000 in the tests)."""


def test_the_curve_is_read_in_ts_order_as_a_running_minimum() -> None:
    h = History.of([{"ts": 400, "bytes": 6_000}, {"ts": 100, "bytes": 9_000}, {"ts": 900, "bytes": 7_000},
                    {"ts": 100, "bytes": 9_500}])
    assert h.points == [[100, 9_000], [400, 6_000], [900, 6_000]]
    assert History.of([]).above(5, 10) == 0


def test_between_points_the_curve_is_a_line_and_it_falls_to_zero_at_mvcc_now() -> None:
    h = History.of(CURVE)
    assert [h.above(ts, 2_000) for ts in (0, 100, 250, 400, 650, 900)] == [9_000, 9_000, 7_500, 6_000, 3_500, 1_000]
    assert [h.above(ts, 2_000) for ts in (1_450, 2_000, 3_000)] == [500, 0, 0]
    assert h.above(1_450, None) == 1_000, "without mvcc_now nothing past the last point is guessed"


def test_each_hold_is_charged_its_layer_up_to_the_next_hold_or_the_floor() -> None:
    h = History.of(CURVE)
    costs = layer_costs([(100, "a"), (400, "b"), (400, "c"), (650, "d"), (1_500, "e")], 900, h, 2_000)
    assert costs == {"a": 3_000, "b": 1_250, "c": 1_250, "d": 2_500, "e": 0}
    assert sum(costs.values()) == h.above(100, 2_000) - h.above(900, 2_000)
    assert layer_costs([(650, "d")], None, h, 2_000) == {"d": 3_500}, "no floor: up to mvcc_now"


def node_log(history: bool = True) -> tuple[list[dict[str, Any]], NodeClient, NodeClient]:
    """n1 with readers at 100, 400 and 650, then at mvcc_now 2,000 (retention bound 1,000) with a
    history curve on its heartbeats; n2 without one, its reader at 300 older than two of n1's."""
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    extra = {"history_above": CURVE} if history else {}
    log = [n1.hb(T0, 100), n2.hb(T0, 100), n1.open("r-report", 100, T0 + 1, label="monthly report"),
           n1.open("r-mid", 400, T0 + 2), n1.open("r-young", 650, T0 + 3), n2.open("r-n2", 300, T0 + 4),
           topology(1, T0 + 5, {"n1": [], "n2": []}), n1.hb(T0 + 6, 2_000, **extra), n2.hb(T0 + 6, 2_000)]
    return log, n1, n2


def test_the_blocker_carries_its_cost_in_directives_and_the_status_ranks_holds_by_cost() -> None:
    run = Run(POLICY)
    log, _n1, _n2 = node_log()
    run.feed(*log)
    blocker = run.directives()[-1]["blocker"]
    assert (blocker["node"], blocker["id"], blocker["cost_bytes"]) == ("n1", "r-report", 9_000 - 6_000)
    status = final_status(run.engine)["clusters"][0]
    assert status["blocker"]["cost_bytes"] == 3_000
    costs = {h["id"]: h["cost_bytes"] for h in status["holds"] if h["kind"] == "reader"}
    assert costs == {"r-report": 3_000, "r-mid": 2_500, "r-young": 3_500 - 909, "r-n2": None}
    ranked = [h["id"] for h in by_cost(status["holds"])][:4]
    assert ranked == ["r-report", "r-young", "r-mid", "r-n2"], "costliest first; unknown cost last"
    n1 = next(n for n in status["nodes"] if n["node"] == "n1")
    assert n1["held_bytes"] == 9_000 - 909, "up to the retention bound 1,000: 909 bytes above it"


def test_closing_the_blocker_moves_the_cost_to_the_next_hold() -> None:
    run = Run(POLICY)
    log, n1, n2 = node_log()
    run.feed(*log, n1.close("r-report", T0 + 7))
    blocker = run.directives()[-1]["blocker"]
    assert (blocker["node"], blocker["id"]) == ("n2", "r-n2"), "n2's reader at 300 is the lowest now"
    assert "cost_bytes" not in blocker, "n2 sends no curve"
    run.feed(n2.close("r-n2", T0 + 8))
    blocker = run.directives()[-1]["blocker"]
    assert (blocker["id"], blocker["cost_bytes"]) == ("r-mid", 2_500)
    status = final_status(run.engine)["clusters"][0]
    mid = next(h for h in status["holds"] if h["id"] == "r-mid")
    assert mid["cost_bytes"] == 2_500


def test_without_a_curve_costs_are_unknown_and_holds_rank_by_age() -> None:
    run = Run(POLICY)
    log, _n1, _n2 = node_log(history=False)
    run.feed(*log)
    assert "cost_bytes" not in run.directives()[-1]["blocker"]
    status = final_status(run.engine)["clusters"][0]
    assert all(h["cost_bytes"] is None for h in status["holds"])
    assert by_cost(status["holds"]) == status["holds"]
    assert all(n["held_bytes"] is None for n in status["nodes"])


def test_the_stall_alert_names_what_the_blocker_keeps() -> None:
    run = Run(POLICY)
    log, n1, n2 = node_log()
    run.feed(*log, *[n2.hb(T0 + 1_000 * s, 2_000) for s in range(1, 8)], *[n1.hb(T0 + 1_000 * s, 2_000, history_above=CURVE) for s in range(1, 8)])
    [stall] = run.alerts("stall", "raised")
    assert "r-report" in stall["detail"] and "keeps 3000 bytes" in stall["detail"], stall["detail"]


def test_costs_are_the_same_through_a_restore_and_with_every_event_walked() -> None:
    """The curve is part of the node's stored state; the cost of the lowest hold is the same
    whether the node walks its holds on every event (its state read back before each: the full
    path) or not."""
    log, n1, _n2 = node_log()
    log += [n1.open("r-between", 200, T0 + 10), n1.close("r-mid", T0 + 11), n1.open("r-low", 50, T0 + 12),
            n1.hb(T0 + 13, 2_100, history_above=[{"ts": 0, "bytes": 12_000}, *CURVE]), n1.close("r-low", T0 + 14),
            n1.hb(T0 + 5_000, 2_200)]
    values = [json.dumps(ev) for ev in log]

    def outputs(full: bool, restore_at: int | None) -> list[Any]:
        engine = Engine(POLICY)
        out: list[Any] = []
        for i, v in enumerate(values):
            if full or i == restore_at:
                restore_engine(engine)
            out += [o.value for o in engine.process(v, Position("events", 0, i, None))]
        return out

    plain = outputs(False, None)
    assert any((d.get("blocker") or {}).get("cost_bytes") for d in plain if d.get("type") == "compaction")
    assert outputs(True, None) == plain
    assert outputs(False, 9) == plain


def test_the_client_writes_a_curve_as_the_contract_does_and_thins_a_long_one() -> None:
    from safepoint.connectors.heartbeat import MAX_HISTORY_POINTS, history_points

    assert history_points([(1, 10), {"ts": 2, "bytes": 5}]) == [{"ts": 1, "bytes": 10}, {"ts": 2, "bytes": 5}]
    long = history_points([(t, 1_000 - t) for t in range(1_000)])
    assert len(long) == MAX_HISTORY_POINTS and long[0]["ts"] == 0 and long[-1]["ts"] == 999


def test_the_api_ranks_holds_by_cost_and_the_metrics_name_the_costliest() -> None:
    from fastapi.testclient import TestClient

    from safepoint.core.codec import encode
    from safepoint.core.status import cluster_status, node_status, status_key
    from safepoint.ops.http_api import make_app
    from safepoint.ops.status_store import StatusStore

    run = Run(POLICY)
    log, _n1, _n2 = node_log()
    run.feed(*log)
    store = StatusStore()
    engine = run.engine
    for (cluster, node), ns in engine.nodes.items():
        store.apply_raw(status_key(cluster, node).encode(), encode(node_status(ns, POLICY)).encode())
    for name, cs in engine.clusters.items():
        store.apply_raw(status_key(name).encode(), encode(cluster_status(cs, POLICY)).encode())
    assert store.bad == 0, store.skipped
    client = TestClient(make_app(store, mvcc_unit="ms"))
    by_age = [h["id"] for h in client.get("/api/v1/clusters/default/holds?limit=3").json()["holds"]]
    assert by_age == ["r-report", "r-n2", "r-mid"]
    by_cost_ = client.get("/api/v1/clusters/default/holds?order=cost&limit=4").json()["holds"]
    assert [(h["id"], h["cost_bytes"]) for h in by_cost_] == [("r-report", 3_000), ("r-young", 2_591), ("r-mid", 2_500),
                                                             ("r-n2", None)]
    assert client.get("/api/v1/clusters/default/holds?order=size").status_code == 422
    metrics = client.get("/metrics").text
    assert 'safepoint_hold_pinned_bytes{cluster="default",id="r-report",kind="reader",node="n1"} 3000.0' in metrics
    assert 'safepoint_blocker_pinned_bytes{cluster="default"} 3000.0' in metrics
    assert 'id="r-n2"' not in metrics, "a hold of unknown cost has no series"
    assert 'const MVCC_UNIT = "ms"' in client.get("/").text
