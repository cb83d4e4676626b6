"""The benchmark's capacity model (benchmarks/bench_capacity.py) and its many-clusters workload
(benchmarks/bench_workload.py)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_capacity import capacity_inputs, capacity_lines, fleet_needs  # noqa: E402
from bench_workload import build_workload  # noqa: E402

from safepoint.core import Engine  # noqa: E402


def _run(master: str, rate: float, broker_us: float, rest_us: float, operator_us: float | None = None) -> dict:
    return {"master": master, "status": True, "sustained_events_per_s": rate, "operator_us_per_event": operator_us,
            "cpu_us_per_event": {"broker": broker_us, "workers": rest_us}}


def _res(clusters: int = 8) -> dict:
    # local[1]: 40k ev/s at 25 us besides a broker of 5 us (1.0 core + 0.2), 10 us of it the operator's;
    # local[2]: 70k at 26 us, the broker 0.35 cores
    return {"args": {"clusters": clusters, "partitions": 4, "shuffle_partitions": 2}, "machine": {"cpus": 2},
            "spark_throughput": [_run("local[1]", 40_000, 5, 25, operator_us=10), _run("local[2]", 70_000, 5, 26)],
            "raw_consume": {"events_per_s": 400_000},
            "fleet": {"eager": {"events_per_reader": 2.0}, "lazy": {"events_per_reader": 0.01}}}


def test_the_inputs_come_from_the_runs_own_figures() -> None:
    inp = capacity_inputs(_res())
    assert inp["job_us_per_event_1"] == pytest.approx(25)
    assert inp["per_core_events_per_s"] == pytest.approx(40_000)
    assert inp["job_us_per_event"] == pytest.approx(26)
    assert inp["cluster_limit_events_per_s"] == pytest.approx(100_000)  # 1e6 / 10 us
    chk = inp["check"]
    assert chk["master"] == "local[2]" and chk["cores_left"] == pytest.approx(2 - 0.35)
    assert chk["operator_tasks"] == pytest.approx(1.65)  # fewer cores than clusters and shuffle partitions
    assert chk["predicted_events_per_s"] == pytest.approx(1e6 / (15 / 1.65 + 10 / 1.65))
    assert chk["measured_events_per_s"] == 70_000


def test_one_cluster_is_bound_by_its_serial_round() -> None:
    chk = capacity_inputs(_res(clusters=1))["check"]
    assert chk["operator_tasks"] == 1
    assert chk["predicted_events_per_s"] == pytest.approx(1e6 / (15 / 1.65 + 10))  # the read stage spread, the round not


def test_a_fleet_sized_by_the_model() -> None:
    inp = capacity_inputs(_res())
    eager = fleet_needs(inp, clusters=100, nodes=50, reader_rate=500, heartbeat_s=1, events_per_reader=2.0)
    assert eager["events_per_s"] == pytest.approx(100 * 50 * 1001)
    assert eager["cores"] == pytest.approx(100 * 50 * 1001 * 26e-6 / 0.7)
    assert eager["partitions"] == max(math.ceil(eager["cores"]), math.ceil(100 * 50 * 1001 / 400_000))
    assert eager["cluster_share_of_limit"] == pytest.approx(50 * 1001 / 100_000)
    lazy = fleet_needs(inp, clusters=100, nodes=50, reader_rate=500, heartbeat_s=1, events_per_reader=0.01)
    assert lazy["events_per_s"] == pytest.approx(100 * 50 * 6)
    text = "\n".join(capacity_lines(_res()))
    assert "100,000 ev/s for one cluster" in text and "measured 70,000 ev/s" in text, text


def test_no_model_without_a_one_core_run() -> None:
    res = _res()
    res["spark_throughput"] = res["spark_throughput"][1:]
    assert capacity_lines(res) == []


def test_many_clusters_share_the_load_and_run_as_one_log() -> None:
    one = build_workload("w", 40, 2_000, seed=3, long_share=0.001, probe_hz=8, events=6_000)
    many = build_workload("w", 40, 2_000, seed=3, long_share=0.001, probe_hz=8, events=6_000, clusters=8)
    assert len(many.events) == len(one.events) == 6_000
    walls = [w for w, _, _ in many.events]
    assert walls == sorted(walls), "merged by wall_ms"
    per_cluster = Counter(json.loads(v)["cluster"] for _, _, v in many.events)
    assert sorted(per_cluster) == [f"c{i}" for i in range(8)] and set(per_cluster.values()) == {750}
    assert many.meta["clusters"] == 8 and many.meta["nodes"] == 40
    engine = Engine()  # every cluster's log is whole: each reaches a safe point of its own
    for offset, (_, _, v) in enumerate(many.events):
        engine.process_at(v, "events", 0, offset)
    assert sorted(engine.clusters) == [f"c{i}" for i in range(8)]
    assert all(c.safe_ts > 0 for c in engine.clusters.values())
