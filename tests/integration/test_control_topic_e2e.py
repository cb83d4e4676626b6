"""Control apart, through the job on the real broker: an operator's hold set with the CLI on the
control topic holds; a release and a pause forged by a plain producer on the events topic (which
every node may write) are refused, dead-lettered and alerted, naming the topic and the key; the
safe point keeps moving up to the hold. An old publisher's control event on the events topic
applies only with ``control_on_events_topic``. Both runs are the job = replay check (``verify``)
over the two topics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from safepoint.cli import main as cli

from kafka_util import read_topic
from tests_support import QueryJob, caught_up, log_ends, make_settings, send, verify, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def compactions(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    return [d for d in read_topic(bootstrap, topic, 2) if d["type"] == "compaction"]


class Cluster:
    """Two nodes of cluster c1 beating on the events topic (their own keys), and its topology."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic, self.seq = bootstrap, topic, 0
        self.t0 = time.time_ns() // 1_000_000
        send(bootstrap, topic, [(0, "c1", {"v": 1, "type": "topology", "cluster": "c1", "version": 1,
                                           "wall_ms": self.t0, "nodes": {"n1": [], "n2": []}})])

    def beat(self, mvcc: int) -> None:
        self.seq += 1
        wall = max(self.t0 + self.seq, time.time_ns() // 1_000_000)
        send(self.bootstrap, self.topic, [(1, n, {"v": 1, "type": "heartbeat", "cluster": "c1", "node": n, "incarnation": 1,
                                                  "seq": self.seq, "wall_ms": wall, "mvcc_now": mvcc}) for n in ("n1", "n2")])


def test_only_the_control_topic_steers(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "ctl-apart", 2, node_lease_ms=60_000, trigger_ms=200)
    bootstrap = broker.bootstrap
    kafka = ["--bootstrap", bootstrap, "--control-topic", settings.control_topic, "--status-topic", settings.status_topic]
    ckpt = tmp_path / "ckpt"
    job = QueryJob(spark, settings, ckpt)
    try:
        c1 = Cluster(bootstrap, settings.events_topic)
        c1.beat(1_000)
        wait_for(lambda: [d["safe_ts"] for d in compactions(bootstrap, settings.directives_topic)][-1:] == [1_000], 90,
                 "the first safe point", job)
        assert cli(["hold", "set", "c1", "backup", "--ts", "1500", "--ttl", "10m", *kafka]) == 0, "applied"
        # a node forges an operator's release and pause: a plain producer on the events topic
        now = time.time_ns() // 1_000_000
        send(bootstrap, settings.events_topic, [
            (0, "c1", {"v": 1, "type": "service_release", "cluster": "c1", "holder": "backup", "wall_ms": now,
                       "action_id": "forged-release"}),
            (0, "c1", {"v": 1, "type": "pause", "cluster": "c1", "reason": "forged", "wall_ms": now + 1})])
        c1.beat(5_000)
        wait_for(lambda: compactions(bootstrap, settings.directives_topic)[-1]["safe_ts"] == 1_500, 60,
                 "the safe point at the operator's hold", job)
        c1.beat(6_000)
        wait_for(lambda: len([a for a in read_topic(bootstrap, settings.alerts_topic, 2)
                              if a["kind"] == "event_misrouted" and a["state"] == "raised"]) == 2, 60,
                 "both forgeries alerted", job)
        alerts = [a for a in read_topic(bootstrap, settings.alerts_topic, 2) if a["kind"] == "event_misrouted"]
        assert all(a["severity"] == "critical" and settings.events_topic in a["detail"] and "'c1'" in a["detail"]
                   for a in alerts), alerts
        assert "service_release" in alerts[0]["detail"] and "pause" in alerts[1]["detail"]
        letters = read_topic(bootstrap, settings.deadletter_topic, 2)
        assert [(d["topic"], d["error"].split(":")[0]) for d in letters] == [(settings.events_topic, "misrouted")] * 2
        last = compactions(bootstrap, settings.directives_topic)[-1]
        assert last["safe_ts"] == 1_500 and "paused" not in last and "backup" in last["service_holds"], last
        status = [s for s in read_topic(bootstrap, settings.status_topic, 2) if s.get("key") == "c1"][-1]
        assert not status["paused"] and status["control_ignored"] == {"misrouted": 2}, status
        assert any(a["id"] == "forged-release" and a["outcome"] == "refused" for a in status["actions"])
        # the operator's release, on the control topic: the safe point moves on, and the alert clears
        assert cli(["hold", "release", "c1", "backup", *kafka]) == 0
        c1.beat(7_000)
        wait_for(lambda: compactions(bootstrap, settings.directives_topic)[-1]["safe_ts"] == 7_000, 60,
                 "the safe point past the released hold", job)
        wait_for(lambda: any(a["kind"] == "event_misrouted" and a["state"] == "cleared"
                             for a in read_topic(bootstrap, settings.alerts_topic, 2)), 30, "the alert cleared", job)
        ends = log_ends(bootstrap, settings)
        wait_for(lambda: caught_up(ckpt, ends), 60, "the job to finish both topics", job)
    finally:
        assert job.stop() == 0, job.tail()
    checked = verify(bootstrap, settings, ckpt)
    assert checked.directives["c1"][-1]["safe_ts"] == 7_000


def test_an_old_publisher_steers_only_with_control_on_events_topic(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "ctl-old", 2, node_lease_ms=60_000, trigger_ms=200,
                             control_on_events_topic=True)
    bootstrap = broker.bootstrap
    ckpt = tmp_path / "ckpt"
    job = QueryJob(spark, settings, ckpt)
    try:
        c1 = Cluster(bootstrap, settings.events_topic)
        c1.beat(1_000)
        wait_for(lambda: bool(compactions(bootstrap, settings.directives_topic)), 90, "the first safe point", job)
        send(bootstrap, settings.events_topic, [(0, "c1", {"v": 1, "type": "service_hold", "cluster": "c1",
                                                           "holder": "old-backup", "ts": 1_200, "ttl_ms": 600_000,
                                                           "wall_ms": time.time_ns() // 1_000_000, "action_id": "old-1"})])
        c1.beat(4_000)
        wait_for(lambda: compactions(bootstrap, settings.directives_topic)[-1]["safe_ts"] == 1_200, 60,
                 "the old publisher's hold applied", job)
        assert not [a for a in read_topic(bootstrap, settings.alerts_topic, 2) if a["kind"] == "event_misrouted"]
        ends = log_ends(bootstrap, settings)
        wait_for(lambda: caught_up(ckpt, ends), 60, "the job to finish both topics", job)
    finally:
        assert job.stop() == 0, job.tail()
    verify(bootstrap, settings, ckpt)
