"""The live screen (``safepoint view``, ``safepoint demo``): times for time units, lags and ages
computed now, lines fitted to the width, no catalog floor until there is one, forced expiries
apart from the pressure bands, human units."""

from __future__ import annotations

from safepoint.ops.view import ViewState, human_bytes, human_ms, render_text, screen

T = 1_700_000_000_000  # ms: 2023-11-14 22:13:20 UTC


def directive(seq: int, safe_ms: int, wall: int, floor: int | None = None, **blocker: object) -> dict[str, object]:
    return {"v": 1, "type": "compaction", "cluster": "c1", "seq": seq, "safe_ts": safe_ms * 1000, "catalog_floor": floor,
            "cluster_wall_ms": wall, "blocker": {"node": "n2", "kind": "reader", "id": "r-991", "ts": safe_ms * 1000,
                                                 "age_ms": 5_000, "label": "report-job", **blocker}, "basis": {}}


def alert(kind: str, state: str, value: int, severity: str = "warning", node: str = "n1", detail: str = "") -> dict[str, object]:
    return {"v": 1, "type": "alert", "id": f"c1/{kind}/{node}", "kind": kind, "state": state, "severity": severity,
            "cluster": "c1", "node": node, "value": value, "threshold": 0, "since_wall_ms": T, "cluster_wall_ms": T,
            "detail": detail or f"{kind} {state}"}


def text(state: ViewState, now_ms: int, width: int = 100) -> str:
    return render_text(screen(state, "safepoint view 127.0.0.1:9092", "t+3s", now_ms), width)


def test_safe_points_are_times_and_the_lag_is_computed_now() -> None:
    state = ViewState("us")
    state.directive(directive(1, T - 2_000, T))
    out = text(state, T)
    assert "safepoint view 127.0.0.1:9092" in out, "the header names the command"
    assert "22:13:18.000" in out and "2 s" in out
    later = text(state, T + 40_000)  # the cluster went silent: its lag keeps growing
    assert "42 s" in later and "open 45 s" in later, "the lag and the blocker's age are as of now"


def test_the_blocker_says_what_it_alone_keeps_when_its_node_sends_a_curve() -> None:
    state = ViewState("us")
    state.directive(directive(1, T - 2_000, T, cost_bytes=3_500_000_000))
    assert "alone keeps 3.5 GB" in text(state, T, 160)
    state.directive(directive(2, T - 1_000, T))
    assert "alone keeps" not in text(state, T, 160)


def test_a_counter_unit_shows_the_numbers() -> None:
    state = ViewState("none")
    state.directive(directive(1, 7, T))
    out = text(state, T)
    assert "7000" in out and "safe_ts" in out and "22:" not in out


def test_no_catalog_floor_until_there_is_one() -> None:
    state = ViewState("us")
    state.directive(directive(1, T - 2_000, T))
    assert "None" not in text(state, T) and "catalog floor 4" not in text(state, T)
    state.directive(directive(2, T - 1_000, T + 1_000, floor=4))
    assert "catalog floor 4" in text(state, T + 1_000)


def test_lines_fit_the_width() -> None:
    state = ViewState("us")
    state.directive(directive(1, T - 2_000, T, label="a very long label " * 8))
    state.alert(alert("stall", "raised", 31_000, detail="safe point has not advanced for 31000 ms of cluster time: " * 4))
    for width in (60, 80, 132):
        lines = text(state, T, width).splitlines()
        assert max(len(x) for x in lines) <= width, (width, [x for x in lines if len(x) > width])


def test_bands_in_human_units_and_forced_expiries_apart() -> None:
    state = ViewState("us")
    state.alert(alert("pinned_bytes", "raised", 2_400_000_000, "critical"))
    state.alert(alert("reader_age", "raised", 49_000))
    expiry = {"v": 1, "type": "expire", "cluster": "c1", "node": "n1", "reader_id": "r-7", "mode": "graceful",
              "reason": "critical pinned-bytes pressure", "seq": 1, "cluster_wall_ms": T - 3_000}
    assert state.directive(expiry) == expiry
    assert state.directive(expiry) is None, "a repeat is not a new expiry"
    out = text(state, T)
    bands, expiries = out.split("forced expiries")
    assert "pinned_bytes critical (2.4 GB)" in bands and "reader_age warning (49 s)" in bands
    assert "graceful n1 r-7 3 s ago" in expiries and "r-7" not in bands
    state.alert(alert("pinned_bytes", "cleared", 10))
    assert "pinned_bytes critical" not in text(state, T).split("forced expiries")[0]


def test_human_units() -> None:
    assert [human_ms(x) for x in (850, 49_000, 720_000, 7_560_000, None)] == ["850 ms", "49 s", "12 min", "2.1 h", "?"]
    assert [human_bytes(x) for x in (512, 2_400_000_000, 3_100_000)] == ["512 B", "2.4 GB", "3.1 MB"]


def test_the_screen_shows_the_round_and_the_oldest_holds_from_the_status() -> None:
    """The view reads the status parts (the model the HTTP surface serves): why the round aborts,
    and the oldest holds with their labels and ages as of now."""
    from safepoint.core.status import cluster_status, node_status

    from core_helpers import NodeClient, Run, topology

    run = Run(retention=100, node_lease_ms=10_000)
    n1 = NodeClient("n1", "c1")
    run.feed(topology(1, T, {"n1": [], "n3": []}, cluster="c1"), n1.hb(T, 1_000))
    run.feed(n1.open("r1", 950, T + 10, label="nightly-report"), n1.hb(T + 1_000, 2_000))
    state = ViewState("counter")
    assert "round" not in text(state, T), "nothing before the first status part"
    for (cluster, node), ns in run.engine.nodes.items():
        state.status.apply(f"{cluster}/{node}", node_status(ns, run.engine.policy))
    state.status.apply("c1", cluster_status(run.engine.clusters["c1"], run.engine.policy))
    out = text(state, T + 31_000, width=160)
    assert "cluster c1: round aborted: node n3 is in the topology but never reported" in out
    assert "nightly-report" in out and "31 s" in out, "the oldest hold, open 31 s as of now"


def test_the_screen_shows_each_namespaces_bound() -> None:
    state = ViewState("counter")
    d = directive(3, 7, T)
    state.directive({**d, "namespace_safe_ts": 19_000, "namespaces": {"t0": 9_500}})
    out = text(state, T, width=160)
    assert "cluster c1 per namespace: t0 9500; every other namespace 19000" in out


def test_a_safe_point_reads_as_a_utc_time_where_the_unit_is_a_time() -> None:
    assert ViewState("us").ts_full(1_795_836_637_233_000) == "2026-11-28 03:30:37.233 UTC (1795836637233000)"
    assert ViewState("none").ts_full(42) == "42" and ViewState("us").ts_full(None) == "-"


def test_each_cluster_reads_in_its_own_unit() -> None:
    """A job serving a simulated cluster in microseconds and an etcd in revisions: a revision is no time."""
    state = ViewState("us", {"etcd-main": "revision"})
    assert state.ts_text(1_234, "etcd-main") == "1234" and state.lag_ms(1_234, 10_000, "etcd-main") is None
    assert state.ts_full(1_234, "etcd-main") == "1234"
    assert state.ts_full(1_795_836_637_233_000, "default") == "2026-11-28 03:30:37.233 UTC (1795836637233000)"
