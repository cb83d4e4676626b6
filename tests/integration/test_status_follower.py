"""The status follower and the outcome watcher on a real broker, without the job: bad records on
the status topic are skipped and counted while the follower goes on; a broker that goes away
makes ``/healthz`` say the follower is stalled; a caught-up follower stays idle; the CLI and
``ServiceHold`` learn an action's outcome from the cluster's status (here written by hand, as the
job writes it: the job's side is tests/integration/test_control_e2e.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import psutil
import pytest
from fastapi.testclient import TestClient

from safepoint.cli import main
from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.connectors.service_hold import HoldLost, HoldRefused, ServiceHold
from safepoint.core import Engine, Position
from safepoint.core.codec import encode
from safepoint.core.status import cluster_status, node_status, status_key
from safepoint.devtools.broker import EmbeddedBroker
from safepoint.ops.http_api import make_app
from safepoint.ops.status_store import StatusStore
from safepoint.settings import load_settings

from kafka_util import produce, read_topic, unique

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)
T0 = 1_700_000_000_000


def topics(bootstrap: str) -> Any:
    tag = unique("follow")
    settings = load_settings(flags={"bootstrap": bootstrap, "events_topic": f"{tag}.events",
                                    "control_topic": f"{tag}.control", "directives_topic": f"{tag}.d",
                                    "alerts_topic": f"{tag}.a", "deadletter_topic": f"{tag}.dl",
                                    "status_topic": f"{tag}.status"}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 1, log_append_time=False))
    return settings


def engine_with(*events: dict[str, Any]) -> Engine:
    engine = Engine()
    for i, e in enumerate(events):
        engine.process(encode(e), Position("events", 0, i))
    return engine


def beat(node: str, seq: int, wall: int, mvcc: int) -> dict[str, Any]:
    return {"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": 1, "seq": seq, "wall_ms": wall,
            "mvcc_now": mvcc}


def status_records(engine: Engine) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [(status_key(c, n), node_status(ns, engine.policy)) for (c, n), ns in engine.nodes.items()]
    return out + [(status_key(c), cluster_status(cs, engine.policy)) for c, cs in engine.clusters.items()]


def wait_until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_bad_records_are_skipped_and_the_follower_goes_on(broker: Any) -> None:
    settings = topics(broker.bootstrap)
    engine = engine_with(beat("n1", 1, T0, 1_000))
    good = status_records(engine)
    cluster = dict(good[-1][1])
    produce(broker.bootstrap, settings.status_topic, [
        ("c1", "not json"),
        ("c1", {**cluster, "round": "aborted"}),          # the right type, a wrong-typed field
        ("c1", {"type": "cluster_status"}),
        ("c1/n1", "[1, 2]"),
        *good,
    ])
    store = StatusStore()
    store.follow(settings.librdkafka(), settings.status_topic)
    client = TestClient(make_app(store))
    try:
        wait_until(lambda: store.messages >= len(good), 30, "the good records")
        assert store.skipped == {"not_json": 1, "invalid": 2, "not_an_object": 1}
        assert client.get("/metrics").status_code == 200
        assert store.status("c1")["nodes"][0]["mvcc_now"] == 1_000
        engine.process(encode(beat("n1", 2, T0 + 1_000, 2_000)), Position("events", 0, 9))
        produce(broker.bootstrap, settings.status_topic, [("c1", {**cluster, "safe_ts": "x"}), *status_records(engine)])
        wait_until(lambda: (store.status("c1") or {}).get("nodes", [{}])[0].get("mvcc_now") == 2_000, 30,
                   "the records after more bad ones")
        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["status_messages_skipped"] == 5
    finally:
        store.close()


def test_a_follower_started_before_its_topic_exists_reads_it_once_made(broker: Any) -> None:
    """``safepoint run`` and ``serve`` start their status follower at once, often before the job has made
    the status topic: on Apache Kafka the follower kept the consumer its first look made and never
    looked again, so the dashboard, the status API and the metrics stayed empty for the process's life."""
    tag = unique("late")
    settings = load_settings(flags={"bootstrap": broker.bootstrap, "events_topic": f"{tag}.events",
                                    "control_topic": f"{tag}.control", "directives_topic": f"{tag}.d",
                                    "alerts_topic": f"{tag}.a", "deadletter_topic": f"{tag}.dl",
                                    "status_topic": f"{tag}.status"}, environ={})
    store = StatusStore()
    store.follow(settings.librdkafka(), settings.status_topic)
    client = TestClient(make_app(store))
    try:
        wait_until(lambda: "not found yet" in str(client.get("/healthz").json().get("status_topic")), 30,
                   "the follower to say the topic is not there")
        time.sleep(1.5)  # it has looked and found nothing at least once
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 1, log_append_time=False))
        produce(broker.bootstrap, settings.status_topic, status_records(engine_with(beat("n1", 1, T0, 1_000))))
        wait_until(lambda: store.status("c1") is not None, 30, "the records of the topic made after the follower")
        assert client.get("/api/v1/clusters").json()["clusters"][0]["cluster"] == "c1"
        assert "status_topic" not in client.get("/healthz").json(), client.get("/healthz").json()
    finally:
        store.close()


