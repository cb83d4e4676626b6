"""Holes an adversarial review of the rules found; each test failed before its fix."""

from __future__ import annotations

import json

from safepoint.core import DIRECTIVES, NodeState, Policy
from safepoint.core.ids import join_id, split_id
from safepoint.core.records import Expiry

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000
PRESSURE = dict(pinned_critical_enter_bytes=100, pinned_critical_exit_bytes=80, pinned_warning_enter_bytes=50,
                pinned_warning_exit_bytes=40, band_enter_window_ms=0, band_exit_window_ms=0, expire_after_ms=0,
                max_reader_lifetime_ms=0, expire_grace_ms=1_000, max_expiries_per_window=10)


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


def test_a_reader_and_a_transaction_with_one_id_are_two_holds_for_forced_expiry() -> None:
    run = Run(Policy(**PRESSURE))
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": []}), n1.hb(T0, 1_000))
    run.feed(n1.open("h1", 500, T0 + 1), n1.begin("h1", 600, T0 + 1))
    outs = run.feed(n1.hb(T0 + 2, 1_000, pinned_bytes=500), n1.hb(T0 + 3, 1_000, pinned_bytes=500))
    keys = sorted(o.key for o in outs if o.channel == DIRECTIVES and o.value["type"] == "expire")
    assert keys == ["default/n1/reader/h1", "default/n1/tx/h1"]
    assert sorted(raised_ids(run, "forced_expiry")) == ["default/forced_expiry/n1/reader/h1",
                                                        "default/forced_expiry/n1/tx/h1"]
    run.feed(n1.close("h1", T0 + 4))
    assert [a["id"] for a in run.alerts("forced_expiry", "cleared")] == ["default/forced_expiry/n1/reader/h1"]
    # the transaction is still expiring: after the grace period it turns hard
    outs = run.feed(n1.hb(T0 + 2_000, 1_000, pinned_bytes=500))
    hard = [o.value for o in outs if o.channel == DIRECTIVES and o.value["type"] == "expire"]
    assert [(e.get("tx_id"), e["mode"]) for e in hard] == [("h1", "hard")]


def test_an_older_state_of_expiries_restores() -> None:
    data = {"c": "default", "n": "n1", "i": 0, "s": 1, "w": T0, "r": {"r1": [5, T0, None, 0]},
            "ex": {"r1": ["reader", "graceful", T0]}}  # state version 1, before kinds were told apart
    restored = NodeState.from_json(json.loads(json.dumps(data)))
    assert restored.expiries == {"reader/r1": Expiry("reader", "graceful", T0, "r1")}
    assert "ex" not in restored.to_json() and restored.to_json()["expiries"] == {"reader/r1": ["reader", "graceful", T0, "r1"]}


def test_a_hold_listed_twice_keeps_the_lower_entry() -> None:
    for readers in ([{"reader_id": "r1", "read_ts": 500}, {"reader_id": "r1", "read_ts": 900}],
                    [{"reader_id": "r1", "read_ts": 900}, {"reader_id": "r1", "read_ts": 500}]):
        run = Run()
        n1 = NodeClient("n1")
        run.feed(topology(1, T0, {"n1": []}), n1.snapshot(T0, readers=readers, txs=[
            {"tx_id": "t1", "begin_ts": 800}, {"tx_id": "t1", "begin_ts": 700}]), n1.hb(T0, 2_000))
        assert run.last_safe_ts() == 500
    groups = [{"group": "g", "leader": True, "published_min_tx_time": 300},
              {"group": "g", "leader": False, "published_min_tx_time": 100}]
    run = Run()
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": []}), n1.hb(T0, 2_000, groups=groups))
    assert run.last_safe_ts() == 100
    groups[0]["published_min_tx_time"] = None  # one entry says the leader has not published: unknown
    run.feed(n1.hb(T0 + 1, 3_000, groups=groups))
    assert run.last_safe_ts() == 100
    assert [a["kind"] for a in run.alerts(state="raised")] == ["unknown_node_min"]


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


def test_wall_ms_zero_is_a_time_for_the_in_doubt_timer() -> None:
    run = Run(in_doubt_timeout_ms=1_000)
    n1 = NodeClient("n1")
    run.feed(topology(1, 0, {"n1": []}), n1.hb(0, 1_000), n1.begin("t1", 900, 0), n1.prepare("t1", 0))
    # a snapshot before the timeout names the prepared transaction again: it was prepared at 0, not now
    run.feed(n1.snapshot(500, readers=[], txs=[{"tx_id": "t1", "begin_ts": 900, "prepared": True}]))
    run.feed(n1.hb(1_000, 1_000))
    [a] = run.alerts("in_doubt_tx", "raised")
    assert (a["since_wall_ms"], a["value"]) == (0, 1_000)
