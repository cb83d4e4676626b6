"""Events lost from the log before the job read them, through the job on the real broker: records
deleted while the job was down (``lost``), and the topic deleted and made again (``gone_back``) with
a service hold and a reader in what was lost."""

from __future__ import annotations

import shlex
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from safepoint.cli import main as cli
from safepoint.connectors.kafka.topics import ensure_topics, topic_ends, topic_specs
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter

from doc_blocks import block
from kafka_util import produce, read_topic
from tests_support import QueryJob, _ids, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)

PARTITIONS = 3


def names_apart(cluster: str, n: int) -> list[str]:
    """Node names whose partitions (librdkafka's CRC-32 of the key) differ from the cluster's key's."""
    home = zlib.crc32(cluster.encode()) % PARTITIONS
    return [k for k in (f"node-{i}" for i in range(100)) if zlib.crc32(k.encode()) % PARTITIONS != home][:n]


def mvcc() -> int:
    return int(time.time() * 1_000_000)


def delete_to_end(bootstrap: str, topic: str) -> dict[int, int]:
    """Delete every record of ``topic`` up to each partition's end (what retention or an operator does)."""
    ends = topic_ends({"bootstrap.servers": bootstrap}, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, p, end) for p, end in ends.items() if end]).values():
        fut.result(10)
    return ends


