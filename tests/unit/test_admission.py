"""Admission control of long snapshots: the job tells a node its pinned-bytes band (a ``band``
directive on every change, job = replay), and the node's ``Admission`` admits long snapshots by it
(all in normal, rate-limited in warning with a retry_after, none in critical; short ones always);
heartbeats' counts reach the status."""

from __future__ import annotations

import pytest

from safepoint.connectors.admission import Admission
from safepoint.core import Policy
from safepoint.core.status import node_status
from safepoint.errors import AdmissionDenied, AdmissionRefused, AdmissionThrottled, ReaderRefused

from core_helpers import NodeClient, Run, restore_engine, topology

T0 = 1_700_000_000_000
MIB = 1 << 20
POLICY = Policy(pinned_warning_enter_bytes=500 * MIB, pinned_warning_exit_bytes=400 * MIB,
                pinned_critical_enter_bytes=1000 * MIB, pinned_critical_exit_bytes=800 * MIB,
                band_enter_window_ms=5_000, band_exit_window_ms=10_000, expire_enabled=False, node_lease_ms=600_000)


def bands(run: Run) -> list[tuple[str, str, int]]:
    return [(o.key, o.value["band"], o.value["seq"]) for o in run.outputs
            if o.channel == "directives" and o.value["type"] == "band"]


def pinned(n: NodeClient, t_s: int, mib: int, **fields: int) -> dict:
    return n.hb(T0 + t_s * 1000, 10_000, pinned_bytes=mib * MIB, **fields)


