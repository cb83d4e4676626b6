"""Predictive pressure: a node's pinned bytes growing toward the critical threshold are alerted
(``pressure_forecast``) with the projected time before the band is entered, shown in the status,
cleared when growth stops or the node is critical, and the same through a restore from JSON."""

from __future__ import annotations

from typing import Any

from safepoint.core import Policy
from safepoint.core.pressure import FORECAST_SAMPLES, Forecast
from safepoint.core.status import node_status

from core_helpers import NodeClient, Run, restore_engine, topology

T0 = 1_700_000_000_000
MIB = 1 << 20
CRITICAL = 1000 * MIB
POLICY = Policy(pinned_warning_enter_bytes=500 * MIB, pinned_warning_exit_bytes=400 * MIB,
                pinned_critical_enter_bytes=CRITICAL, pinned_critical_exit_bytes=800 * MIB,
                forecast_horizon_ms=600_000, forecast_window_ms=120_000, expire_enabled=False,
                node_lease_ms=600_000)


def growing(n: NodeClient, start_s: int, stop_s: int, mib_per_s: float, base: int = 0,
            debt_per_s: int | None = None) -> list[dict[str, Any]]:
    """A heartbeat a second from ``start_s`` to ``stop_s`` with pinned bytes ``base + rate * t``."""
    return [n.hb(T0 + t * 1000, 10_000, pinned_bytes=int(base + mib_per_s * MIB * t),
                 **({"debt_bytes": debt_per_s * t} if debt_per_s is not None else {}))
            for t in range(start_s, stop_s + 1)]


def single(run: Run, pinned: int = 0) -> NodeClient:
    n1 = NodeClient("n1")
    run.feed(topology(1, T0, {"n1": []}), n1.hb(T0, 10_000, pinned_bytes=pinned))
    return n1


def test_growth_toward_critical_is_forecast_with_the_time_left() -> None:
    """1 MiB/s from 0 toward 1000 MiB: at t seconds, about 1000 - t seconds are left; the alert is
    raised once that falls under the 600 s horizon (and not before three heartbeats)."""
    run = Run(POLICY)
    n1 = single(run)
    run.feed(*growing(n1, 1, 380, 1.0))
    assert run.alerts("pressure_forecast") == [], "1000 - 380 s is still past the horizon"
    run.feed(*growing(n1, 381, 420, 1.0))
    [raised] = run.alerts("pressure_forecast", "raised")
    assert raised["node"] == "n1" and raised["severity"] == "warning" and raised["threshold"] == 600_000
    at = (raised["cluster_wall_ms"] - T0) // 1000
    assert 399 <= at <= 402, at
    assert abs(raised["value"] - (1000 - at) * 1000) <= 2_000, raised
    assert "in about" in raised["detail"]
    status = node_status(run.engine.nodes[("default", "n1")], POLICY)["forecast"]
    assert status["pinned_bytes_per_s"] == MIB and status["forecast_raised"] is True
    assert abs(status["time_to_critical_s"] - 580) <= 2, status


def test_a_forecast_clears_when_growth_stops() -> None:
    run = Run(POLICY)
    n1 = single(run)
    run.feed(*growing(n1, 1, 450, 1.0))
    assert len(run.alerts("pressure_forecast", "raised")) == 1
    flat = [n1.hb(T0 + t * 1000, 10_000, pinned_bytes=450 * MIB) for t in range(451, 700)]
    run.feed(*flat)
    [cleared] = run.alerts("pressure_forecast", "cleared")
    assert "stopped growing" in cleared["detail"] or "now about" in cleared["detail"], cleared
    status = node_status(run.engine.nodes[("default", "n1")], POLICY)["forecast"]
    assert status["forecast_raised"] is False and status["time_to_critical_s"] is None


def test_a_forecast_clears_when_the_critical_band_is_entered() -> None:
    """Growth goes on past the threshold: once the critical band is entered (after its enter
    window), the forecast clears and the critical band alert speaks."""
    run = Run(POLICY)
    n1 = single(run)
    run.feed(*growing(n1, 1, 1100, 1.0))
    kinds = [(a["kind"], a["state"], a["severity"]) for a in run.alerts() if a["kind"] in ("pressure_forecast",
                                                                                         "pinned_bytes")]
    assert ("pressure_forecast", "raised", "warning") in kinds
    critical = kinds.index(("pinned_bytes", "raised", "critical"))
    assert kinds[critical + 1:critical + 2] == [("pressure_forecast", "cleared", "warning")], kinds
    [cleared] = run.alerts("pressure_forecast", "cleared")
    assert "critical band" in cleared["detail"]


def test_shrinking_or_flat_pinned_bytes_are_never_forecast() -> None:
    run = Run(POLICY)
    n1 = single(run, 900 * MIB)
    run.feed(*growing(n1, 1, 600, -0.5, base=900 * MIB))
    run.feed(*[n1.hb(T0 + t * 1000, 10_000, pinned_bytes=600 * MIB) for t in range(601, 900)])
    assert run.alerts("pressure_forecast") == []


def test_debt_growth_is_fitted_too_and_the_forecast_survives_a_restore() -> None:
    """The job carries each node's state through JSON between micro-batches: a restore in the
    middle changes no output, and the debt rate is in the status."""
    straight, split = Run(POLICY), Run(POLICY)
    a, b = single(straight), single(split)
    straight.feed(*growing(a, 1, 500, 1.0, debt_per_s=4096))
    split.feed(*growing(b, 1, 390, 1.0, debt_per_s=4096))
    restore_engine(split.engine)
    split.feed(*growing(b, 391, 500, 1.0, debt_per_s=4096))
    assert [o.value for o in split.outputs] == [o.value for o in straight.outputs]
    status = node_status(split.engine.nodes[("default", "n1")], POLICY)["forecast"]
    assert status["debt_bytes_per_s"] == 4096


def test_the_forecast_keeps_a_bounded_number_of_samples() -> None:
    """Heartbeats every 10 ms over a whole window: the samples stay spaced, at most a few dozen."""
    f = Forecast()
    for i in range(50_000):
        f.add(T0 + i * 10, i, None, 120_000)
    assert len(f.samples) <= FORECAST_SAMPLES + 2
    assert f.pinned_per_ms is not None and abs(f.pinned_per_ms - 0.1) < 1e-6


def test_a_horizon_of_zero_turns_the_forecast_off() -> None:
    run = Run(Policy(**{**POLICY.to_dict(), "forecast_horizon_ms": 0}))
    n1 = single(run)
    run.feed(*growing(n1, 1, 900, 1.0))
    assert run.alerts("pressure_forecast") == []