def test_a_follower_whose_broker_went_away_is_stalled(tmp_path: Any) -> None:
    with EmbeddedBroker(data_dir=str(tmp_path / "broker")) as own:
        settings = topics(own.bootstrap)
        produce(own.bootstrap, settings.status_topic, status_records(engine_with(beat("n1", 1, T0, 1_000))))
        store = StatusStore(stall_s=3.0)
        store.follow(settings.librdkafka(), settings.status_topic)
        client = TestClient(make_app(store))
        try:
            wait_until(lambda: store.status("c1") is not None, 30, "the first records")
            assert client.get("/healthz").json()["status"] == "ok"
            own.stop()
            wait_until(lambda: client.get("/healthz").status_code == 503, 60, "the follower to be called stalled")
            body = client.get("/healthz").json()
            assert body["status"] == "stalled" and "no read of the status topic" in body["stalled"]
        finally:
            store.close()


def test_a_caught_up_follower_stays_idle(broker: Any) -> None:
    """The embedded broker answers an empty fetch at once: a consumer that keeps fetching spins a
    core. Caught up, the follower asks for the end offsets a few times a second instead."""
    settings = topics(broker.bootstrap)
    produce(broker.bootstrap, settings.status_topic, status_records(engine_with(beat("n1", 1, T0, 1_000))))
    store = StatusStore()
    store.follow(settings.librdkafka(), settings.status_topic)
    try:
        wait_until(lambda: store.status("c1") is not None, 30, "the records")
        me = psutil.Process()
        time.sleep(1.0)
        before = me.cpu_times()
        time.sleep(5.0)
        after = me.cpu_times()
        used = (after.user + after.system - before.user - before.system) / 5.0
        assert used < 0.10, f"a caught-up follower used {used:.0%} of a core"
    finally:
        store.close()


def write_outcome(bootstrap: str, settings: Any, actions: list[dict[str, Any]]) -> None:
    """The cluster's status with these action outcomes, as the job writes it."""
    engine = engine_with(beat("n1", 1, T0, 1_000))
    record = cluster_status(engine.clusters["c1"], engine.policy)
    produce(bootstrap, settings.status_topic, [("c1", {**record, "actions": actions})])


def test_the_cli_waits_for_the_outcome_and_exits_by_it(broker: Any, capsys: Any) -> None:
    settings = topics(broker.bootstrap)
    kafka = ["--bootstrap", broker.bootstrap, "--control-topic", settings.control_topic, "--status-topic",
             settings.status_topic]
    assert main(["pause", "c1", "--reason", "restore", "--wait-timeout", "2", *kafka]) == 3  # no job: no outcome
    out = capsys.readouterr()
    assert "no outcome of action" in out.err
    assert main(["resume", "c1", "--no-wait", *kafka]) == 0

    import threading

    def answer(outcome: str, reason: str | None) -> None:
        """Plays the job: reads the action from the control topic and writes its outcome."""
        def run() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                events = [e for e in read_topic(broker.bootstrap, settings.control_topic, timeout_s=1)
                          if e.get("type") == "service_hold"]
                if events:
                    e = events[-1]
                    write_outcome(broker.bootstrap, settings, [{"id": e["action_id"], "type": e["type"],
                                                                 "holder": e["holder"], "outcome": outcome,
                                                                 "reason": reason, "detail": f"hold {outcome}",
                                                                 "cluster_wall_ms": T0}])
                    return
        t = threading.Thread(target=run, daemon=True)
        t.start()

    answer("refused", "below_safe_ts")
    rc = main(["hold", "set", "c1", "late", "--ts", "10", "--ttl", "1m", "--wait-timeout", "30", *kafka])
    out = capsys.readouterr().out
    assert rc == 1 and "service_hold refused (below_safe_ts): hold refused" in out, out


def test_service_hold_raises_when_refused_and_reports_a_lost_hold(broker: Any) -> None:
    settings = topics(broker.bootstrap)
    seen: list[dict[str, Any]] = []

    def job_answers(outcome: str, after_s: float) -> None:
        import threading

        def run() -> None:
            time.sleep(after_s)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                events = [e for e in read_topic(broker.bootstrap, settings.control_topic, timeout_s=1)
                          if e.get("type") == "service_hold" and e["action_id"] not in answered]
                if events:
                    e = events[-1]
                    answered.add(e["action_id"])
                    write_outcome(broker.bootstrap, settings, [{"id": e["action_id"], "type": "service_hold",
                                                                 "holder": e["holder"], "outcome": outcome,
                                                                 "reason": None, "detail": outcome, "cluster_wall_ms": T0}])
                    return
        threading.Thread(target=run, daemon=True).start()

    answered: set[str] = set()
    job_answers("refused", 0)
    with pytest.raises(HoldRefused) as refused:
        ServiceHold(broker.bootstrap, "c1", "backup", ts=10, ttl_ms=60_000, control_topic=settings.control_topic,
                    status_topic=settings.status_topic).__enter__()
    assert refused.value.outcome["outcome"] == "refused"

    job_answers("applied", 0)
    with ServiceHold(broker.bootstrap, "c1", "cdc", ts=900, ttl_ms=60_000, control_topic=settings.control_topic,
                     status_topic=settings.status_topic, on_lost=seen.append) as hold:
        assert hold.last_outcome is not None and hold.last_outcome["outcome"] == "applied"
        hold.check()
        job_answers("expired", 0.5)
        hold.advance(950)  # its outcome comes back expired (the job's answer here)
        wait_until(lambda: bool(seen), 30, "on_lost")
        with pytest.raises(HoldLost):
            hold.check()
    assert seen[0]["outcome"] == "expired" and json.dumps(seen[0])
