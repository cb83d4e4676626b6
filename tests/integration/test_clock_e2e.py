"""Time one node cannot rule, through the job: the events topic stamped by the broker
(``LogAppendTime``, as the job creates it), three nodes paced in real time, one clock a minute
behind, one a day ahead for two seconds, under a backup's service hold."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from safepoint.connectors.kafka.topics import LOG_APPEND_TIME, ensure_topics, timestamp_type, topic_specs
from safepoint.core import Engine
from safepoint.core.origin import CONTROL, EVENTS
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query

from kafka_util import read_topic, topic_flags, unique
from test_parity import replay_batch, unkeyed
from tests_support import replay_policies

pytestmark = pytest.mark.integration

SKEW = {"n1": lambda s: 0, "n2": lambda s: -60_000, "n3": lambda s: 86_400_000 if 2.0 <= s < 4.0 else 0}


def paced_log(bootstrap: str, topic: str, control: str, seconds: float = 7.0, every: float = 0.1) -> int:
    """Heartbeats of n1, n2, n3 every ``every`` s for ``seconds``, each with its node's clock; a
    backup's hold (TTL 20 s, ts just after the start) set at 0.5 s and released at 5.5 s, on ``control``."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
    start = time.time()
    t0 = int(start * 1000)
    seq = 0
    sent = 0
    hold_set = released = False
    while (elapsed := time.time() - start) < seconds:
        now = int(time.time() * 1000)
        seq += 1
        for node, skew in SKEW.items():
            ev = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": 1, "seq": seq,
                  "wall_ms": now + skew(elapsed), "mvcc_now": now}
            p.produce(topic, key=node, value=json.dumps(ev))
            sent += 1
        if elapsed >= 0.5 and not hold_set:
            hold_set = True
            p.produce(control, key="c1", value=json.dumps({"v": 1, "type": "service_hold", "cluster": "c1", "holder": "backup",
                                                         "ts": t0 + 200, "ttl_ms": 20_000, "wall_ms": now,
                                                         "action_id": "b-1"}))
            sent += 1
        if elapsed >= 5.5 and not released:
            released = True
            p.produce(control, key="c1", value=json.dumps({"v": 1, "type": "service_release", "cluster": "c1",
                                                         "holder": "backup", "wall_ms": now, "action_id": "b-2"}))
            sent += 1
        p.poll(0)
        time.sleep(max(0.0, start + seq * every - time.time()))
    assert p.flush(20) == 0
    return t0


def test_one_nodes_clock_rules_nothing_through_the_job(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("clock")
    settings = load_settings(flags={"bootstrap": broker.bootstrap, **topic_flags(tag), "retention": 1_000,
                                    "node_lease_ms": 2_000, "max_clock_skew_ms": 1_000, "clock_skew_window_ms": 500},
                             environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2))  # as the job creates it
    assert timestamp_type(settings.librdkafka(), settings.events_topic) == LOG_APPEND_TIME
    t0 = paced_log(broker.bootstrap, settings.events_topic, settings.control_topic)
    q = build_query(spark, settings, str(tmp_path / "ckpt"))
    try:
        q.processAllAvailable()
    finally:
        q.stop()

    directives = [d for d in read_topic(broker.bootstrap, settings.directives_topic) if d["type"] == "compaction"]
    alerts = [a for a in read_topic(broker.bootstrap, settings.alerts_topic) if a["type"] == "alert"]
    assert not [a for a in alerts if a["kind"] == "service_hold_expired"], "the jump expired the backup's hold"
    stale = [a for a in alerts if a["kind"] == "missing_node" and a["state"] == "raised" and a["cluster_wall_ms"] > t0 + 500]
    assert stale == [], "a node was called stale"
    skewed = {(a["node"], a["state"]) for a in alerts if a["kind"] == "clock_skew"}
    assert {("n2", "raised"), ("n3", "raised"), ("n3", "cleared")} <= skewed
    assert ("n1", "raised") not in skewed
    held = [d["safe_ts"] for d in directives if d["cluster_wall_ms"] < t0 + 5_400]
    assert held and max(held) <= t0 + 200, "the backup's hold held through the jump"
    assert directives[-1]["safe_ts"] > t0 + 200, "released, the safe point moved on (held by n2's own MVCC time)"
    assert all(d["cluster_wall_ms"] < t0 + 60_000 for d in directives), "cluster time is the broker's"

    # job = replay: replay over the topic with the broker's times, as one batch, gives the same
    expected = {ch: [] for ch in ("directives", "alerts")}  # type: dict[str, list[str]]
    from safepoint.core.codec import encode

    origins = {settings.events_topic: EVENTS, settings.control_topic: CONTROL}
    for o in replay_batch(Engine(replay_policies(settings, tmp_path / "ckpt"), origins=origins), broker.bootstrap, settings.events_topic, {},
                          settings.control_topic):
        if o.channel in expected:
            expected[o.channel].append(encode(o.value))
    assert unkeyed(broker.bootstrap, settings.directives_topic) == expected["directives"]
    assert unkeyed(broker.bootstrap, settings.alerts_topic) == expected["alerts"]