def compactions(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    return [d for d in read_topic(bootstrap, topic, 2) if d["type"] == "compaction"]


def test_a_reader_whose_open_was_deleted_is_never_passed_while_open(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "lost", PARTITIONS, node_lease_ms=3_000, trigger_ms=300)
    n1_name, n2_name = names_apart("c1", 2)
    produce(broker.bootstrap, settings.events_topic, [("c1", {"v": 1, "type": "topology", "cluster": "c1", "version": 1,
                                                              "wall_ms": int(time.time() * 1000),
                                                              "nodes": {n1_name: [], n2_name: []}})])
    reporters = [Reporter(broker.bootstrap, name, mvcc_clock=mvcc, cluster="c1", incarnation=1, heartbeat_interval_s=0.3,
                          topic=settings.events_topic) for name in (n1_name, n2_name)]
    listeners = [DirectiveListener(broker.bootstrap, topic=settings.directives_topic, reporter=r).start() for r in reporters]
    ckpt = tmp_path / "ckpt"
    try:
        job = QueryJob(spark, settings, ckpt)
        wait_for(lambda: bool(compactions(broker.bootstrap, settings.directives_topic)), 90, "a first directive", job)
        wait_for(lambda: len(_ids(ckpt, "commits")) >= 2, 60, "a committed batch after it", job)
        job.stop()
        reader = reporters[0].reader(label="long report").open()  # at the node's MVCC time now
        time.sleep(1.0)
        ends = delete_to_end(broker.bootstrap, settings.events_topic)
        before = len(compactions(broker.bootstrap, settings.directives_topic))
        job = QueryJob(spark, settings, ckpt)  # on its checkpoint: the records it had not read are gone
        wait_for(lambda: any(a["kind"] == "events_lost" and a["state"] == "raised"
                             for a in read_topic(broker.bootstrap, settings.alerts_topic, 2)), 60, "events_lost", job)
        lost = [a for a in read_topic(broker.bootstrap, settings.alerts_topic, 2) if a["kind"] == "events_lost"]
        assert any(n1_name in a["detail"] and a["severity"] == "critical" for a in lost)
        status = [s for s in read_topic(broker.bootstrap, settings.status_topic, 2) if s.get("type") == "cluster_status"]
        assert any(g["kind"] == "lost" and g["topic"] == settings.events_topic and g["end"] == ends[g["partition"]]
                   for s in status for g in s.get("gaps", [])), "the status names the gap"
        # the nodes restate (their listeners answer the snapshot requests); the reader holds while open
        wait_for(lambda: any(a["kind"] == "events_lost" and a["state"] == "cleared"
                             for a in read_topic(broker.bootstrap, settings.alerts_topic, 2)), 60,
                 "events_lost cleared once every node restated", job)
        time.sleep(2.0)
        after = compactions(broker.bootstrap, settings.directives_topic)[before:]
        assert after and max(d["safe_ts"] for d in after) <= reader.read_ts, "the reader was passed while open"
        reader.close()
        wait_for(lambda: compactions(broker.bootstrap, settings.directives_topic)[-1]["safe_ts"] > reader.read_ts, 60,
                 "the safe point passing the closed reader", job)
    finally:
        for listener in listeners:
            listener.close()
        for r in reporters:
            r.close()
        job.stop()


def test_a_topic_made_again_is_read_from_its_new_start_and_a_lost_service_hold_holds_until_acknowledged(
        broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "goneback", 2, node_lease_ms=60_000)
    events, controls, bootstrap = settings.events_topic, settings.control_topic, broker.bootstrap
    seq = {"n1": 0, "n2": 0}

    def node(name: str, kind: str, wall: int, **fields: Any) -> tuple[str, dict[str, Any]]:
        seq[name] += 1
        return name, {"v": 1, "type": kind, "cluster": "c1", "node": name, "incarnation": 1, "seq": seq[name],
                      "wall_ms": wall, **fields}

    def control(kind: str, wall: int, **fields: Any) -> tuple[str, dict[str, Any]]:
        return "c1", {"v": 1, "type": kind, "cluster": "c1", "wall_ms": wall, **fields}

    def beats(wall: int, now: int) -> list[tuple[str, dict[str, Any]]]:
        return [node("n1", "heartbeat", wall, mvcc_now=now), node("n2", "heartbeat", wall + 1, mvcc_now=now)]

    ckpt = tmp_path / "ckpt"
    produce(bootstrap, events, [control("topology", 1_000, version=1, nodes={"n1": [], "n2": []}), *beats(1_000, 1_000)])
    produce(bootstrap, controls, [control("resume", 1_001)])  # (not paused: ignored) the job reads the control topic too
    job = QueryJob(spark, settings, ckpt)
    try:
        wait_for(lambda: bool(compactions(bootstrap, settings.directives_topic)), 90, "a first directive", job)
        wait_for(lambda: bool(_ids(ckpt, "commits")), 60, "the batch committed", job)
    finally:
        job.stop()
    # while the job is down: a backup's hold and a reader, then both topics are deleted and made again
    produce(bootstrap, controls, [control("service_hold", 2_000, holder="backup", ts=1_500, ttl_ms=600_000)])
    produce(bootstrap, events, [node("n1", "reader_open", 2_001, reader_id="r", read_ts=1_600), *beats(2_002, 2_000)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics([events, controls], operation_timeout=10).values():
        fut.result(10)
    wait_for(lambda: not {events, controls} & set(admin.list_topics(timeout=10).topics), 20, "the topics deleted")
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
    assert sum(topic_ends(settings.librdkafka(), events).values()) == 0
    # (a broker with topic ids tells a topic made again by its id; this one has none, and each partition
    # now ends below where the job stands)
    planned = len(_ids(ckpt, "offsets"))
    job = QueryJob(spark, settings, ckpt)  # it no longer refuses the checkpoint: the source takes the gap
    try:
        # the nodes speak once the job has planned on the empty topic (were the new topic filled up to the
        # offsets the job stood at first, only a topic id, which this broker does not give, would tell)
        wait_for(lambda: len(_ids(ckpt, "offsets")) > planned, 60, "a batch planned on the new topic", job)
        produce(bootstrap, events, beats(3_000, 3_000))
        def alerts(kind: str) -> list[dict[str, Any]]:
            return [a for a in read_topic(bootstrap, settings.alerts_topic, 2) if a["kind"] == kind]

        wait_for(lambda: len([a for a in alerts("events_lost") if a["state"] == "raised"]) >= 2, 60, "events_lost", job)
        raised = [a for a in alerts("events_lost") if a["state"] == "raised"]
        assert any("made again" in a["detail"] for a in raised) and any("own events" in a["detail"] for a in raised)
        assert any(controls in a["detail"] and "control events" in a["detail"] for a in raised), raised
        requests = [d for d in read_topic(bootstrap, settings.directives_topic, 2) if d["type"] == "snapshot_request"]
        assert {d["node"] for d in requests} == {"n1", "n2"} and {d["reason"] for d in requests} == {"events_lost"}
        # both restate (n1's reader was lost with the topic), and move on: the gap may hide a service hold
        produce(bootstrap, events, [node("n1", "snapshot", 4_000, cut=4_000, readers=[{"reader_id": "r", "read_ts": 1_600}],
                                         txs=[]),
                                    node("n2", "snapshot", 4_001, cut=4_000, readers=[], txs=[]), *beats(5_000, 5_000)])
        time.sleep(3.0)
        first = compactions(bootstrap, settings.directives_topic)
        assert first[-1]["safe_ts"] < 1_500, "nothing advances while a lost service hold may matter"
        # the backup renews its hold; an operator acknowledges the gap: the safe point moves to it, not past
        produce(bootstrap, controls, [control("service_hold", 5_500, holder="backup", ts=1_500, ttl_ms=600_000)])
        guide = shlex.split(block("docs/operations.md", "safepoint ack-gap c1").text.splitlines()[0], comments=True)
        assert guide == ["safepoint", "ack-gap", "c1"]
        rc = cli([*guide[1:], "--bootstrap", bootstrap, "--control-topic", controls, "--status-topic", settings.status_topic])
        assert rc == 0, "applied: the guide's command waits for the job's outcome"
        produce(bootstrap, events, beats(6_000, 6_000))
        wait_for(lambda: compactions(bootstrap, settings.directives_topic)[-1]["safe_ts"] == 1_500, 60,
                 "the safe point at the renewed hold", job)
        wait_for(lambda: any(a["state"] == "cleared" for a in alerts("events_lost")), 30, "events_lost cleared", job)
        produce(bootstrap, controls, [control("service_release", 6_500, holder="backup")])
        produce(bootstrap, events, beats(7_000, 7_000))
        wait_for(lambda: compactions(bootstrap, settings.directives_topic)[-1]["safe_ts"] == 1_600, 60,
                 "the safe point at the restated reader", job)
    finally:
        job.stop()
