"""The safety edges through the real broker and Spark job, equal to replay: a replication group's
leader hand-over (no leader for a while), a hold without a namespace and a service hold below a
namespace's bound, and control events from skewed clocks (a hold stamped ten years ahead, a
resume from a clock behind its pause)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import Engine, Position
from safepoint.core.codec import encode
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query

from kafka_util import produce, read_topic, unique
from tests_support import replay_policies

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000
TEN_YEARS_MS = 10 * 365 * 86_400_000


class Node:
    def __init__(self, name: str) -> None:
        self.name, self.seq = name, -1

    def ev(self, kind: str, wall: int, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"v": 1, "type": kind, "cluster": "c1", "node": self.name, "incarnation": 0, "seq": self.seq,
                "wall_ms": T0 + wall, **fields}

    def hb(self, wall: int, mvcc: int, leader: bool | None = None, published: int | None = None) -> dict[str, Any]:
        groups = {} if leader is None else {"groups": [{"group": "g", "leader": leader, "published_min_tx_time": published}]}
        return self.ev("heartbeat", wall, mvcc_now=mvcc, **groups)


def control(kind: str, wall_ms: int, action_id: str, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "type": kind, "cluster": "c1", "wall_ms": wall_ms, "action_id": action_id, **fields}


def edge_log() -> list[dict[str, Any]]:
    n1, n2, n3 = Node("n1"), Node("n2"), Node("n3")
    return [
        {"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": T0, "nodes": {"n1": ["g"], "n2": ["g"], "n3": []}},
        n1.hb(0, 1_000, True, 700), n2.hb(0, 1_000, False, None), n3.hb(0, 1_000),  # safe_ts 700
        n1.hb(1_000, 1_100, False, None), n3.hb(1_000, 1_100),  # the leader steps down: no leader for g
        n2.hb(2_000, 1_100, True, 750),  # the new leader publishes 750: safe_ts 750, never past it before
        n3.ev("reader_open", 3_000, reader_id="report", read_ts=800, namespace="a", label="tenant a report"),
        n1.hb(3_001, 2_000, False, None), n2.hb(3_001, 2_000, True, 1_900), n3.hb(3_001, 2_000),
        # safe_ts 800, namespace_safe_ts 1,900: a hold without a namespace between them is a violation,
        n1.ev("reader_open", 4_000, reader_id="etl", read_ts=1_000, label="etl of every tenant"),
        # and a service hold there is refused
        control("service_hold", T0 + 4_001, "backup-1", holder="backup", ts=1_200, ttl_ms=60_000),
        # a publisher ten years ahead: its hold still expires 5 s of cluster time after it was applied
        control("service_hold", T0 + TEN_YEARS_MS, "cdc-1", holder="cdc", ts=1_950, ttl_ms=5_000),
        control("pause", T0 + TEN_YEARS_MS + 1, "pause-1", reason="restore"),
        n1.hb(6_000, 3_000, False, None), n2.hb(6_000, 3_000, True, 2_900), n3.hb(6_000, 3_000),
        control("resume", T0 - 60_000, "resume-1"),  # a clock behind the pause's: it still resumes
        n1.ev("reader_close", 10_000, reader_id="etl"), n3.ev("reader_close", 10_000, reader_id="report"),
        n1.hb(10_000, 4_000, False, None), n2.hb(10_000, 4_000, True, 3_900), n3.hb(10_000, 4_000),
    ]


def test_the_safety_edges_through_the_job_equal_replay(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("edges")
    settings = load_settings(flags={
        "bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "status_topic": f"{tag}.status",
        "retention": 100, "node_lease_ms": 60_000,
        "control_on_events_topic": True}, environ={})  # one partition in file order: the control events on it too
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 1, log_append_time=False))
    log = edge_log()
    produce(broker.bootstrap, settings.events_topic, [(e.get("node") or "c1", e) for e in log])
    q = build_query(spark, settings, str(tmp_path / "ckpt"))
    try:
        q.processAllAvailable()
    finally:
        q.stop()

    engine = Engine(replay_policies(settings, tmp_path / "ckpt"))
    expected: dict[str, list[str]] = {"directives": [], "alerts": []}
    for i, e in enumerate(log):
        for o in engine.process(json.dumps(e), Position(settings.events_topic, 0, i, None)):
            expected[o.channel].append(encode(o.value))
    got = {ch: [encode({k: v for k, v in m.items() if k != "key"}) for m in read_topic(broker.bootstrap, t)]
           for ch, t in (("directives", settings.directives_topic), ("alerts", settings.alerts_topic))}
    assert got == expected

    directives = [json.loads(d) for d in got["directives"] if json.loads(d)["type"] == "compaction"]
    alerts = [json.loads(a) for a in got["alerts"]]
    first_750 = next(i for i, d in enumerate(directives) if d["safe_ts"] == 750)
    assert [d["safe_ts"] for d in directives[:first_750]] == [700], "the leaderless group held the safe point"
    raised = {(a["kind"], a["state"]) for a in alerts}
    assert {("leaderless_group", "raised"), ("leaderless_group", "cleared")} <= raised
    [etl] = [a for a in alerts if a["kind"] == "horizon_violation" and a["state"] == "raised"]
    assert etl["value"] == 1_000 and etl["threshold"] == 1_900 and "etl" in etl["detail"]
    [refused] = [a for a in alerts if a["kind"] == "service_hold_refused"]
    assert refused["threshold"] == 1_900
    [expired] = [a for a in alerts if a["kind"] == "service_hold_expired"]
    assert expired["cluster_wall_ms"] == T0 + 10_000, "expired on cluster time, not the publisher's"
    assert ("paused", "cleared") in raised, "the resume from a clock behind the pause's applied"
    assert directives[-1]["safe_ts"] == 3_900 and "paused" not in directives[-1]
    late = [a for a in alerts if a["kind"] == "missing_node" and a["cluster_wall_ms"] > T0]
    assert late == [], "no clock jump made a node stale (only the start's not-yet-reported nodes)"
    status = [m for m in read_topic(broker.bootstrap, settings.status_topic) if m["key"] == "c1"][-1]
    assert {a["id"]: a["outcome"] for a in status["actions"]} == {
        "backup-1": "refused", "cdc-1": "expired", "pause-1": "applied", "resume-1": "applied"}
