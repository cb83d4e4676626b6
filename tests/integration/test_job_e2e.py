"""Issue 2's acceptance: three nodes through the node client, the real broker and a real Spark
job; the exact directives back through the listener; a job restart from its checkpoint that
neither lowers safe_ts nor applies an event twice; and replay giving the same outputs."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.core import Engine, Position
from safepoint.core.codec import encode
from safepoint.settings import load_settings

from kafka_util import produce, read_topic, unique
from tests_support import replay_policies, run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


class Clock:
    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def read_events(bootstrap: str, topic: str) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every input message, for replay in the job's merge order."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("r"), "enable.auto.commit": False})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        out = []
        for p in parts:
            hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            c.assign([TopicPartition(topic, p, 0)])
            got = 0
            deadline = time.monotonic() + 10
            while got < hi and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                out.append((p, m.offset(), m.value()))
                got += 1
        return out
    finally:
        c.close()


def test_three_nodes_exact_directives_restart_and_replay(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("e2e")
    settings = load_settings(
        flags={
            "bootstrap": broker.bootstrap,
            "events_topic": f"{tag}.events", "control_topic": f"{tag}.control",
            "directives_topic": f"{tag}.directives",
            "alerts_topic": f"{tag}.alerts",
            "deadletter_topic": f"{tag}.deadletter",
            "retention": 100,
            "node_lease_ms": 10_000,
            "trigger_ms": 100,
        },
        environ={},
    )
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 3, log_append_time=False))
    wall, mvcc = Clock(1_000), Clock(1_000)
    reporters = {
        n: Reporter(broker.bootstrap, n, cluster="c1", incarnation=1, topic=settings.events_topic,
                    heartbeat_interval_s=None, mvcc_clock=mvcc, wall_clock=wall)
        for n in ("n1", "n2", "n3")
    }
    n1, n2, n3 = reporters["n1"], reporters["n2"], reporters["n3"]

    def tick(t: int) -> None:
        wall.t = t

    produce(broker.bootstrap, settings.events_topic,
            [("c1", {"v": 1, "type": "topology", "cluster": "c1", "wall_ms": 999, "version": 1,
                     "nodes": {"n1": [], "n2": [], "n3": []}})])
    # Phase 1: every wall_ms is distinct and increasing, so the log order is unambiguous.
    for i, r in enumerate((n1, n2, n3)):
        tick(1_000 + i)
        r.heartbeat()                                   # all at mvcc 1000 -> seq 1 safe 900
    tick(2_000)
    reader = n1.reader(950, label="report", reader_id="r1").open()
    tick(2_001)
    tx = n2.transaction(1_500, label="oltp", tx_id="t1").begin()
    mvcc.t = 3_000
    for i, r in enumerate((n1, n2, n3)):
        tick(3_000 + i)
        r.heartbeat()                                   # n3 beat (last to leave 900) -> seq 2 safe 950 (r1)
    tick(4_000)
    reader.close()                                      # -> seq 3 safe 1500 (t1)
    tick(4_001)
    tx.end("commit")                                    # -> seq 4 safe 2900 (retention)
    for r in reporters.values():
        assert r.flush(10) == 0

    ckpt = str(tmp_path / "ckpt")
    applied_1 = run_to_end(spark, settings, ckpt)
    assert applied_1 == 1 + 3 + 2 + 3 + 2

    directives = [d for d in read_topic(broker.bootstrap, settings.directives_topic) if d["type"] == "compaction"]
    got = [(d["seq"], d["safe_ts"], d["blocker"]["node"], d["blocker"]["kind"], d["blocker"]["id"]) for d in directives]
    assert got == [
        (1, 900, "n1", "retention", None),
        (2, 950, "n1", "reader", "r1"),
        (3, 1500, "n2", "tx", "t1"),
        (4, 2900, "n1", "retention", None),
    ]
    assert directives[1]["blocker"] == {"node": "n1", "kind": "reader", "id": "r1", "ts": 950, "age_ms": 1_002,
                                        "label": "report"}
    assert directives[3]["basis"] == {n: {"incarnation": 1, "seq": s, "local_min": 2900}
                                      for n, s in (("n1", 3), ("n2", 3), ("n3", 1))}
    assert directives[3]["members"] == 3 and set(directives[3]["positions"]) <= {"0", "1", "2", "3"}
    assert all(d["key"] == "c1" and d["cluster"] == "c1" for d in directives)  # the members record: c1/%members

    listener = DirectiveListener(broker.bootstrap, "c1", topic=settings.directives_topic, reporter=n3)
    try:
        first = listener.poll(15)
        assert first is not None and (first.seq, first.safe_ts) == (4, 2900)
        assert n3.safe_ts == 2900  # fed back to the reporter

        # Phase 2: the job restarts from its checkpoint.
        tick(5_000)
        r3 = n3.reader(4_000, reader_id="r3", label="late").open()
        mvcc.t = 5_000
        for i, r in enumerate((n1, n2, n3)):
            tick(5_001 + i)
            r.heartbeat()                               # n3's beat -> seq 5 safe 4000 (r3)
        tick(6_000)
        r3.close()                                      # -> seq 6 safe 4900
        for r in reporters.values():
            assert r.flush(10) == 0
        applied_2 = run_to_end(spark, settings, ckpt)
        assert applied_2 == 1 + 3 + 1, "the restarted job read only the new events"

        seen = []
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            d = listener.poll(1)
            if d is not None:
                seen.append((d.seq, d.safe_ts))
        assert seen == [(5, 4000), (6, 4900)]
        assert listener.safe_ts == 4900
    finally:
        listener.close()
        for r in reporters.values():
            r.close()

    everything = read_topic(broker.bootstrap, settings.directives_topic)
    assert [d["nodes"] for d in everything if d["type"] == "members"] == [["n1", "n2", "n3"]]
    directives = [d for d in everything if d["type"] == "compaction"]
    seqs = [d["seq"] for d in directives]
    assert seqs == sorted(set(seqs)) == list(range(1, 7)), "no repeated or lost seq across the restart"
    safe = [d["safe_ts"] for d in directives]
    assert safe == sorted(safe), "safe_ts never goes back"

    # Replay over the same log, in the job's order (one batch per phase, merged by wall_ms).
    events = read_events(broker.bootstrap, settings.events_topic)
    ordered = sorted(events, key=lambda e: json.loads(e[2])["wall_ms"])
    engine = Engine(replay_policies(settings, ckpt))
    replayed = [encode(o.value) for p, off, v in ordered for o in engine.process(v, Position("x", p, off))
                if o.channel == "directives"]
    job_out = [encode({k: v for k, v in d.items() if k != "key"}) for d in everything]
    assert replayed == job_out
    assert engine.clusters["c1"].safe_ts == 4900
