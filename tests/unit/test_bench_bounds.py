"""The benchmark's bounds from the cores its runs kept busy (benchmarks/bench_machine.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_machine import saturation, saturation_lines  # noqa: E402


def _run(master: str, rate: float, broker_us: float, rest_us: float, status: bool = True) -> dict:
    return {"master": master, "status": status, "sustained_events_per_s": rate,
            "cpu_us_per_event": {"broker": broker_us, "workers": rest_us * 0.8, "jvm": rest_us * 0.2}}


def test_bounds_from_the_cores_the_broker_leaves() -> None:
    # local[1]: 40k ev/s, the broker 15 us/event (0.6 cores), 25 us besides it (1.0 core)
    # local[2]: 50k ev/s, the broker 14 us/event (0.7 cores), 24 us besides it (1.2 cores)
    res = {"machine": {"cpus": 2}, "plain": {"events_per_s": 50_000, "cpu_us_per_event": {"plain": 18, "broker": 12}},
           "spark_throughput": [_run("local[1]", 40_000, 15, 25), _run("local[2]", 50_000, 14, 24),
                                _run("local[2]", 99_000, 1, 1, status=False)]}
    sat = saturation(res)
    assert sat["runs"]["local[1]"] == pytest.approx((1.6, 0.6, 25))
    assert sat["runs"]["local[2]"] == pytest.approx((1.9, 0.7, 24))  # the status-off run is not the job's figure
    assert sat["plain"] == pytest.approx((1.5, 0.6, 18))
    assert sat["scaling_bound"] == pytest.approx((2 - 0.7) / 1.0)
    assert sat["job_bound_events_per_s"] == pytest.approx((2 - 0.7) / 24e-6)
    text = saturation_lines(res)[0]
    assert "**1.30x**" in text and "**54,167 ev/s**" in text, text


def test_no_bounds_without_the_broker_figures() -> None:
    res = {"machine": {"cpus": 2}, "spark_throughput": [
        {"master": "local[1]", "sustained_events_per_s": 1000, "cpu_us_per_event": {"workers": 10}}]}
    sat = saturation(res)
    assert sat["runs"] == {} and "scaling_bound" not in sat and "job_bound_events_per_s" not in sat
    assert saturation_lines(res) == []
