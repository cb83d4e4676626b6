"""What only Apache Kafka does, through the job on a real broker (KRaft, from the jars setup installs):
a topic made again told apart by its id, unread events removed by retention, record times stamped by
the broker, and a directives topic compacted by the broker's cleaner. Each test fails against a job
that ignores what it checks (the closing note of the change that added them says how each was tried)."""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from safepoint.connectors.kafka.topics import LOG_APPEND_TIME, TIMESTAMP_TYPE, ensure_topics, topic_ends, topic_specs
from safepoint.connectors.listener import DirectiveListener
from safepoint.settings import load_settings
from safepoint.streaming.driver import prepare_topics

from kafka_util import produce, read_topic, topic_flags, unique
from tests_support import QueryJob, _ids, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

PARTITIONS = 2


class Cluster:
    """Events of one cluster's nodes n1 and n2, written by hand (each node's seq kept here)."""

    def __init__(self, bootstrap: str, settings: Any, cluster: str = "c1") -> None:
        self.bootstrap, self.settings, self.cluster = bootstrap, settings, cluster
        self.seq: dict[str, int] = {}

    def node(self, name: str, kind: str, wall: int, **fields: Any) -> tuple[str, dict[str, Any]]:
        self.seq[name] = self.seq.get(name, 0) + 1
        return name, {"v": 1, "type": kind, "cluster": self.cluster, "node": name, "incarnation": 1,
                      "seq": self.seq[name], "wall_ms": wall, **fields}

    def beats(self, wall: int, now: int) -> list[tuple[str, dict[str, Any]]]:
        return [self.node("n1", "heartbeat", wall, mvcc_now=now), self.node("n2", "heartbeat", wall + 1, mvcc_now=now)]

    def topology(self, wall: int) -> tuple[str, dict[str, Any]]:
        return self.cluster, {"v": 1, "type": "topology", "cluster": self.cluster, "version": 1, "wall_ms": wall,
                              "nodes": {"n1": [], "n2": []}}

    def send(self, *messages: tuple[str, dict[str, Any]]) -> None:
        produce(self.bootstrap, self.settings.events_topic, list(messages))

    def restate(self, wall: int, readers: list[dict[str, Any]]) -> None:
        """Both nodes restate (n1 with ``readers``), as their listeners would on a snapshot request."""
        self.send(self.node("n1", "snapshot", wall, cut=wall, readers=readers, txs=[]),
                  self.node("n2", "snapshot", wall + 1, cut=wall, readers=[], txs=[]))


def compactions(bootstrap: str, topic: str, cluster: str | None = None) -> list[dict[str, Any]]:
    return [d for d in read_topic(bootstrap, topic, 2)
            if d["type"] == "compaction" and (cluster is None or d["cluster"] == cluster)]


def alerts(bootstrap: str, settings: Any, kind: str, state: str | None = None) -> list[dict[str, Any]]:
    return [a for a in read_topic(bootstrap, settings.alerts_topic, 2)
            if a.get("kind") == kind and (state is None or a["state"] == state)]


def started_and_stopped(spark: Any, settings: Any, ckpt: Path, c: Cluster) -> None:
    """The job runs until its first directive is out and a batch after it committed, then stops."""
    c.send(c.topology(1_000), *c.beats(1_000, 1_000))
    job = QueryJob(spark, settings, ckpt)
    try:
        wait_for(lambda: bool(compactions(c.bootstrap, settings.directives_topic)), 90, "a first directive", job)
        wait_for(lambda: len(_ids(ckpt, "commits")) >= 1, 60, "the batch committed", job)
    finally:
        job.stop()


def the_reader_holds_until_closed(spark: Any, settings: Any, ckpt: Path, c: Cluster, gap_kind: str) -> None:
    """Restarted on its checkpoint, the job finds the gap (``events_lost``, the status's gap of ``gap_kind``),
    asks both nodes to restate; n1 restates its reader at 1,600, which then holds the safe point until it
    closes."""
    bootstrap = c.bootstrap
    job = QueryJob(spark, settings, ckpt)
    try:
        wait_for(lambda: bool(alerts(bootstrap, settings, "events_lost", "raised")), 60, "events_lost", job)
        status = [s for s in read_topic(bootstrap, settings.status_topic, 2) if s.get("type") == "cluster_status"]
        kinds = {g["kind"] for s in status for g in s.get("gaps", []) if g["topic"] == settings.events_topic}
        assert gap_kind in kinds, f"the status names a {gap_kind} gap of the events topic: {kinds}"
        wait_for(lambda: {d.get("node") for d in read_topic(bootstrap, settings.directives_topic, 2)
                          if d["type"] == "snapshot_request"} >= {"n1", "n2"}, 30, "snapshot requests to both nodes", job)
        before = len(compactions(bootstrap, settings.directives_topic))
        c.restate(4_000, [{"reader_id": "r", "read_ts": 1_600}])
        c.send(*c.beats(5_000, 5_000))
        wait_for(lambda: bool(alerts(bootstrap, settings, "events_lost", "cleared")), 60, "events_lost cleared", job)
        c.send(*c.beats(5_500, 5_500))
        time.sleep(2.0)
        after = compactions(bootstrap, settings.directives_topic)[before:]
        passed = [d["safe_ts"] for d in after if d["safe_ts"] > 1_600]
        assert not passed, f"the lost reader at 1,600 was passed while open: {passed}"
        c.send(c.node("n1", "reader_close", 6_000, reader_id="r"), *c.beats(6_001, 6_000))
        wait_for(lambda: compactions(bootstrap, settings.directives_topic)[-1]["safe_ts"] > 1_600, 60,
                 "the safe point passing the closed reader", job)
    finally:
        job.stop()


