"""The pressure policy: bands with hysteresis and debounce, reader age, in-doubt transactions,
stall, and forced expiry under sustained critical pressure.

Sources: CONTRACT "Alerts" (kinds; emitted on a change of state or severity only; bands with
enter/exit thresholds and enter/exit windows) and "Directives" (the expire directive: key
``<cluster>/<node>/<id>``, ``mode`` graceful or hard, ``seq``); NornicDB seed 003 sections 9
(three bands with hysteresis windows; max lifetime, graceful cancel, hard kill under sustained
critical pressure), 9.1 (defaults: high 5 GiB / exit 0.8x, critical 20 GiB / exit 0.8x, enter
window 30 s, exit window 120 s) and 10 (audit event on every forced expiration); MongoDB 2PC
seed 002 (a prepared transaction's fate belongs to its coordinator: never expire it; an in-doubt
one is named with its coordinator and participants).

The millisecond boundaries are pinned directly on ``band_step``; everything else runs the whole
``Engine`` (``core_helpers.Run`` schema-checks every output). Windows are inclusive: a condition
that has lasted exactly the window acts, one millisecond less does not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from safepoint.core import DIRECTIVES, Engine, Output, Policy, Position
from safepoint.core.bands import BandSpec, band_step, new_band

from core_helpers import EVENTS_TOPIC, NodeClient, Run, check_output, restore_engine, topology, validator

GIB = 1 << 30
T0 = 1_700_000_000_000
EXAMPLES = int(os.environ.get("SAFEPOINT_HYPOTHESIS_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# small numbers for band_step: warning 100 / 80, critical 200 / 160, enter 30 s, exit 120 s
SPEC = BandSpec(warning_enter=100, warning_exit=80, critical_enter=200, critical_exit=160, enter_ms=30_000, exit_ms=120_000)


def feed(state: list[Any], samples: list[tuple[int, int]], spec: BandSpec = SPEC) -> list[tuple[int, tuple[int, int, int]]]:
    """Step ``samples`` [(t, value)] through ``state``; returns [(t, change)] for every change."""
    changes = []
    for t, value in samples:
        change = band_step(state, spec, t, value)
        if change is not None:
            changes.append((t, change))
    return changes


def single(run: Run, cluster: str | None = None, mvcc: int = 0, wall: int = T0) -> NodeClient:
    """A one-node cluster under a topology, first heartbeat in: the first directive is out."""
    n1 = NodeClient("n1", cluster)
    run.feed(topology(1, wall, {"n1": []}, cluster), n1.hb(wall, mvcc))
    return n1


def hb_series(n: NodeClient, start: int, stop: int, step: int, pinned: int, mvcc: int = 10_000) -> list[dict[str, Any]]:
    """Heartbeats of ``n`` every ``step`` ms from ``start`` to ``stop`` inclusive, all reporting ``pinned``."""
    return [n.hb(t, mvcc, pinned_bytes=pinned) for t in range(start, stop + 1, step)]


# -- bands: band_step at the millisecond ----------------------------------------------------------


def test_enter_exactly_at_the_enter_window_not_one_ms_before() -> None:
    """CONTRACT Alerts: enter window of sustained breach, inclusive."""
    state = new_band()
    assert feed(state, [(0, 150), (29_999, 150)]) == []
    assert band_step(state, SPEC, 30_000, 150) == (0, 1, 0)
    assert state.level == 1 and state.since == 30_000


def test_enter_window_runs_from_the_first_breaching_sample() -> None:
    state = new_band()
    assert feed(state, [(1_000, 50), (5_000, 100), (34_999, 120)]) == []
    assert band_step(state, SPEC, 35_000, 100) == (0, 1, 5_000)


def test_value_equal_to_enter_breaches_and_equal_to_exit_does_not_recover() -> None:
    """Enter is ``>= enter``; recovery is ``< exit``."""
    state = new_band()
    assert feed(state, [(0, 100), (30_000, 100)]) == [(30_000, (0, 1, 0))]
    assert feed(state, [(40_000, 80), (500_000, 80)]) == [], "at the exit threshold is not below it"
    assert feed(state, [(500_001, 79), (620_000, 79)]) == []
    assert band_step(state, SPEC, 620_001, 79) == (1, 0, 500_001)


def test_dip_below_enter_resets_the_enter_window() -> None:
    state = new_band()
    # a dip between exit and enter still resets: the breach must be sustained
    assert feed(state, [(0, 150), (20_000, 90), (20_001, 150), (30_000, 150), (50_000, 150)]) == []
    assert band_step(state, SPEC, 50_001, 150) == (0, 1, 20_001)


def test_exit_exactly_at_the_exit_window_not_one_ms_before() -> None:
    state = new_band()
    assert feed(state, [(0, 150), (30_000, 150)]) == [(30_000, (0, 1, 0))]
    assert feed(state, [(40_000, 79), (159_999, 10)]) == []
    assert band_step(state, SPEC, 160_000, 10) == (1, 0, 40_000)
    assert state == new_band(), "back at normal with nothing breaching, the band is canonical (nothing to carry)"


def test_bounce_back_to_exit_resets_the_exit_window() -> None:
    state = new_band()
    feed(state, [(0, 150), (30_000, 150)])
    assert feed(state, [(40_000, 10), (100_000, 80), (100_001, 10), (220_000, 10)]) == []
    assert band_step(state, SPEC, 220_001, 10) == (1, 0, 100_001)


def test_between_exit_and_enter_the_level_holds_either_way() -> None:
    """Hysteresis: in the dead zone nothing changes, whatever the current level."""
    low, high = new_band(), new_band()
    feed(high, [(0, 150), (30_000, 150)])
    assert feed(low, [(t, 90) for t in range(0, 1_000_001, 10_000)]) == []
    assert feed(high, [(t, 90) for t in range(40_000, 1_000_001, 10_000)]) == []
    assert low.level == 0 and high.level == 1


def test_normal_to_warning_to_critical() -> None:
    state = new_band()
    assert feed(state, [(0, 150), (30_000, 150), (40_000, 250), (69_999, 250)]) == [(30_000, (0, 1, 0))]
    assert band_step(state, SPEC, 70_000, 250) == (1, 2, 40_000)


def test_straight_to_critical_when_the_critical_breach_is_sustained() -> None:
    state = new_band()
    assert feed(state, [(0, 250), (29_999, 250)]) == []
    assert band_step(state, SPEC, 30_000, 250) == (0, 2, 0), "one change, not warning then critical"


def test_critical_to_warning_to_normal_stepping() -> None:
    state = new_band()
    feed(state, [(0, 250), (30_000, 250)])
    # below critical exit but above warning enter: down one level after the exit window
    assert feed(state, [(40_000, 150), (159_999, 150)]) == []
    assert band_step(state, SPEC, 160_000, 150) == (2, 1, 40_000)
    # below warning exit: down to normal after another exit window
    assert feed(state, [(170_000, 50), (289_999, 50)]) == []
    assert band_step(state, SPEC, 290_000, 50) == (1, 0, 170_000)


def test_deep_recovery_from_critical_clears_in_one_change() -> None:
    state = new_band()
    feed(state, [(0, 250), (30_000, 250)])
    assert feed(state, [(40_000, 10), (159_999, 10)]) == []
    assert band_step(state, SPEC, 160_000, 10) == (2, 0, 40_000)


def test_short_spike_above_critical_while_warning_changes_nothing() -> None:
    state = new_band()
    feed(state, [(0, 150), (30_000, 150)])
    assert feed(state, [(40_000, 500), (69_999, 500), (70_000, 150), (200_000, 150)]) == []
    assert state.level == 1


def test_critical_oscillating_around_critical_exit_stays_critical() -> None:
    state = new_band()
    feed(state, [(0, 250), (30_000, 250)])
    samples = [(40_000 + i * 10_000, 150 if i % 2 == 0 else 170) for i in range(200)]
    assert feed(state, samples) == []
    assert state.level == 2


def test_sparse_samples_count_the_time_between_them() -> None:
    """Windows are measured between samples: two breaching samples 40 s apart raise at the second."""
    state = new_band()
    assert feed(state, [(0, 150)]) == []
    assert band_step(state, SPEC, 40_000, 150) == (0, 1, 0)


def test_zero_windows_act_on_the_sample() -> None:
    spec = BandSpec(100, 100, 200, 200, 0, 0)
    state = new_band()
    assert feed(state, [(0, 99), (1, 100), (2, 199), (3, 200), (4, 199), (5, 99)], spec) == [
        (1, (0, 1, 1)),
        (3, (1, 2, 3)),
        (4, (2, 1, 4)),
        (5, (1, 0, 5)),
    ]


# -- bands: hypothesis ------------------------------------------------------------------------------


def oracle(samples: list[tuple[int, int]], spec: BandSpec) -> list[tuple[int, tuple[int, int, int]]]:
    return [(samples[i][0], change) for i, change in oracle_at(samples, spec)]


def oracle_at(samples: list[tuple[int, int]], spec: BandSpec) -> list[tuple[int, tuple[int, int, int]]]:
    """The band rules restated over the whole series: at each sample, a condition has "lasted"
    from the first sample of the unbroken run of samples (ending here) that satisfy it.
    Up: the highest level above the current one whose enter run has lasted ``enter_ms``.
    Otherwise down, one level at a time, while the current level's exit run has lasted ``exit_ms``."""

    def run_start(i: int, holds: Callable[[int], bool]) -> int | None:
        if not holds(samples[i][1]):
            return None
        j = i
        while j > 0 and holds(samples[j - 1][1]):
            j -= 1
        return samples[j][0]

    level, changes = 0, []
    for i, (t, _v) in enumerate(samples):
        new, since = level, None
        for up in (2, 1):
            start = run_start(i, lambda x, up=up: x >= spec.enter(up))
            if up > level and start is not None and t - start >= spec.enter_ms:
                new, since = up, start
                break
        if new == level:
            while new > 0:
                start = run_start(i, lambda x, lvl=new: x < spec.exit(lvl))
                if start is None or t - start < spec.exit_ms:
                    break
                new, since = new - 1, start
        if new != level:
            assert since is not None
            changes.append((i, (level, new, since)))
            level = new
    return changes


