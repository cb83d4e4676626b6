"""Issue 4's acceptance through the real broker and Spark job: a node whose pinned_bytes grows
under a long reader gets warning, critical and a graceful expire; once the node closes the
reader the band clears and the safe point advances. The job's outputs equal replay's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import Engine, Position
from safepoint.core.codec import encode
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query

from kafka_util import produce, read_topic, unique
from tests_support import events_by_partition, replay_policies

pytestmark = pytest.mark.integration


def pressure_log() -> list[dict[str, Any]]:
    seq = {"n1": 0, "n2": 0}

    def node(n: str, kind: str, wall: int, **f: Any) -> dict[str, Any]:
        seq[n] += 1
        return {"v": 1, "type": kind, "cluster": "c1", "node": n, "incarnation": 1, "seq": seq[n], "wall_ms": wall, **f}

    log: list[dict[str, Any]] = [{"v": 1, "type": "topology", "cluster": "c1", "wall_ms": 0, "version": 1,
                                  "nodes": {"n1": [], "n2": []}}]
    log.append(node("n1", "heartbeat", 1_000, mvcc_now=1_000, pinned_bytes=0))
    log.append(node("n2", "heartbeat", 1_001, mvcc_now=1_000))
    log.append(node("n1", "reader_open", 1_002, reader_id="r-long", read_ts=1_000, label="report-job"))
    closed_at = 12_000
    for i, t in enumerate(range(1_500, 16_000, 500)):
        mvcc = t
        if t == closed_at:
            log.append(node("n1", "reader_close", t - 1, reader_id="r-long"))
        pinned = 60 * (i + 1) if t < closed_at else 0  # 60, 120, ... bytes pinned by the long reader
        log.append(node("n1", "heartbeat", t, mvcc_now=mvcc, pinned_bytes=pinned))
        log.append(node("n2", "heartbeat", t + 1, mvcc_now=mvcc))
    return log


def test_growing_pinned_bytes_warns_goes_critical_expires_and_clears(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("pressure")
    settings = load_settings(flags={
        "bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "node_lease_ms": 5_000,
        "pinned_warning_enter_bytes": 100, "pinned_warning_exit_bytes": 80,
        "pinned_critical_enter_bytes": 400, "pinned_critical_exit_bytes": 320,
        "band_enter_window_ms": 1_000, "band_exit_window_ms": 2_000,
        "expire_after_ms": 1_000, "max_reader_lifetime_ms": 3_000, "expire_grace_ms": 60_000,
        "reader_age_warning_ms": 600_000, "reader_age_critical_ms": 600_000, "stall_ms": 0,
    }, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
    log = pressure_log()
    produce(broker.bootstrap, settings.events_topic, [(e.get("node", "c1"), e) for e in log])
    q = build_query(spark, settings, str(tmp_path / "ckpt"))
    try:
        q.processAllAvailable()
    finally:
        q.stop()

    alerts = read_topic(broker.bootstrap, settings.alerts_topic)
    directives = read_topic(broker.bootstrap, settings.directives_topic)
    pinned = [(a["state"], a["severity"]) for a in alerts if a["kind"] == "pinned_bytes"]
    assert pinned == [("raised", "warning"), ("raised", "critical"), ("cleared", "critical")]
    warning = next(a for a in alerts if a["kind"] == "pinned_bytes")
    assert warning["node"] == "n1" and "r-long" in warning["detail"] and warning["key"] == "n1"

    expires = [d for d in directives if d.get("type") == "expire"]
    bands = [(d["node"], d["band"], d["seq"]) for d in directives if d.get("type") == "band"]
    assert bands[:2] == [("n1", "warning", 1), ("n1", "critical", 2)], bands  # the node's admission follows them
    assert bands[-1][1] == "normal" and bands[-1][0] == "n1"
    # the per-node directives share one seq: the expiry comes after the two band changes
    assert [(e["node"], e["reader_id"], e["mode"], e["seq"]) for e in expires] == [("n1", "r-long", "graceful", 3)]
    assert expires[0]["key"] == "c1/n1/reader/r-long"
    audit = [(a["state"], a["severity"]) for a in alerts if a["kind"] == "forced_expiry"]
    assert audit == [("raised", "warning"), ("cleared", "warning")]

    compaction = [d for d in directives if d.get("type") == "compaction"]
    before_close = [d["safe_ts"] for d in compaction if d["cluster_wall_ms"] < 11_999]
    after_close = [d["safe_ts"] for d in compaction if d["cluster_wall_ms"] >= 11_999]
    assert set(before_close) == {1_000}, "the long reader held the safe point"
    assert after_close and after_close[-1] == 15_500, "after the close the safe point caught up"
    critical = next(a for a in alerts if a["kind"] == "pinned_bytes" and a["severity"] == "critical")
    cleared = alerts.index(next(a for a in alerts if a["kind"] == "pinned_bytes" and a["state"] == "cleared"))
    assert alerts.index(critical) < cleared
    assert next(a for a in alerts if a["kind"] == "pinned_bytes" and a["state"] == "cleared")["cluster_wall_ms"] >= 14_000

    # replay in the log's order, each event at the partition and offset the job read it from (a
    # directive's positions name them)
    at = {value: (p, o) for p, o, _key, value in events_by_partition(broker.bootstrap, settings.events_topic)}
    engine = Engine(replay_policies(settings, tmp_path / "ckpt"))
    expected = {"directives": [], "alerts": []}
    for e in log:
        value = json.dumps(e).encode()
        for o in engine.process(value, Position(settings.events_topic, *at[value])):
            expected[o.channel].append(encode(o.value))
    strip = [encode({k: v for k, v in m.items() if k != "key"}) for m in directives]
    assert sorted(strip) == sorted(expected["directives"])
    assert [encode({k: v for k, v in m.items() if k != "key"}) for m in alerts] == expected["alerts"]


def test_the_pressure_example_through_the_job_equals_replay(broker: Any, spark: Any, tmp_path: Any) -> None:
    """examples/pressure/ (forecast, throttled and refused long reads, emergency in and out, a
    forced expiry, the report's cost on the directives) through the broker and the Spark job:
    every directive and alert is what replay gives for the same positions."""
    root = Path(__file__).resolve().parents[2] / "examples" / "pressure"
    tag = unique("pressure-example")
    settings = load_settings(root / "safepoint.toml", flags={
        "bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter"}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
    log = [json.loads(x) for x in (root / "events.jsonl").read_text().splitlines()]
    produce(broker.bootstrap, settings.events_topic, [(e.get("node", e["cluster"]), e) for e in log])
    q = build_query(spark, settings, str(tmp_path / "ckpt"))
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    alerts = read_topic(broker.bootstrap, settings.alerts_topic)
    directives = read_topic(broker.bootstrap, settings.directives_topic)
    kinds = {(a["kind"], a["state"]) for a in alerts}
    assert {("pressure_forecast", "raised"), ("emergency", "raised"), ("emergency", "cleared"),
            ("forced_expiry", "raised")} <= kinds, kinds
    assert [d["band"] for d in directives if d.get("type") == "band"] == ["warning", "critical", "normal"]
    compaction = [d for d in directives if d.get("type") == "compaction"]
    assert any("emergency" in d for d in compaction) and "emergency" not in compaction[-1]
    assert any((d["blocker"] or {}).get("cost_bytes", 0) > 500_000_000 for d in compaction)

    at = {value: (p, o) for p, o, _key, value in events_by_partition(broker.bootstrap, settings.events_topic)}
    engine = Engine(replay_policies(settings, tmp_path / "ckpt"))
    expected: dict[str, list[str]] = {"directives": [], "alerts": []}
    for e in log:
        value = json.dumps(e).encode()
        for o in engine.process(value, Position(settings.events_topic, *at[value])):
            expected[o.channel].append(encode(o.value))
    assert sorted(encode({k: v for k, v in m.items() if k != "key"}) for m in directives) == sorted(expected["directives"])
    assert [encode({k: v for k, v in m.items() if k != "key"}) for m in alerts] == expected["alerts"]