def test_each_band_change_is_a_band_directive_keyed_by_the_node() -> None:
    run = Run(POLICY)
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": []}), pinned(n1, 0, 100))
    run.feed(*[pinned(n1, t, 600) for t in range(1, 8)])  # warning after the 5 s enter window
    run.feed(*[pinned(n1, t, 1200) for t in range(8, 15)])  # critical
    run.feed(*[pinned(n1, t, 100) for t in range(15, 30)])  # back to normal after the exit window
    got = bands(run)
    assert [b for _k, b, _s in got] == ["warning", "critical", "normal"], got
    assert all(k == "default/n1/%band" for k, _b, _s in got)
    seqs = [s for _k, _b, s in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3  # the per-node directive seq


def test_band_directives_survive_a_restore_in_the_middle() -> None:
    straight, split = Run(POLICY), Run(POLICY)
    for run in (straight, split):
        n = NodeClient("n1")
        run.feed(topology(1, T0, {"n1": []}), *[pinned(n, t, 600 if t < 20 else 1200) for t in range(0, 12)])
        if run is split:
            restore_engine(run.engine)
        run.feed(*[pinned(n, t, 600 if t < 20 else 1200) for t in range(12, 30)])
    assert bands(split) == bands(straight) and len(bands(straight)) == 2


def test_a_heartbeats_admission_counts_reach_the_status() -> None:
    run = Run(POLICY)
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": []}), pinned(n1, 0, 100, admission_throttled=3, admission_refused=1))
    part = node_status(run.engine.nodes[("default", "n1")], POLICY)
    assert part["admission"] == {"throttled": 3, "refused": 1}
    n1.restart()
    run.feed(pinned(n1, 1, 100))  # a new process counts from zero again
    assert "admission" not in node_status(run.engine.nodes[("default", "n1")], POLICY)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_normal_admits_everything_and_short_snapshots_are_never_touched() -> None:
    a = Admission("n1", long_per_s=1.0, long_read_after=1_000)
    for _ in range(100):
        a.admit("reader", "r")
    a.observe("critical")
    assert not a.is_long(False, 9_500, 10_000)  # 500 below mvcc_now: short
    assert a.is_long(False, 8_000, 10_000) and a.is_long(True, 10_000, 10_000)
    assert (a.throttled, a.refused) == (0, 0)


def test_warning_rate_limits_long_snapshots_with_a_retry_after() -> None:
    clock = Clock()
    a = Admission("n1", long_per_s=2.0, clock=clock)
    a.observe("warning")
    a.admit("reader", "r1")
    a.admit("reader", "r2")  # a burst of long_per_s
    with pytest.raises(AdmissionThrottled) as exc:
        a.admit("reader", "r3")
    assert 0 < exc.value.retry_after_s <= 0.5 and exc.value.band == "warning"
    assert isinstance(exc.value, AdmissionDenied) and isinstance(exc.value, ReaderRefused)
    clock.t += exc.value.retry_after_s
    a.admit("reader", "r3")  # after retry_after, admitted
    assert (a.throttled, a.refused) == (1, 0)


def test_critical_refuses_long_snapshots_until_the_band_goes_back() -> None:
    a = Admission("n1")
    a.observe("critical")
    with pytest.raises(AdmissionRefused, match="critical pinned-bytes band"):
        a.admit("transaction", "t1")
    a.observe("normal")
    a.admit("transaction", "t1")
    assert (a.throttled, a.refused) == (0, 1)
    with pytest.raises(ValueError, match="unknown band"):
        a.observe("high")


# -- emergency: a critical node whose debt keeps growing ---------------------------------------------

EMERGENCY = Policy(**{**POLICY.to_dict(), "forecast_window_ms": 20_000, "emergency_exit_ms": 30_000,
                      "emergency_compaction_budget": 3})


def emergencies(run: Run) -> list[tuple[str, str]]:
    return [(a["state"], a["severity"]) for a in run.alerts("emergency")]


def critical_with_debt(n: NodeClient, start: int, stop: int, debt_per_s: int, base: int = 0) -> list[dict]:
    return [pinned(n, t, 1200, debt_bytes=base + debt_per_s * (t - start)) for t in range(start, stop)]


def test_a_critical_node_whose_debt_keeps_growing_puts_the_cluster_in_emergency_and_out_with_hysteresis() -> None:
    run = Run(EMERGENCY)
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": [], "n2": []}), pinned(n1, 0, 100), pinned(n2, 0, 100))
    for t in range(1, 20):  # n1 critical (after the enter window) with debt growing 1 MiB/s; n2 quiet
        run.feed(pinned(n1, t, 1200, debt_bytes=t * MIB), pinned(n2, t, 100))
    assert emergencies(run) == [("raised", "critical")]
    last = run.directives()[-1]
    assert last["emergency"]["compaction_budget"] == 3, last
    entered = last["emergency"]["since_wall_ms"]
    [alert] = run.alerts("emergency", "raised")
    assert "n1" in alert["detail"] and alert["node"] is None and alert["cluster_wall_ms"] == entered
    # debt stops growing (flat): no node is so; the emergency holds emergency_exit_ms more, then ends
    flat = 19 * MIB
    for t in range(20, 90):
        run.feed(pinned(n1, t, 1200, debt_bytes=flat), pinned(n2, t, 100))
    assert emergencies(run) == [("raised", "critical"), ("cleared", "critical")]
    [cleared] = run.alerts("emergency", "cleared")
    assert cleared["cluster_wall_ms"] - entered >= EMERGENCY.emergency_exit_ms
    assert "emergency" not in run.directives()[-1], "a directive says it is over"


def test_emergency_is_the_same_through_a_restore_and_off_with_an_exit_of_zero() -> None:
    def story(run: Run, restore_at: int | None) -> None:
        n1 = NodeClient("n1")
        run.feed(topology(1, T0, {"n1": []}), pinned(n1, 0, 100))
        for t in range(1, 100):
            if t == restore_at:
                restore_engine(run.engine)
            run.feed(pinned(n1, t, 1200, debt_bytes=(t if t < 30 else 30) * MIB))
    straight, split = Run(EMERGENCY), Run(EMERGENCY)
    story(straight, None)
    story(split, 25)
    assert [o.value for o in split.outputs] == [o.value for o in straight.outputs]
    assert emergencies(straight) == [("raised", "critical"), ("cleared", "critical")]
    off = Run(Policy(**{**EMERGENCY.to_dict(), "emergency_exit_ms": 0}))
    story(off, None)
    assert emergencies(off) == [] and all("emergency" not in d for d in off.directives())


def test_in_emergency_the_warning_band_refuses_long_snapshots_too() -> None:
    a = Admission("n1", long_per_s=100.0)
    a.observe("warning")
    a.admit("reader", "r1")
    a.observe_emergency(True)
    with pytest.raises(AdmissionRefused, match="emergency"):
        a.admit("reader", "r2")
    a.observe_emergency(False)
    a.admit("reader", "r3")
    assert (a.throttled, a.refused) == (0, 1)