VALUES = st.sampled_from([0, 50, 79, 80, 81, 99, 100, 101, 150, 159, 160, 161, 199, 200, 201, 400])
GAPS = st.one_of(
    st.integers(0, 3), st.sampled_from([1_000, 29_999, 30_000, 30_001, 119_999, 120_000, 120_001]), st.integers(0, 60_000)
)


@st.composite
def series(draw: st.DrawFn, values: st.SearchStrategy[int] = VALUES) -> list[tuple[int, int]]:
    t, out = draw(st.integers(0, 10**6)), []
    for gap, value in draw(st.lists(st.tuples(GAPS, values), max_size=80)):
        t += gap
        out.append((t, value))
    return out


@SETTINGS
@given(series())
def test_band_step_matches_the_rules_restated(samples: list[tuple[int, int]]) -> None:
    assert feed(new_band(), samples) == oracle(samples, SPEC)


@st.composite
def offsets(draw: st.DrawFn, span: int) -> list[int]:
    """Sample offsets from 0 to exactly ``span``, strictly increasing."""
    inner = draw(st.lists(st.integers(1, span - 1), max_size=6)) if span > 1 else []
    return sorted({0, span, *inner})


@st.composite
def fast_alternation(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Runs at or above warning enter, each shorter than the enter window, broken by samples below it."""
    t, out = 0, []
    for _ in range(draw(st.integers(1, 12))):
        span = draw(st.integers(0, SPEC.enter_ms - 1))
        out += [(t + o, draw(st.sampled_from([100, 150, 200, 400]))) for o in draw(offsets(span))]
        t = out[-1][0] + draw(st.integers(1, 200_000))
        below = draw(st.integers(1, 3))
        for k in range(below):
            out.append((t + k, draw(st.sampled_from([0, 79, 80, 99]))))
        t = out[-1][0] + draw(st.integers(1, 200_000))
    return out


@SETTINGS
@given(fast_alternation())
def test_oscillation_faster_than_the_enter_window_never_raises(samples: list[tuple[int, int]]) -> None:
    assert feed(new_band(), samples) == []


@st.composite
def raise_then_flutter(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, int, int]:
    """A warning breach sustained for the enter window (A), then a value fluttering around the warning
    exit threshold with every spell below it shorter than the exit window (B), then a sustained
    recovery (C). Returns the samples, when A began, the first sample of C and the end of C."""
    warn = st.sampled_from([100, 120, 199])
    a_span = draw(st.integers(SPEC.enter_ms, 3 * SPEC.enter_ms))
    samples = [(o, draw(warn)) for o in draw(offsets(a_span))]
    t = a_span
    for _ in range(draw(st.integers(0, 10))):
        t += draw(st.integers(1, 200_000))
        samples.append((t, draw(st.sampled_from([80, 81, 99, 150, 199]))))  # at or above exit: not recovering
        t += draw(st.integers(1, 200_000))
        span = draw(st.integers(0, SPEC.exit_ms - 1))
        samples += [(t + o, draw(st.sampled_from([0, 40, 79]))) for o in draw(offsets(span))]
        t += span
        t += draw(st.integers(1, 200_000))
        samples.append((t, draw(st.sampled_from([80, 150]))))
    t += draw(st.integers(1, 200_000))
    c_start = t
    c_span = draw(st.integers(SPEC.exit_ms, 3 * SPEC.exit_ms))
    samples += [(c_start + o, draw(st.sampled_from([0, 40, 79]))) for o in draw(offsets(c_span))]
    return samples, 0, c_start, c_start + c_span


@SETTINGS
@given(raise_then_flutter())
def test_one_raise_and_one_clear_per_sustained_episode(case: tuple[list[tuple[int, int]], int, int, int]) -> None:
    samples, a_start, c_start, _c_end = case
    changes = feed(new_band(), samples)
    first_at_window = next(t for t, _v in samples if t - a_start >= SPEC.enter_ms)
    first_recovered = next(t for t, _v in samples if t >= c_start and t - c_start >= SPEC.exit_ms)
    assert changes == [(first_at_window, (0, 1, a_start)), (first_recovered, (1, 0, c_start))]


# -- pinned_bytes through the engine ------------------------------------------------------------------


def test_policy_defaults_are_the_seed_defaults() -> None:
    """Seed 003 9.1 (absolute floors, free space unknown): 5 GiB / 0.8x, 20 GiB / 0.8x, 30 s, 120 s."""
    p = Policy()
    assert (p.pinned_warning_enter_bytes, p.pinned_critical_enter_bytes) == (5 * GIB, 20 * GIB)
    assert p.pinned_warning_exit_bytes == int(0.8 * p.pinned_warning_enter_bytes)
    assert p.pinned_critical_exit_bytes == int(0.8 * p.pinned_critical_enter_bytes)
    assert (p.band_enter_window_ms, p.band_exit_window_ms) == (30_000, 120_000)
    assert p.pinned_band() == BandSpec(5 * GIB, 4 * GIB, 20 * GIB, 16 * GIB, 30_000, 120_000)


@pytest.mark.parametrize(
    "bad",
    [
        {"pinned_warning_exit_bytes": 6 * GIB},
        {"pinned_critical_exit_bytes": 21 * GIB},
        {"pinned_critical_enter_bytes": 4 * GIB, "pinned_critical_exit_bytes": 3 * GIB},
        {"reader_age_critical_ms": 1},
        {"max_expiries_per_window": -1},
        {"expire_enabled": 1},
    ],
)
def test_inconsistent_pressure_policy_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="policy key"):
        Policy(**bad)


def test_pinned_bytes_raise_and_clear_with_the_windows() -> None:
    run = Run()
    n1 = single(run)
    run.feed(n1.hb(T0 + 10_000, 10_000, pinned_bytes=6 * GIB), n1.hb(T0 + 39_999, 10_000, pinned_bytes=5 * GIB))
    assert run.alerts("pinned_bytes") == []
    outs = run.feed(n1.hb(T0 + 40_000, 10_000, pinned_bytes=7 * GIB))
    [a] = [o for o in outs if o.value.get("kind") == "pinned_bytes"]
    assert [o.value["band"] for o in outs if o.value["type"] == "band"] == ["warning"]  # the node's admission follows it
    assert a.key == "n1"
    assert a.value == {
        "v": 1,
        "type": "alert",
        "kind": "pinned_bytes",
        "state": "raised",
        "severity": "warning",
        "cluster": "default",
        "node": "n1",
        "value": 7 * GIB,
        "threshold": 5 * GIB,
        "since_wall_ms": T0 + 10_000,
        "cluster_wall_ms": T0 + 40_000,
        "detail": a.value["detail"],
        "id": "default/pinned_bytes/n1",
    }
    # still high: no repeat
    run.feed(*hb_series(n1, T0 + 50_000, T0 + 300_000, 10_000, 6 * GIB))
    assert len(run.alerts("pinned_bytes")) == 1
    # recovery below 4 GiB sustained 120 s
    run.feed(n1.hb(T0 + 310_000, 10_000, pinned_bytes=4 * GIB - 1), n1.hb(T0 + 429_999, 10_000, pinned_bytes=GIB))
    assert len(run.alerts("pinned_bytes")) == 1
    run.feed(n1.hb(T0 + 430_000, 10_000, pinned_bytes=GIB))
    [c] = run.alerts("pinned_bytes", "cleared")
    assert (c["severity"], c["threshold"], c["since_wall_ms"], c["cluster_wall_ms"], c["value"]) == (
        "warning",
        4 * GIB,
        T0 + 310_000,
        T0 + 430_000,
        GIB,
    )


def test_pinned_bytes_critical_and_step_down_through_the_engine() -> None:
    run = Run()
    n1 = single(run)
    run.feed(*hb_series(n1, T0, T0 + 30_000, 10_000, 25 * GIB))
    [a] = run.alerts("pinned_bytes")
    assert (a["state"], a["severity"], a["threshold"], a["since_wall_ms"]) == ("raised", "critical", 20 * GIB, T0)
    run.feed(*hb_series(n1, T0 + 40_000, T0 + 160_000, 10_000, 10 * GIB))
    b = run.alerts("pinned_bytes")[-1]
    assert (b["state"], b["severity"], b["threshold"], b["since_wall_ms"], b["cluster_wall_ms"]) == (
        "raised",
        "warning",
        16 * GIB,
        T0 + 40_000,
        T0 + 160_000,
    ), "a change of severity is emitted, still raised"
    run.feed(*hb_series(n1, T0 + 170_000, T0 + 290_000, 10_000, 0))
    assert [(x["state"], x["severity"]) for x in run.alerts("pinned_bytes")] == [
        ("raised", "critical"),
        ("raised", "warning"),
        ("cleared", "warning"),
    ]
    assert run.alerts("pinned_bytes")[-1]["cluster_wall_ms"] == T0 + 290_000


def test_only_heartbeats_with_pinned_bytes_are_samples() -> None:
    run = Run()
    n1 = single(run)
    run.feed(n1.hb(T0 + 1, 10_000, pinned_bytes=6 * GIB))
    # other events, and heartbeats that do not report pinned_bytes, neither extend nor break the breach
    run.feed(n1.hb(T0 + 100_000, 10_000), n1.open("r1", 9_000, T0 + 100_001), n1.close("r1", T0 + 100_002))
    assert run.alerts("pinned_bytes") == []
    run.feed(n1.hb(T0 + 100_003, 10_000, pinned_bytes=6 * GIB))
    [a] = run.alerts("pinned_bytes")
    assert a["since_wall_ms"] == T0 + 1 and a["cluster_wall_ms"] == T0 + 100_003


def test_pinned_bytes_oscillation_yields_one_raise_and_one_clear() -> None:
    """CONTRACT Alerts / seed 003 9: no flapping."""
    run = Run()
    n1 = single(run)
    t = T0
    # 10 minutes around the enter threshold, faster than the enter window: nothing
    for i in range(60):
        t += 10_000
        run.feed(n1.hb(t, 10_000, pinned_bytes=5 * GIB + (GIB // 2 if i % 3 else -GIB // 2)))
    assert run.alerts("pinned_bytes") == []
    # sustained breach: one raise
    run.feed(*hb_series(n1, t + 10_000, t + 60_000, 10_000, 6 * GIB))
    t += 60_000
    # 10 minutes around the exit threshold, faster than the exit window: no clear
    for i in range(60):
        t += 10_000
        run.feed(n1.hb(t, 10_000, pinned_bytes=4 * GIB + (GIB // 10 if i % 5 == 0 else -GIB // 10)))
    # sustained recovery: one clear
    run.feed(*hb_series(n1, t + 10_000, t + 200_000, 10_000, 3 * GIB))
    assert [x["state"] for x in run.alerts("pinned_bytes")] == ["raised", "cleared"]


ENGINE_SPEC_POLICY = Policy(
    pinned_warning_enter_bytes=100,
    pinned_warning_exit_bytes=80,
    pinned_critical_enter_bytes=200,
    pinned_critical_exit_bytes=160,
    band_enter_window_ms=30_000,
    band_exit_window_ms=120_000,
    expire_enabled=False,
    stall_ms=0,
)


@SETTINGS
@given(series(), st.lists(st.booleans(), max_size=80))
def test_engine_pinned_alerts_follow_the_band_rules(samples: list[tuple[int, int]], extra: list[bool]) -> None:
    """End to end: every pinned_bytes alert is a band change of the rules restated, and no other."""
    assert ENGINE_SPEC_POLICY.pinned_band() == SPEC
    run = Run(ENGINE_SPEC_POLICY)
    start = samples[0][0] if samples else 0
    n1 = single(run, mvcc=10_000, wall=start)
    for i, (t, value) in enumerate(samples):
        run.feed(n1.hb(t, 10_000, pinned_bytes=value))
        if i < len(extra) and extra[i]:
            run.feed(n1.hb(t, 10_000))  # a heartbeat without pinned_bytes is not a sample
    expected = []
    for i, (old, new, since) in oracle_at(samples, SPEC):
        t, value = samples[i]
        state = "cleared" if new == 0 else "raised"
        sev = ("normal", "warning", "critical")[old if new == 0 else new]
        threshold = SPEC.enter(new) if new > old else SPEC.exit(old)
        expected.append((state, sev, value, threshold, since, t))
    got = [
        (a["state"], a["severity"], a["value"], a["threshold"], a["since_wall_ms"], a["cluster_wall_ms"])
        for a in run.alerts("pinned_bytes")
    ]
    assert got == expected


# -- reader_age ----------------------------------------------------------------------------------------


def test_reader_age_warning_then_critical_then_cleared() -> None:
    run = Run()
    n1 = single(run)
    run.feed(n1.open("r1", 9_000, T0 + 1, label="report-job"), n1.hb(T0 + 600_000, 10_000))
    assert run.alerts("reader_age") == []
    outs = run.feed(n1.hb(T0 + 600_001, 10_000))
    [a] = [o for o in outs if o.value["kind"] == "reader_age"]
    assert a.key == "n1" and a.value["id"] == "default/reader_age/n1"
    assert (a.value["state"], a.value["severity"], a.value["value"], a.value["threshold"], a.value["since_wall_ms"]) == (
        "raised",
        "warning",
        600_000,
        600_000,
        T0 + 600_001,
    )
    assert "r1" in a.value["detail"] and "report-job" in a.value["detail"]
    run.feed(n1.hb(T0 + 3_600_000, 10_000))
    assert len(run.alerts("reader_age")) == 1
    run.feed(n1.hb(T0 + 3_600_001, 10_000))
    b = run.alerts("reader_age")[-1]
    assert (b["state"], b["severity"], b["value"], b["threshold"]) == ("raised", "critical", 3_600_000, 3_600_000)
    run.feed(n1.hb(T0 + 4_000_000, 10_000))
    assert len(run.alerts("reader_age")) == 2, "no repeat while the severity holds"
    run.feed(n1.close("r1", T0 + 4_000_001))
    c = run.alerts("reader_age")[-1]
    assert (c["state"], c["severity"], c["value"], c["cluster_wall_ms"]) == ("cleared", "critical", 0, T0 + 4_000_001)


def test_reader_age_steps_down_to_the_next_oldest_and_counts_transactions() -> None:
    run = Run()
    n1 = single(run)
    run.feed(n1.open("r1", 9_000, T0), n1.begin("t1", 9_500, T0 + 3_000_000), n1.hb(T0 + 3_600_000, 10_000))
    # r1 was open 3 000 000 ms when t1 began (warning), 3 600 000 ms at the heartbeat (critical)
    assert [(a["state"], a["severity"]) for a in run.alerts("reader_age")] == [("raised", "warning"), ("raised", "critical")]
    run.feed(n1.close("r1", T0 + 3_700_000))  # the oldest is now t1, open 700 000 ms
    a = run.alerts("reader_age")[-1]
    assert (a["state"], a["severity"], a["value"], a["threshold"]) == ("raised", "warning", 700_000, 3_600_000)
    assert "tx t1" in a["detail"]
    run.feed(n1.end("t1", T0 + 3_700_001))
    assert [(a["state"], a["severity"]) for a in run.alerts("reader_age")][-1] == ("cleared", "warning")


def test_reader_age_thresholds_are_policy_keys() -> None:
    run = Run(reader_age_warning_ms=1_000, reader_age_critical_ms=2_000)
    n1 = single(run)
    run.feed(n1.open("r1", 9_000, T0), n1.hb(T0 + 999, 10_000), n1.hb(T0 + 1_000, 10_000), n1.hb(T0 + 1_999, 10_000))
    run.feed(n1.hb(T0 + 2_000, 10_000))
    assert [(a["severity"], a["cluster_wall_ms"]) for a in run.alerts("reader_age")] == [
        ("warning", T0 + 1_000),
        ("critical", T0 + 2_000),
    ]


# -- in_doubt_tx -----------------------------------------------------------------------------------------


def test_in_doubt_transaction_raised_after_timeout_naming_coordinator_and_participants() -> None:
    """Seed 002: a prepared transaction waits on its coordinator; name it and the participants."""
    run = Run()
    n1 = single(run)
    run.feed(n1.begin("t1", 9_000, T0), n1.prepare("t1", T0 + 1_000, coordinator="n2", participants=["n1", "n2", "n3"]))
    run.feed(n1.hb(T0 + 60_999, 10_000))
    assert run.alerts("in_doubt_tx") == []
    outs = run.feed(n1.hb(T0 + 61_000, 10_000))
    [a] = [o for o in outs if o.value["kind"] == "in_doubt_tx"]
    assert a.key == "n1" and a.value["id"] == "default/in_doubt_tx/n1/t1"
    assert (a.value["state"], a.value["value"], a.value["threshold"], a.value["since_wall_ms"], a.value["node"]) == (
        "raised",
        60_000,
        60_000,
        T0 + 1_000,
        "n1",
    )
    assert "coordinator n2" in a.value["detail"] and "participants n1, n2, n3" in a.value["detail"]
    run.feed(n1.hb(T0 + 200_000, 10_000))
    assert len(run.alerts("in_doubt_tx")) == 1
    run.feed(n1.end("t1", T0 + 200_001, "abort"))
    [c] = run.alerts("in_doubt_tx", "cleared")
    assert c["id"] == a.value["id"] and c["cluster_wall_ms"] == T0 + 200_001


def test_in_doubt_timeout_runs_from_the_first_prepare_and_survives_restart() -> None:
    run = Run(in_doubt_timeout_ms=5_000)
    n1 = single(run)
    run.feed(n1.begin("t1", 9_000, T0), n1.prepare("t1", T0 + 10), n1.prepare("t1", T0 + 4_000))
    n1.restart()
    run.feed(n1.hb(T0 + 5_009, 10_000))
    assert run.alerts("in_doubt_tx") == []
    run.feed(n1.hb(T0 + 5_010, 10_000))
    assert [a["since_wall_ms"] for a in run.alerts("in_doubt_tx", "raised")] == [T0 + 10]
    # a snapshot that no longer lists it: decided
    run.feed(n1.snapshot(T0 + 6_000, [], []))
    assert len(run.alerts("in_doubt_tx", "cleared")) == 1


def test_unprepared_transaction_is_never_in_doubt() -> None:
    run = Run(in_doubt_timeout_ms=5_000)
    n1 = single(run)
    run.feed(n1.begin("t1", 9_000, T0), n1.hb(T0 + 100_000, 10_000))
    assert run.alerts("in_doubt_tx") == []


# -- stall ----------------------------------------------------------------------------------------------


def test_stall_raised_after_stall_ms_without_advance_and_cleared_by_a_directive() -> None:
    run = Run(stall_ms=600_000, reader_age_warning_ms=10**9, reader_age_critical_ms=10**9)
    n1 = single(run)  # directive 1 at T0, safe_ts 0
    run.feed(n1.open("r1", 0, T0 + 1), n1.hb(T0 + 599_999, 20_000))
    assert run.alerts("stall") == []
    outs = run.feed(n1.hb(T0 + 600_000, 20_000))
    [a] = [o for o in outs if o.value["kind"] == "stall"]
    assert a.key == "default" and a.value["id"] == "default/stall/-" and a.value["node"] is None
    assert (a.value["value"], a.value["threshold"], a.value["since_wall_ms"], a.value["cluster_wall_ms"]) == (
        600_000,
        600_000,
        T0,
        T0 + 600_000,
    )
    assert "r1" in a.value["detail"] and "n1" in a.value["detail"]
    run.feed(n1.hb(T0 + 900_000, 20_000))
    assert len(run.alerts("stall")) == 1
    outs = run.feed(n1.close("r1", T0 + 900_001))
    assert [o.value["type"] for o in outs] == ["alert", "compaction"]
    [c] = run.alerts("stall", "cleared")
    assert c["cluster_wall_ms"] == T0 + 900_001
    # a new episode is a new raise
    run.feed(n1.hb(T0 + 1_500_001, 20_000))
    assert [a["state"] for a in run.alerts("stall")] == ["raised", "cleared", "raised"]
    assert run.alerts("stall")[-1]["since_wall_ms"] == T0 + 900_001


def test_stall_while_the_round_aborts_names_the_reason() -> None:
    run = Run(stall_ms=100_000)
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(topology(1, T0, {"n1": [], "n2": []}), n1.hb(T0, 10_000), n2.hb(T0, 10_000))
    run.feed(*[n1.hb(t, 10_000 + t - T0) for t in range(T0 + 10_000, T0 + 100_001, 10_000)])
    [a] = run.alerts("stall")
    assert "n2 is stale" in a["detail"]


def test_no_stall_when_the_event_that_ends_a_long_gap_advances_the_safe_point() -> None:
    """A stall is cluster time moving on WHILE the safe point does not advance: the message that
    moves cluster time past the window and advances the safe point raises (and clears) nothing."""
    run = Run(stall_ms=600_000)
    n1 = single(run, mvcc=10_000)
    outs = run.feed(n1.hb(T0 + 700_000, 20_000))
    assert [o.value["type"] for o in outs] == ["compaction"]
    assert run.alerts("stall") == []


def test_stall_zero_disables() -> None:
    run = Run(stall_ms=0)
    n1 = single(run)
    run.feed(n1.open("r1", 0, T0 + 1), n1.hb(T0 + 10_000_000, 20_000))
    assert run.alerts("stall") == []


# -- forced expiry ---------------------------------------------------------------------------------------

# critical from T0 + 40 000 (breach sustained 30 s from T0 + 10 000), expiry allowed from T0 + 100 000
CRIT_AT = T0 + 40_000
EXPIRE_AT = CRIT_AT + 60_000


def pressure_run(**policy: Any) -> tuple[Run, NodeClient]:
    """Defaults, holds opened at T0 (so older than 300 s from T0 + 300 000) unless stated, and
    critical pinned bytes from T0 + 10 000 (critical band at CRIT_AT)."""
    run = Run(**policy)
    return run, single(run)


def critical(run: Run, n: NodeClient, start: int, stop: int, step: int = 10_000) -> list[Output]:
    return run.feed(*hb_series(n, start, stop, step, 25 * GIB))


def expired(run: Run) -> list[tuple[str, str, int]]:
    """(id, mode, cluster_wall_ms) of every expire directive so far."""
    return [(e.get("reader_id") or e["tx_id"], e["mode"], e["cluster_wall_ms"]) for e in run.expires()]


def test_expiry_waits_for_expire_after_ms_of_critical_pressure() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0)
    run.feed(n1.open("r1", 9_000, T0))
    critical(run, n1, T0 + 10_000, CRIT_AT)
    assert run.alerts("pinned_bytes")[-1]["cluster_wall_ms"] == CRIT_AT
    run.feed(n1.hb(EXPIRE_AT - 1, 10_000, pinned_bytes=25 * GIB))
    assert run.expires() == []
    run.feed(n1.hb(EXPIRE_AT, 10_000, pinned_bytes=25 * GIB))
    assert expired(run) == [("r1", "graceful", EXPIRE_AT)]


def test_warning_pressure_never_expires() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0)
    run.feed(n1.open("r1", 9_000, T0))
    run.feed(*hb_series(n1, T0, T0 + 3_600_000, 10_000, 19 * GIB))
    assert run.alerts("pinned_bytes", "raised")
    assert run.expires() == []


def test_expiry_picks_lowest_ts_first_skips_young_and_prepared() -> None:
    """Seed 003 9/10: the holds that pin the most (lowest ts) first, only past max lifetime; seed 002:
    never a prepared transaction."""
    run, n1 = pressure_run(max_expiries_per_window=10)
    run.feed(
        n1.open("r_a", 500, T0),
        n1.open("r_b", 300, T0),
        n1.begin("t_d", 200, T0),
        n1.begin("t_e", 100, T0),
        n1.open("r_tie", 400, T0),  # same ts as r_c, opened earlier
        n1.prepare("t_e", T0 + 1, coordinator="n9", participants=["n1", "n9"]),
        n1.open("r_c", 400, T0 + 5),
    )
    critical(run, n1, T0 + 10_000, T0 + 90_000)
    run.feed(n1.open("r_young", 50, T0 + 100_000))  # the lowest ts, but open 300 s only at T0 + 400 000
    critical(run, n1, T0 + 100_000, T0 + 299_999)
    assert run.expires() == [], "nothing is open 300 s yet"
    outs = critical(run, n1, T0 + 300_000, T0 + 300_000)
    assert [(e.get("reader_id") or e["tx_id"]) for e in run.expires()] == ["t_d", "r_b", "r_tie", "r_a"]
    assert all(e["mode"] == "graceful" for e in run.expires())
    # r_c is open 300 s only from T0 + 300 005, r_young from T0 + 400 000
    critical(run, n1, T0 + 300_004, T0 + 300_004)
    assert len(run.expires()) == 4
    critical(run, n1, T0 + 300_005, T0 + 300_005)
    assert expired(run)[4:] == [("r_c", "graceful", T0 + 300_005)]
    critical(run, n1, T0 + 399_999, T0 + 399_999)
    assert all(i != "r_young" for i, _m, _w in expired(run))
    # the five graceful ones are past the grace period by now and the window has room: hard, in the
    # order of their graceful expiry, and within one expiry lowest ts first
    assert expired(run)[5:] == [(i, "hard", T0 + 399_999) for i in ("t_d", "r_b", "r_tie", "r_a", "r_c")]
    critical(run, n1, T0 + 400_000, T0 + 400_000)
    assert ("r_young", "graceful", T0 + 400_000) in expired(run)
    assert all(e.get("tx_id") != "t_e" for e in run.expires()), "never the prepared transaction"
    # the expire directives: shape, key, per-cluster seq
    exp_outs = [o for o in outs if o.channel == DIRECTIVES and o.value["type"] == "expire"]
    assert [o.key for o in exp_outs] == ["default/n1/tx/t_d", "default/n1/reader/r_b", "default/n1/reader/r_tie", "default/n1/reader/r_a"]
    for o in exp_outs:
        validator("expire").validate(o.value)
    assert exp_outs[0].value == {
        "v": 1,
        "type": "expire",
        "cluster": "default",
        "node": "n1",
        "tx_id": "t_d",
        "reason": exp_outs[0].value["reason"],
        "mode": "graceful",
        "seq": 2,  # after the band directive that told the node it is critical (seq 1)
        "cluster_wall_ms": T0 + 300_000,
    }
    assert exp_outs[1].value["reader_id"] == "r_b" and "tx_id" not in exp_outs[1].value
    assert "critical" in exp_outs[0].value["reason"] and "200" in exp_outs[0].value["reason"]
    assert [e["seq"] for e in run.expires()] == list(range(2, 13))
    assert run.directives()[-1]["seq"] >= 2, "the compaction directives have their own seq"


def test_graceful_then_hard_after_the_grace_period() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0, expire_grace_ms=30_000)
    run.feed(n1.open("r1", 9_000, T0, label="etl"), n1.open("r2", 9_001, T0))
    critical(run, n1, T0 + 10_000, EXPIRE_AT)
    assert expired(run) == [("r1", "graceful", EXPIRE_AT), ("r2", "graceful", EXPIRE_AT)]
    run.feed(n1.close("r2", EXPIRE_AT + 1))  # r2 complied
    critical(run, n1, EXPIRE_AT + 29_999, EXPIRE_AT + 29_999)
    assert len(run.expires()) == 2
    critical(run, n1, EXPIRE_AT + 30_000, EXPIRE_AT + 30_000)
    assert expired(run)[2:] == [("r1", "hard", EXPIRE_AT + 30_000)]
    critical(run, n1, EXPIRE_AT + 40_000, EXPIRE_AT + 600_000)
    assert len(run.expires()) == 3, "hard is the last word"
    # the audit alerts: raised per directive (warning graceful, critical hard), cleared on close
    fe = run.alerts("forced_expiry")
    assert [(a["id"], a["state"], a["severity"]) for a in fe] == [
        ("default/forced_expiry/n1/reader/r1", "raised", "warning"),
        ("default/forced_expiry/n1/reader/r2", "raised", "warning"),
        ("default/forced_expiry/n1/reader/r2", "cleared", "warning"),
        ("default/forced_expiry/n1/reader/r1", "raised", "critical"),
    ]
    assert "graceful" in fe[0]["detail"] and "etl" in fe[0]["detail"] and "hard" in fe[3]["detail"]
    assert fe[0]["value"] == 9_000 and fe[0]["node"] == "n1"
    run.feed(n1.close("r1", EXPIRE_AT + 600_001))
    last = run.alerts("forced_expiry")[-1]
    assert (last["id"], last["state"], last["severity"]) == ("default/forced_expiry/n1/reader/r1", "cleared", "critical")


def test_restart_closes_expired_holds_and_clears_their_audit_alerts() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0)
    run.feed(n1.open("r1", 9_000, T0), n1.begin("t1", 9_100, T0))
    critical(run, n1, T0 + 10_000, EXPIRE_AT)
    assert len(run.expires()) == 2
    n1.restart()
    run.feed(n1.hb(EXPIRE_AT + 1, 10_000, pinned_bytes=25 * GIB))
    assert sorted(a["id"] for a in run.alerts("forced_expiry", "cleared")) == [
        "default/forced_expiry/n1/reader/r1",
        "default/forced_expiry/n1/tx/t1",
    ]
    critical(run, n1, EXPIRE_AT + 10_000, EXPIRE_AT + 600_000)
    assert len(run.expires()) == 2, "nothing left to expire, nothing upgraded to hard"


def test_a_transaction_prepared_after_its_graceful_expiry_is_never_hard_expired() -> None:
    """Seed 002 / issue: expiry never targets a prepared transaction, not even the hard follow-up."""
    run, n1 = pressure_run(max_reader_lifetime_ms=0)
    run.feed(n1.begin("t1", 9_000, T0))
    critical(run, n1, T0 + 10_000, EXPIRE_AT)
    assert expired(run) == [("t1", "graceful", EXPIRE_AT)]
    run.feed(n1.prepare("t1", EXPIRE_AT + 1, coordinator="n2", participants=["n1", "n2"]))
    critical(run, n1, EXPIRE_AT + 10_000, EXPIRE_AT + 600_000)
    assert expired(run) == [("t1", "graceful", EXPIRE_AT)]
    run.feed(n1.end("t1", EXPIRE_AT + 600_001))
    assert [a["state"] for a in run.alerts("forced_expiry")] == ["raised", "cleared"]


def test_rate_limit_per_window_with_hard_upgrades_first() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0, max_expiries_per_window=2, expire_window_ms=60_000, expire_grace_ms=30_000)
    run.feed(*[n1.open(f"r{i}", 1_000 + i, T0) for i in range(1, 6)])
    critical(run, n1, T0 + 10_000, EXPIRE_AT + 400_000)
    e = EXPIRE_AT
    assert expired(run) == [
        ("r1", "graceful", e),
        ("r2", "graceful", e),
        ("r1", "hard", e + 60_000),  # due at e + 30 000, but the window is full until e + 60 000
        ("r2", "hard", e + 60_000),
        ("r3", "graceful", e + 120_000),
        ("r4", "graceful", e + 120_000),
        ("r3", "hard", e + 180_000),
        ("r4", "hard", e + 180_000),
        ("r5", "graceful", e + 240_000),
        ("r5", "hard", e + 270_000),
    ]
    # expire, band and snapshot_request directives share one seq per cluster: 1, 2, 3 ...
    per_node = [o.value for o in run.outputs if o.channel == DIRECTIVES and o.value["type"] in ("expire", "band")]
    assert [x["seq"] for x in per_node] == list(range(1, len(per_node) + 1))
    assert len(run.expires()) == 10


def test_hard_expiry_under_a_short_budget_goes_to_the_hold_that_pins_the_most() -> None:
    """Two graceful expiries of one moment are due for hard but the window has room for one: the one
    with the lower ts goes first (seed 003 9: the pinned bytes drive enforcement), not the one whose id
    sorts first."""
    run, n1 = pressure_run(max_reader_lifetime_ms=0, max_expiries_per_window=2, expire_window_ms=60_000, expire_grace_ms=100_000)
    run.feed(n1.open("z1", 1_000, T0), n1.open("a2", 2_000, T0), n1.open("m3", 3_000, T0))
    e = EXPIRE_AT
    critical(run, n1, T0 + 10_000, e + 100_000)
    assert expired(run) == [
        ("z1", "graceful", e),
        ("a2", "graceful", e),
        ("m3", "graceful", e + 60_000),
        ("z1", "hard", e + 100_000),  # budget 1: m3 holds a slot until e + 120 000
    ]
    critical(run, n1, e + 110_000, e + 200_000)
    assert expired(run)[4:] == [("a2", "hard", e + 120_000), ("m3", "hard", e + 160_000)]


def test_rate_limit_window_is_sliding_and_exact_at_the_millisecond() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0, max_expiries_per_window=1, expire_window_ms=60_000, expire_grace_ms=10**9)
    run.feed(n1.open("r1", 1_000, T0), n1.open("r2", 2_000, T0))
    critical(run, n1, T0 + 10_000, EXPIRE_AT)
    critical(run, n1, EXPIRE_AT + 59_999, EXPIRE_AT + 59_999)
    assert expired(run) == [("r1", "graceful", EXPIRE_AT)]
    critical(run, n1, EXPIRE_AT + 60_000, EXPIRE_AT + 60_000)
    assert expired(run) == [("r1", "graceful", EXPIRE_AT), ("r2", "graceful", EXPIRE_AT + 60_000)]


def test_max_reader_lifetime_boundary_is_inclusive() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=500_000)
    run.feed(n1.open("r1", 1_000, T0 + 7))
    critical(run, n1, T0 + 10_000, T0 + 500_000)
    run.feed(n1.hb(T0 + 500_006, 10_000, pinned_bytes=25 * GIB))
    assert run.expires() == []
    run.feed(n1.hb(T0 + 500_007, 10_000, pinned_bytes=25 * GIB))
    assert expired(run) == [("r1", "graceful", T0 + 500_007)]


def test_leaving_critical_stops_new_expiries_and_reentry_restarts_the_wait() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0, max_expiries_per_window=1, expire_window_ms=200_000, expire_grace_ms=10**9)
    run.feed(n1.open("r1", 1_000, T0), n1.open("r2", 2_000, T0), n1.open("r3", 3_000, T0))
    critical(run, n1, T0 + 10_000, EXPIRE_AT)
    assert expired(run) == [("r1", "graceful", EXPIRE_AT)]
    # below critical exit from t: still critical (window full) until t + 120 000, then warning
    t = EXPIRE_AT + 10_000
    run.feed(*hb_series(n1, t, t + 400_000, 10_000, 10 * GIB))
    assert run.alerts("pinned_bytes")[-1]["severity"] == "warning"
    assert run.alerts("pinned_bytes")[-1]["cluster_wall_ms"] == t + 120_000
    assert len(run.expires()) == 1, "the window has room again from EXPIRE_AT + 200 000, but the band is warning"
    # critical again: a new wait of expire_after_ms from the new critical entry
    t += 410_000
    critical(run, n1, t, t + 30_000)
    crit2 = run.alerts("pinned_bytes")[-1]
    assert crit2["severity"] == "critical" and crit2["cluster_wall_ms"] == t + 30_000
    critical(run, n1, t + 40_000, t + 89_999, 7)
    assert len(run.expires()) == 1
    critical(run, n1, t + 90_000, t + 90_000)
    assert expired(run)[1:] == [("r2", "graceful", t + 90_000)]


def test_expiry_disabled() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0, expire_enabled=False)
    run.feed(n1.open("r1", 1_000, T0))
    critical(run, n1, T0 + 10_000, T0 + 3_600_000)
    assert run.expires() == [] and run.alerts("forced_expiry") == []
    assert run.alerts("pinned_bytes", "raised")


def test_expire_seq_is_per_cluster_and_key_names_cluster_node_and_hold() -> None:
    run = Run(max_reader_lifetime_ms=0)
    a1, a2, b1 = NodeClient("n1", "ca"), NodeClient("n2", "ca"), NodeClient("n1", "cb")
    run.feed(topology(1, T0, {"n1": [], "n2": []}, "ca"), topology(1, T0, {"n1": []}, "cb"))
    run.feed(a1.open("r1", 1_000, T0), a2.begin("t1", 1_000, T0), b1.open("r1", 1_000, T0))
    for t in range(T0, EXPIRE_AT + 1, 10_000):
        run.feed(*[n.hb(t, 10_000, pinned_bytes=25 * GIB) for n in (a1, a2, b1)])
    outs = [o for o in run.outputs if o.channel == DIRECTIVES and o.value["type"] in ("expire", "band")]
    for cluster in ("ca", "cb"):  # one seq per cluster, shared by its per-node directives
        seqs = [o.value["seq"] for o in outs if o.value["cluster"] == cluster]
        assert seqs == list(range(1, len(seqs) + 1)), (cluster, seqs)
    assert sorted(o.key for o in outs if o.value["type"] == "expire") == [
        "ca/n1/reader/r1", "ca/n2/tx/t1", "cb/n1/reader/r1"]


# -- batch splits: state through JSON in the middle changes nothing -----------------------------------


def pressure_story() -> tuple[Policy, list[dict[str, Any]]]:
    """Every pressure feature in one log of two nodes: bands up and down, reader age, an in-doubt
    transaction, a stall, graceful and hard expiry under the rate limit."""
    policy = Policy(
        band_enter_window_ms=3_000,
        band_exit_window_ms=5_000,
        reader_age_warning_ms=8_000,
        reader_age_critical_ms=20_000,
        stall_ms=15_000,
        in_doubt_timeout_ms=6_000,
        expire_after_ms=4_000,
        max_reader_lifetime_ms=5_000,
        expire_grace_ms=3_000,
        max_expiries_per_window=2,
        expire_window_ms=6_000,
    )
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    evs: list[dict[str, Any]] = [topology(1, T0, {"n1": [], "n2": []}), n1.hb(T0, 1_000), n2.hb(T0, 1_000)]
    evs += [n1.open(f"r{i}", 100 + i, T0 + i) for i in range(5)]
    evs += [n2.begin("t1", 50, T0), n2.prepare("t1", T0 + 1, coordinator="n1", participants=["n1", "n2"]), n2.begin("t2", 60, T0)]
    for k in range(1, 50):
        t = T0 + k * 1_000
        pinned = 25 * GIB if k < 30 else (10 * GIB if k < 40 else GIB)
        evs += [n1.hb(t, 1_000 + k, pinned_bytes=pinned), n2.hb(t, 1_000 + k, pinned_bytes=pinned)]
        if k == 20:
            evs.append(n1.close("r3", t))
        if k == 33:
            evs.append(n2.end("t1", t))
    evs += [n1.close(f"r{i}", T0 + 50_000) for i in (0, 1, 2, 4)] + [n2.end("t2", T0 + 50_000), n2.hb(T0 + 50_001, 2_000)]
    return policy, evs


def run_log(policy: Policy, events: list[dict[str, Any]], splits: set[int]) -> tuple[list[Output], Engine]:
    engine = Engine(policy)
    outs: list[Output] = []
    for i, ev in enumerate(events):
        if i in splits:
            restore_engine(engine)
        for o in engine.process(json.dumps(ev), Position(EVENTS_TOPIC, 0, i)):
            check_output(o)
            outs.append(o)
    return outs, engine


def state_text(engine: Engine) -> str:
    return json.dumps(
        [
            [s.to_json() for _k, s in sorted(engine.nodes.items())],
            [s.to_json() for _k, s in sorted(engine.clusters.items())],
        ],
        sort_keys=True,
    )


def test_pressure_story_covers_every_feature() -> None:
    policy, evs = pressure_story()
    outs, _ = run_log(policy, evs, set())
    kinds = {(o.value["kind"], o.value["state"]) for o in outs if o.value["type"] == "alert"}
    for kind in ("pinned_bytes", "reader_age", "in_doubt_tx", "stall", "forced_expiry"):
        assert (kind, "raised") in kinds and (kind, "cleared") in kinds, kind
    modes = {o.value["mode"] for o in outs if o.value["type"] == "expire"}
    assert modes == {"graceful", "hard"}


def test_state_round_trip_at_every_point_gives_identical_outputs() -> None:
    policy, evs = pressure_story()
    straight, engine = run_log(policy, evs, set())
    want_state = state_text(engine)
    for k in range(1, len(evs)):
        outs, engine = run_log(policy, evs, {k})
        assert outs == straight, f"split before event {k}"
        assert state_text(engine) == want_state, f"split before event {k}"
    outs, engine = run_log(policy, evs, set(range(len(evs))))
    assert outs == straight and state_text(engine) == want_state


# -- forced expiry: hypothesis against a model of the rules ------------------------------------------

HYP_POLICY = Policy(
    pinned_warning_enter_bytes=100,
    pinned_warning_exit_bytes=80,
    pinned_critical_enter_bytes=200,
    pinned_critical_exit_bytes=160,
    band_enter_window_ms=500,
    band_exit_window_ms=1_500,
    reader_age_warning_ms=5_000,
    reader_age_critical_ms=10_000,
    in_doubt_timeout_ms=3_000,
    stall_ms=10_000,
    expire_after_ms=1_000,
    max_reader_lifetime_ms=2_000,
    expire_grace_ms=700,
    max_expiries_per_window=2,
    expire_window_ms=2_500,
)

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ["hb"] * 6 + ["open"] * 3 + ["begin"] * 2 + ["close", "prepare", "prepare", "end", "restart", "hb_plain"]
        ),
        st.one_of(st.sampled_from([0, 1, 200, 499, 500, 699, 700, 999, 1_000]), st.integers(0, 2_500)),
        st.sampled_from([0, 79, 80, 150, 159, 160, 199, 200] + [250] * 12),
        st.integers(0, 40),  # a ts, or which hold to pick
    ),
    min_size=10,
    max_size=100,
)


def pressure_log(actions: list[tuple[str, int, int, int]]) -> list[dict[str, Any]]:
    """One node's well-behaved events from the generated actions (non-decreasing wall_ms)."""
    n1 = NodeClient("n1")
    t = T0
    evs = [topology(1, T0, {"n1": []}), n1.hb(T0, 1_000)]
    readers: list[str] = []
    txs: dict[str, bool] = {}
    count = 0
    for action, gap, pinned, x in actions:
        t += gap
        count += 1
        if action == "hb":
            evs.append(n1.hb(t, 1_000, pinned_bytes=pinned))
        elif action == "hb_plain":
            evs.append(n1.hb(t, 1_000))
        elif action == "open":
            readers.append(f"r{count}")
            evs.append(n1.open(f"r{count}", x, t))
        elif action == "close" and readers:
            evs.append(n1.close(readers.pop(x % len(readers)), t))
        elif action == "begin":
            txs[f"t{count}"] = False
            evs.append(n1.begin(f"t{count}", x, t))
        elif action == "prepare" and [k for k, p in txs.items() if not p]:
            open_txs = [k for k, p in txs.items() if not p]
            tid = open_txs[x % len(open_txs)]
            txs[tid] = True
            evs.append(n1.prepare(tid, t, coordinator="n7", participants=["n1", "n7"]))
        elif action == "end" and txs:
            tid = sorted(txs)[x % len(txs)]
            del txs[tid]
            evs.append(n1.end(tid, t))
        elif action == "restart":
            n1.restart()
            readers.clear()
            txs = {k: p for k, p in txs.items() if p}
            evs.append(n1.hb(t, 1_000, pinned_bytes=pinned))
    return evs


# a transaction expired gracefully, then prepared before its grace period ran out
PREPARED_AFTER_GRACEFUL = (
    [("begin", 0, 250, 5)] + [("hb", 500, 250, 0)] * 5 + [("prepare", 1, 250, 0)] + [("hb", 1_000, 250, 0)] * 3
)


@SETTINGS
@given(ACTIONS)
@example(PREPARED_AFTER_GRACEFUL)
def test_forced_expiry_obeys_its_rules(actions: list[tuple[str, int, int, int]]) -> None:
    """Against a model of the holds built from the events alone: each expiry targets a live hold,
    never a prepared transaction; graceful ones only under critical pressure lasting expire_after_ms,
    only holds open max_reader_lifetime_ms, lowest ts first; hard only after the grace period of a
    graceful one and only while still critical; never more than max_expiries_per_window in any expire_window_ms; each with its
    audit alert, cleared when the hold closes; and nothing left undone while the budget allows."""
    p = HYP_POLICY
    evs = pressure_log(actions)
    engine = Engine(p)
    live: dict[str, list[Any]] = {}  # id -> [kind, ts, opened_wall, prepared]
    expired: dict[str, list[Any]] = {}  # id -> [mode, wall]
    emitted: list[int] = []  # walls of expire directives
    critical_since: int | None = None
    inc = 0
    for i, ev in enumerate(evs):
        outs = engine.process(json.dumps(ev), Position(EVENTS_TOPIC, 0, i))
        for o in outs:
            check_output(o)
        # the model applies the event
        closed: list[str] = []
        typ = ev["type"]
        if ev.get("incarnation", inc) > inc:
            inc = ev["incarnation"]
            closed += [h for h, v in live.items() if not (v[0] == "tx" and v[3])]
        if typ == "reader_open":
            live[ev["reader_id"]] = ["reader", ev["read_ts"], ev["wall_ms"], False]
        elif typ == "tx_begin":
            live[ev["tx_id"]] = ["tx", ev["begin_ts"], ev["wall_ms"], False]
        elif typ == "tx_prepare":
            live[ev["tx_id"]][3] = True
        elif typ == "reader_close":
            closed.append(ev["reader_id"])
        elif typ == "tx_end":
            closed.append(ev["tx_id"])
        kinds = {h: live[h][0] for h in closed if h in live}
        for h in closed:
            live.pop(h, None)
        now = ev["wall_ms"]
        for a in [o.value for o in outs if o.value["type"] == "alert" and o.value["kind"] == "pinned_bytes"]:
            critical_since = a["cluster_wall_ms"] if (a["state"], a["severity"]) == ("raised", "critical") else None
        cleared = sorted(
            a["id"]
            for a in (o.value for o in outs)
            if a["type"] == "alert" and a["kind"] == "forced_expiry" and a["state"] == "cleared"
        )
        assert cleared == sorted(f"default/forced_expiry/n1/{kinds[h]}/{h}" for h in closed if h in expired)
        for h in closed:
            expired.pop(h, None)
        # what the engine did
        eligible = sorted(
            (v[1], v[2], v[0], h)
            for h, v in live.items()
            if h not in expired and not v[3] and now - v[2] >= p.max_reader_lifetime_ms
        )
        due_before = sorted(
            (at, live[h][1], live[h][2], live[h][0], h)
            for h, (mode, at) in expired.items()
            if mode == "graceful" and now - at >= p.expire_grace_ms and not live[h][3]
        )
        graceful: list[str] = []
        hard: list[str] = []
        raised = [
            o.value
            for o in outs
            if o.value["type"] == "alert" and o.value["kind"] == "forced_expiry" and o.value["state"] == "raised"
        ]
        exps = [o for o in outs if o.channel == DIRECTIVES and o.value["type"] == "expire"]
        assert [a["id"] for a in raised] == [f"default/forced_expiry/n1/{'/'.join(o.key.split('/')[-2:])}" for o in exps]
        for o, a in zip(exps, raised, strict=True):
            e = o.value
            hid = e.get("reader_id") or e["tx_id"]
            assert o.key == f"default/n1/{'reader' if 'reader_id' in e else 'tx'}/{hid}"
            assert hid in live, "only a live hold"
            kind, _ts, _opened, prepared = live[hid]
            assert ("reader_id" in e) == (kind == "reader")
            assert not prepared, "never a prepared transaction"
            assert a["severity"] == ("critical" if e["mode"] == "hard" else "warning")
            assert e["cluster_wall_ms"] == now
            if e["mode"] == "graceful":
                assert hid not in expired
                assert critical_since is not None and now - critical_since >= p.expire_after_ms
                graceful.append(hid)
                expired[hid] = ["graceful", now]
            else:
                assert expired.get(hid, [None])[0] == "graceful", "hard only after graceful"
                assert now - expired[hid][1] >= p.expire_grace_ms
                assert critical_since is not None, "hard only while pressure is still critical"
                assert not graceful, "hard follow-ups come before new graceful expiries"
                hard.append(hid)
                expired[hid] = ["hard", now]
            emitted.append(now)
            assert sum(1 for w in emitted if now - w < p.expire_window_ms) <= p.max_expiries_per_window
        assert graceful == [h for *_x, h in eligible[: len(graceful)]], "lowest ts (then oldest) first"
        assert hard == [h for *_x, h in due_before[: len(hard)]], "first expired first, then lowest ts"
        full = sum(1 for w in emitted if now - w < p.expire_window_ms) >= p.max_expiries_per_window
        if critical_since is not None and now - critical_since >= p.expire_after_ms and len(graceful) < len(eligible):
            assert full, "an eligible hold was left while the budget allowed"
        due = [h for h, (mode, at) in expired.items() if mode == "graceful" and now - at >= p.expire_grace_ms and not live[h][3]]
        assert not due or full or critical_since is None, "a hard expiry was due while critical and the budget allowed"


@SETTINGS
@given(ACTIONS, st.sets(st.integers(1, 90), max_size=8))
def test_batch_split_invariance_with_pressure(actions: list[tuple[str, int, int, int]], splits: set[int]) -> None:
    evs = pressure_log(actions)
    straight, engine = run_log(HYP_POLICY, evs, set())
    outs, engine2 = run_log(HYP_POLICY, evs, splits)
    assert outs == straight
    assert state_text(engine2) == state_text(engine)


def test_a_graceful_expiry_is_not_made_hard_once_pressure_left_critical() -> None:
    """Seed 003, section 9: hard kill only "under sustained critical pressure". A reader expired
    gracefully while critical is not escalated to hard after the band drops below critical."""
    from safepoint.core.bands import band_step
    from safepoint.core.node import NodeState
    from safepoint.core.policy import Policy
    from safepoint.core.signals import ExpireOrder

    policy = Policy(pinned_warning_enter_bytes=100, pinned_warning_exit_bytes=80, pinned_critical_enter_bytes=200,
                    pinned_critical_exit_bytes=160, band_enter_window_ms=0, band_exit_window_ms=0,
                    expire_after_ms=0, max_reader_lifetime_ms=0, expire_grace_ms=1_000)
    state = NodeState("c", "n")
    ev = {"v": 1, "cluster": "c", "node": "n", "incarnation": 0}
    state.apply({**ev, "type": "heartbeat", "seq": 0, "wall_ms": 0, "mvcc_now": 10, "pinned_bytes": 0}, policy)
    state.apply({**ev, "type": "reader_open", "seq": 1, "wall_ms": 1, "reader_id": "r", "read_ts": 5}, policy)
    u = state.apply({**ev, "type": "heartbeat", "seq": 2, "wall_ms": 2, "mvcc_now": 10, "pinned_bytes": 500}, policy)
    assert not isinstance(u, str) and [s.body["mode"] for s in u.signals if isinstance(s, ExpireOrder)] == ["graceful"]
    u = state.apply({**ev, "type": "heartbeat", "seq": 3, "wall_ms": 3, "mvcc_now": 10, "pinned_bytes": 0}, policy)
    u = state.apply({**ev, "type": "heartbeat", "seq": 4, "wall_ms": 5_000, "mvcc_now": 10, "pinned_bytes": 0}, policy)
    assert not isinstance(u, str)
    assert state.pressure.pinned_band.level == 0 and not [s for s in u.signals if isinstance(s, ExpireOrder)]
    assert band_step is not None


# -- forced expiry and in-doubt transactions at the edges -----------------------------------------


EXPIRY_PRESSURE = dict(pinned_critical_enter_bytes=100, pinned_critical_exit_bytes=80, pinned_warning_enter_bytes=50,
                       pinned_warning_exit_bytes=40, band_enter_window_ms=0, band_exit_window_ms=0, expire_after_ms=0,
                       max_reader_lifetime_ms=0, expire_grace_ms=1_000, max_expiries_per_window=10)


def raised_ids(run: Run, kind: str = "horizon_violation") -> list[str]:
    return [a["id"] for a in run.alerts(kind, "raised")]


def test_a_reader_and_a_transaction_with_one_id_are_two_holds_for_forced_expiry() -> None:
    run = Run(Policy(**EXPIRY_PRESSURE))
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


def test_wall_ms_zero_is_a_time_for_the_in_doubt_timer() -> None:
    run = Run(in_doubt_timeout_ms=1_000)
    n1 = NodeClient("n1")
    run.feed(topology(1, 0, {"n1": []}), n1.hb(0, 1_000), n1.begin("t1", 900, 0), n1.prepare("t1", 0))
    # a snapshot before the timeout names the prepared transaction again: it was prepared at 0, not now
    run.feed(n1.snapshot(500, readers=[], txs=[{"tx_id": "t1", "begin_ts": 900, "prepared": True}]))
    run.feed(n1.hb(1_000, 1_000))
    [a] = run.alerts("in_doubt_tx", "raised")
    assert (a["since_wall_ms"], a["value"]) == (0, 1_000)
