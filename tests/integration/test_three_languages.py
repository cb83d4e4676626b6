"""One cluster of three languages on Apache Kafka: a Go node, a Java node and a Python node (each
client's driver, ``safepoint.devtools.driver_node.DriverNode``) and the Spark job.

Each node keeps a reader open; the job's safe point never passes an open one. The Go and the Java
node each set a service hold: one below the safe point, which the job refuses, and one above it,
which holds the safe point for longer than its TTL (it is renewed) until released. The Go and the
Java node report critical pinned bytes: the job expires their readers and the expiry reaches each
handle's callback, and the expired readers end at their next check. The holds end one by one and the
safe point follows, to each next one.
Then the job loses its checkpoint: the job that starts on empty state asks every node for a
snapshot, each answers by itself, and the new job never passes the reader still open. Every node's
events land on the partition librdkafka's rule gives its id, whichever client published them.
"""

from __future__ import annotations

import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.devtools.driver_node import DriverNode
from safepoint.settings import Settings, load_settings
from safepoint.streaming.job import build_query

from kafka_util import produce, read_topic, unique
from tests_support import events_by_partition, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)

PARTITIONS = 3
MVCC_NOW = 100_000
READERS = {"go": 50_000, "java": 50_100, "python": 50_200}
"""Each node's reader and its timestamp: the Go one pins the most, the Python one the least."""
HOLDS = {"go": 50_120, "java": 50_150}
"""The service hold each sets once the safe point is at the Go reader: above it, below the Python one."""
HOLD_TTL_MS = 3_000
NATIVE = ("go", "java")
"""The clients in another language than the job's: their holds and expiries are what is tested here."""


def settings_for(bootstrap: str) -> Settings:
    tag = unique("langs")
    settings = load_settings(flags={
        "bootstrap": bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control",
        "directives_topic": f"{tag}.directives", "alerts_topic": f"{tag}.alerts",
        "deadletter_topic": f"{tag}.deadletter", "status_topic": f"{tag}.status", "node_lease_ms": 4_000, "stall_ms": 0, "trigger_ms": 200,
        "pinned_warning_enter_bytes": 100, "pinned_warning_exit_bytes": 80,
        "pinned_critical_enter_bytes": 400, "pinned_critical_exit_bytes": 320,
        "band_enter_window_ms": 500, "band_exit_window_ms": 500,
        "expire_after_ms": 500, "max_reader_lifetime_ms": 1_000, "expire_grace_ms": 600_000,
        "reader_age_warning_ms": 600_000, "reader_age_critical_ms": 600_000}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), PARTITIONS, log_append_time=False))
    return settings


def compactions(bootstrap: str, settings: Settings) -> list[dict[str, Any]]:
    return [d for d in read_topic(bootstrap, settings.directives_topic, 5) if d["type"] == "compaction"]


def safe_ts(bootstrap: str, settings: Settings) -> int | None:
    seen = compactions(bootstrap, settings)
    return max((d["safe_ts"] for d in seen), default=None)