def made_again_and_filled_past(bootstrap: str, spark: Any, tmp_path: Path, tag: str) -> None:
    """The events topic deleted while the job is down, made again and filled past where the job stood; the
    job, restarted, must find the gap and hold the reader lost with the old topic until it closes."""
    settings = make_settings(bootstrap, tag, PARTITIONS, node_lease_ms=60_000)
    c, ckpt, events = Cluster(bootstrap, settings), tmp_path / "ckpt", settings.events_topic
    started_and_stopped(spark, settings, ckpt, c)
    old = topic_ends(settings.librdkafka(), events)
    # while the job is down: n1 opens a reader, then the topic is deleted, made again by its producers and
    # filled past where the job stood in every partition (its offsets alone then look as before)
    c.send(c.node("n1", "reader_open", 2_001, reader_id="r", read_ts=1_600), *c.beats(2_002, 2_000))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics([events], operation_timeout=10).values():
        fut.result(10)
    wait_for(lambda: events not in admin.list_topics(timeout=10).topics, 20, "the topic deleted")
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), PARTITIONS, log_append_time=False))
    wall = 3_000
    while any(end < old.get(p, 0) for p, end in topic_ends(settings.librdkafka(), events).items()):
        assert wall < 10_000, "the new topic did not fill past the old offsets"
        c.send(c.topology(wall), *c.beats(wall, wall))  # (the topology again: its version is old, ignored)
        wall += 10
    the_reader_holds_until_closed(spark, settings, ckpt, c, "gone_back")
    made_again = [a for a in alerts(bootstrap, settings, "events_lost", "raised") if "made again" in a["detail"]]
    assert made_again, "the alert says the topic was made again"


def test_an_events_topic_made_again_and_filled_past_the_old_offsets_is_told_by_its_id(
        broker: Any, spark: Any, tmp_path: Path) -> None:
    made_again_and_filled_past(broker.bootstrap, spark, tmp_path, "topicid")


