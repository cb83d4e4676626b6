"""Lazy registration through the broker and the Spark job: two clusters run the same script of
readers and heartbeats, one with every hold published, one with ``Reporter(..., retention=R)``.
The job gives both the same safe points from far fewer events, its directives announce its
``retention``, and a reporter whose ``R`` is larger than the job's turns eager when its listener
reads one.

One node per cluster: a node's events keep their order in its partition, while the interleaving
of two nodes' producers within a shared partition is whatever the broker received first, so with
several nodes two runs of the same script (eager or not) may legitimately step the safe point
differently. The property test (tests/unit/test_lazy_registration.py) covers several nodes."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.settings import Settings, load_settings

from kafka_util import produce, read_topic, unique
from tests_support import run_to_end

pytestmark = pytest.mark.integration

R = 5_000
T0 = 1_700_000_000_000


def settings_for(bootstrap: str) -> Settings:
    tag = unique("lazy")
    settings = load_settings(flags={
        "bootstrap": bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "retention": R,
        "node_lease_ms": 600_000, "directive_interval_ms": 0, "stall_ms": 0}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
    return settings


class Clock:
    def __init__(self) -> None:
        self.wall = T0


def script(settings: Settings, cluster: str, retention: int | None) -> int:
    """One node, 40 seconds of event time: 50 short readers a second, a long reader now and then
    (open 4-8 s), a heartbeat a second. Returns how many events the node sent."""
    clock = Clock()
    reps = [Reporter.from_settings(settings, "n0", cluster=cluster, incarnation=0, heartbeat_interval_s=None,
                                   mvcc_clock=lambda: clock.wall, wall_clock=lambda: clock.wall, retention=retention)]
    produce(settings.bootstrap, settings.events_topic, [(cluster, {
        "v": 1, "type": "topology", "cluster": cluster, "wall_ms": T0, "version": 1, "nodes": {"n0": []}})])
    long_readers: list[Any] = []
    try:
        for second in range(40):
            for rep in reps:
                for _ in range(50):
                    clock.wall += 20
                    with rep.reader():
                        pass
                if second % 4 == 1:
                    long_readers.append(rep.reader().open())
                if second % 4 == 3 and len(long_readers) > 1:
                    long_readers.pop(0).close()
                rep.heartbeat()
        return sum(rep.stats().sent for rep in reps)
    finally:
        for rep in reps:
            rep.close(10)


def test_lazy_registration_gives_the_same_safe_points_from_fewer_events(broker: Any, spark: Any, tmp_path: Any) -> None:
    settings = settings_for(broker.bootstrap)
    eager_sent = script(settings, "eager", None)
    lazy_sent = script(settings, "lazy", R)
    assert lazy_sent < eager_sent / 10, (lazy_sent, eager_sent)
    run_to_end(spark, settings, str(tmp_path / "ckpt"))
    directives = read_topic(broker.bootstrap, settings.directives_topic)
    safe = {c: [d["safe_ts"] for d in directives if d["cluster"] == c and d.get("type") == "compaction"]
            for c in ("eager", "lazy")}
    assert len(safe["eager"]) > 20 and safe["lazy"] == safe["eager"]
    assert all(d["retention"] == R for d in directives if d.get("type") == "compaction")
    alerts = [a for a in read_topic(broker.bootstrap, settings.alerts_topic) if a["kind"] == "horizon_violation"]
    assert alerts == [], "no hold was passed, either way"


def test_a_reporter_with_a_larger_retention_turns_eager_when_its_listener_reads_a_directive(broker: Any, spark: Any,
                                                                                            tmp_path: Any) -> None:
    settings = settings_for(broker.bootstrap)
    script(settings, "c1", R)
    run_to_end(spark, settings, str(tmp_path / "ckpt"))
    clock = Clock()
    clock.wall = T0 + 3_600_000
    rep = Reporter.from_settings(settings, "n9", cluster="c1", incarnation=1, heartbeat_interval_s=None,
                                 mvcc_clock=lambda: clock.wall, wall_clock=lambda: clock.wall, retention=2 * R)
    try:
        rep.heartbeat()
        waiting = rep.reader().open()
        assert rep.stats().sent == 1, "lazy: the reader waits"
        with DirectiveListener.from_settings(settings, reporter=rep) as listener:
            deadline = time.monotonic() + 30
            while not listener.caught_up and time.monotonic() < deadline:
                listener.poll(0.5)
            assert listener.caught_up and listener.seq > 0
        assert rep.stats().sent == 2, "the job keeps less history than R: what waited is published at once"
        rep.flush(10)
    finally:
        rep.close(10)
    sent = [json.loads(v) for _p, _o, _k, v in _raw(broker.bootstrap, settings.events_topic) if v is not None]
    assert any(e.get("node") == "n9" and e.get("reader_id") == waiting.reader_id for e in sent)


def _raw(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    from tests_support import events_by_partition

    return events_by_partition(bootstrap, topic)