def test_go_java_and_python_nodes_in_one_cluster(broker: Any, spark: Any, tmp_path: Path) -> None:
    settings = settings_for(broker.bootstrap)
    bootstrap = broker.bootstrap
    produce(bootstrap, settings.events_topic, [("c1", {
        "v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": int(time.time() * 1000),
        "nodes": {f"n-{lang}": [] for lang in READERS}})])
    nodes = {lang: DriverNode(lang, bootstrap, "c1", f"n-{lang}", settings.events_topic, settings.directives_topic,
                        settings.control_topic, settings.status_topic) for lang in READERS}
    query = None
    try:
        for lang, node in nodes.items():
            node.ok({"op": "clock", "mvcc_now": MVCC_NOW})
            node.ok({"op": "heartbeat", "pinned_bytes": 0})
            node.ok({"op": "reader", "ref": f"r-{lang}", "ts": READERS[lang], "label": f"{lang} report"})
        query = build_query(spark, settings, str(tmp_path / "a"))
        wait_for(lambda: safe_ts(bootstrap, settings) == READERS["go"], 180, "the job to stop at the Go node's reader",
                 every_s=0.5)

        # A service hold below the safe point is refused (that history may be gone); one above it holds.
        for lang in HOLDS:
            reply = nodes[lang].do({"op": "hold", "ref": f"{lang}-stale", "ts": 40_000, "ttl_ms": HOLD_TTL_MS})
            assert reply.get("error") == "refused" and "below" in reply["detail"], f"{lang}: {reply}"
            nodes[lang].ok({"op": "hold", "ref": f"{lang}-backup", "ts": HOLDS[lang], "ttl_ms": HOLD_TTL_MS,
                            "label": f"{lang} backup"})

        # Critical pressure on the Go and the Java node: the job expires their readers (graceful: the
        # reader stays open, and holds, until the node closes it at its next operation boundary).
        for lang in NATIVE:
            nodes[lang].ok({"op": "heartbeat", "pinned_bytes": 10_000})
        for lang in NATIVE:
            reply = nodes[lang].do({"op": "wait", "expired": f"r-{lang}", "timeout_ms": 60_000})
            assert reply == {"op": "wait", "expired": f"r-{lang}"}, f"{lang}: {reply}\n{nodes[lang].stderr()}"
            assert [(e["ref"], e["mode"]) for e in nodes[lang].expired] == [(f"r-{lang}", "graceful")]
        time.sleep(2)  # several batches: expired but open, the readers still hold
        assert safe_ts(bootstrap, settings) == READERS["go"], "the job passed an expired reader still open"
        for lang in NATIVE:
            assert nodes[lang].do({"op": "check", "ref": f"r-{lang}"}) == {"op": "check", "ref": f"r-{lang}",
                                                                             "error": "expired"}
        assert nodes["python"].expired == [], "no pressure on the Python node: nothing of it expired"
        expires = [d for d in read_topic(bootstrap, settings.directives_topic) if d["type"] == "expire"]
        assert sorted((d["node"], d["reader_id"]) for d in expires) == [(f"n-{lang}", f"r-{lang}") for lang in NATIVE]

        # The checks ended the expired readers (a graceful expiry ends a reader at its next operation
        # boundary): the safe point moves to the first service hold and no further. Each hold keeps it
        # for longer than its TTL (renewed), until released; then it moves to the next one.
        for lang in NATIVE:
            nodes[lang].ok({"op": "heartbeat", "pinned_bytes": 0})
        held = sorted((ts, lang) for lang, ts in HOLDS.items())
        for i, (ts, lang) in enumerate(held):
            after = "the expired readers ended" if i == 0 else f"{held[i - 1][1]} released its hold"
            wait_for(lambda n=ts: safe_ts(bootstrap, settings) == n, 60, f"the safe point to move to {ts} after {after}",
                     every_s=0.5)
            time.sleep(HOLD_TTL_MS / 1000 + 2)
            assert safe_ts(bootstrap, settings) == ts, f"{lang}'s renewed hold kept past its TTL"
            nodes[lang].ok({"op": "release", "ref": f"{lang}-backup"})
        wait_for(lambda: safe_ts(bootstrap, settings) == READERS["python"], 60,
                 f"the safe point to move to the Python reader after {held[-1][1]} released its hold", every_s=0.5)
        time.sleep(2)  # several batches with the Python reader open
        assert all(d["safe_ts"] <= READERS["python"] for d in compactions(bootstrap, settings))
        query.stop()
        last_seq = max(d["seq"] for d in compactions(bootstrap, settings))
        shutil.rmtree(tmp_path / "a")  # the checkpoint is lost

        query = build_query(spark, settings.with_overrides(starting_offsets="latest"), str(tmp_path / "b"))
        for lang, node in nodes.items():
            reply = node.do({"op": "wait", "snapshot_requests": 1, "timeout_ms": 120_000})
            assert reply.get("snapshot_requests", 0) >= 1, f"{lang}: {reply}\n{node.stderr()}"
        snapshots = {e["node"]: e for e in read_topic(bootstrap, settings.events_topic) if e["type"] == "snapshot"}
        assert sorted(snapshots) == [f"n-{lang}" for lang in sorted(READERS)], "every node answered the new job"
        assert [r["reader_id"] for r in snapshots["n-python"]["readers"]] == ["r-python"]
        assert all(snapshots[f"n-{lang}"]["readers"] == [] for lang in NATIVE)
        time.sleep(3)  # several batches after the snapshots: the Python reader must still hold
        assert all(d["safe_ts"] <= READERS["python"] for d in compactions(bootstrap, settings)), \
            "the new job passed a reader it learnt of only from a snapshot"

        nodes["python"].ok({"op": "close", "ref": "r-python"})
        wait_for(lambda: (safe_ts(bootstrap, settings) or 0) > READERS["python"], 60,
                 "the new job's safe point past the closed reader", every_s=0.5)
        b_first = min((d for d in compactions(bootstrap, settings) if d["seq"] > last_seq), key=lambda d: d["seq"])
        assert b_first["seq"] == last_seq + 1, "seq continues from the directives topic"
    finally:
        if query is not None:
            query.stop()
        codes = {lang: node.finish() for lang, node in nodes.items()}
    assert codes == {lang: 0 for lang in READERS}, codes

    placed: dict[str, set[int]] = {}
    for partition, _offset, key, _value in events_by_partition(bootstrap, settings.events_topic):
        if key is not None and key.decode().startswith("n-"):
            placed.setdefault(key.decode(), set()).add(partition)
    assert placed == {f"n-{lang}": {zlib.crc32(f"n-{lang}".encode()) % PARTITIONS} for lang in READERS}, \
        "each node's events on the partition of the CRC-32 of its id, whichever client published them"