def test_unread_events_removed_by_retention_while_the_job_is_down_are_found_lost(
        broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "retention", PARTITIONS, node_lease_ms=60_000)
    c, ckpt, events = Cluster(broker.bootstrap, settings), tmp_path / "ckpt", settings.events_topic
    started_and_stopped(spark, settings, ckpt, c)
    home = zlib.crc32(b"n1") % PARTITIONS  # librdkafka's partitioner: the CRC-32 of the key
    reader_at = topic_ends(settings.librdkafka(), events)[home]
    c.send(c.node("n1", "reader_open", 2_001, reader_id="r", read_ts=1_600), *c.beats(2_002, 2_000))
    # retention of a tenth of a second in segments of as much, then a record that rolls each partition's
    # segment: the broker's retention check (every second here) removes what the job had not read
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    short = [ConfigEntry("retention.ms", "100", incremental_operation=AlterConfigOpType.SET),
             ConfigEntry("segment.ms", "100", incremental_operation=AlterConfigOpType.SET)]
    for fut in admin.incremental_alter_configs([ConfigResource("topic", events, incremental_configs=short)]).values():
        fut.result(10)
    time.sleep(0.5)

    def first_offset() -> int:
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique("lo")})
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(events, home), timeout=10, cached=False)[0])
        finally:
            consumer.close()

    wall = 2_500
    deadline = time.monotonic() + 60
    while first_offset() <= reader_at:
        assert time.monotonic() < deadline, "retention did not remove the reader's open in 60 s"
        c.send(*c.beats(wall, 2_500))
        wall += 10
        time.sleep(0.5)
    back = [ConfigEntry("retention.ms", "", incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("segment.ms", "", incremental_operation=AlterConfigOpType.DELETE)]
    for fut in admin.incremental_alter_configs([ConfigResource("topic", events, incremental_configs=back)]).values():
        fut.result(10)
    c.send(*c.beats(3_000, 3_000))
    the_reader_holds_until_closed(spark, settings, ckpt, c, "lost")


def test_the_job_makes_its_input_topics_with_the_brokers_record_times(broker: Any, spark: Any, tmp_path: Path) -> None:
    """The job creates the events and control topics with ``LogAppendTime`` (read back with the admin API);
    a node whose clock, and so its producer's record times, run a day ahead moves neither the cluster's
    time nor the other nodes' leases."""
    tag = unique("logtime")
    settings = load_settings(flags={"bootstrap": broker.bootstrap, **topic_flags(tag, "status"), "node_lease_ms": 2_000,
                                    "max_clock_skew_ms": 1_000, "clock_skew_window_ms": 500, "events_partitions": 2},
                             environ={})
    created = prepare_topics(settings)
    assert {settings.events_topic, settings.control_topic} <= set(created)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for topic in (settings.events_topic, settings.control_topic):
        described = admin.describe_configs([ConfigResource("topic", topic)])
        config = next(iter(described.values())).result(10)
        assert config[TIMESTAMP_TYPE].value == LOG_APPEND_TIME, (topic, config[TIMESTAMP_TYPE].value)

    day = 86_400_000
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "enable.idempotence": True})
    t0 = int(time.time() * 1000)
    seq = 0
    while time.time() * 1000 < t0 + 4_000:
        now = int(time.time() * 1000)
        seq += 1
        for node, ahead in (("n1", 0), ("n2", 0), ("n3", day)):
            event = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": 1, "seq": seq,
                     "wall_ms": now + ahead, "mvcc_now": now}
            producer.produce(settings.events_topic, key=node, value=json.dumps(event), timestamp=now + ahead)
        producer.poll(0)
        time.sleep(0.1)
    assert producer.flush(20) == 0
    stamped = read_topic(broker.bootstrap, settings.events_topic)
    assert stamped, "the heartbeats are on the topic"

    q = QueryJob(spark, settings, tmp_path / "ckpt")
    try:
        q.query.processAllAvailable()
    finally:
        q.stop()
    directives = compactions(broker.bootstrap, settings.directives_topic)
    raised = [a for a in read_topic(broker.bootstrap, settings.alerts_topic) if a.get("state") == "raised"]
    assert directives and all(d["cluster_wall_ms"] < t0 + 60_000 for d in directives), \
        "the cluster's time is the broker's, not n3's producer's"
    assert not [a for a in raised if a["kind"] == "missing_node"], "no node was called stale by n3's day ahead"
    assert {a["node"] for a in raised if a["kind"] == "clock_skew"} == {"n3"}, "n3's clock is told, against the broker's"


def test_a_listener_that_starts_after_the_cleaner_gets_the_newest_directive_of_every_cluster(
        broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "compacted", PARTITIONS, node_lease_ms=60_000)
    directives = settings.directives_topic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    quick = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
             for k, v in (("segment.ms", "100"), ("min.cleanable.dirty.ratio", "0.01"), ("min.compaction.lag.ms", "0"))]
    for fut in admin.incremental_alter_configs([ConfigResource("topic", directives, incremental_configs=quick)]).values():
        fut.result(10)
    clusters = [Cluster(broker.bootstrap, settings, f"c{i}") for i in range(1, 4)]
    for c in clusters:
        c.send(c.topology(1_000))
    job = QueryJob(spark, settings, tmp_path / "ckpt")
    try:
        for step in range(1, 11):  # ten safe points a cluster, each in a batch of its own, over several segments
            now = 1_000 + step * 100
            for c in clusters:
                c.send(*c.beats(now, now))
            wait_for(lambda now=now: all(compactions(broker.bootstrap, directives, c.cluster)[-1:]
                                         and compactions(broker.bootstrap, directives, c.cluster)[-1]["safe_ts"] == now
                                         for c in clusters), 90, f"every cluster's directive at {now}", job)
    finally:
        job.stop()
    # the newest directive of a cluster is never compacted away: each cluster's made ten or more
    newest = {c.cluster: max(compactions(broker.bootstrap, directives, c.cluster), key=lambda d: d["seq"]) for c in clusters}
    assert all(d["seq"] >= 10 and d["safe_ts"] == 2_000 for d in newest.values()), newest

    def kept() -> int:
        return len(read_topic(broker.bootstrap, directives, 5))

    end = topic_ends(settings.librdkafka(), directives)[0]
    wait_for(lambda: kept() < end // 2, 60, f"the cleaner compacting the directives topic ({end} records)")
    for name, expected in newest.items():
        with DirectiveListener(broker.bootstrap, name, topic=directives) as listener:
            got = None
            deadline = time.monotonic() + 30
            while (got is None or got.seq < expected["seq"]) and time.monotonic() < deadline:
                got = listener.poll(1.0) or got
            assert got is not None, f"{name}: no directive after compaction"
            assert (got.seq, got.safe_ts) == (expected["seq"], expected["safe_ts"]), name
