"""A lost checkpoint, end to end: the real broker, the Spark job, two reporters with listeners.

Job A runs while node n1 keeps reader r1 open; A is stopped and its checkpoint deleted; job B
starts on an empty checkpoint reading only new events (``starting_offsets = "latest"``). B seeds
each cluster from the compacted directives topic (safe_ts, seq), asks both nodes for a snapshot,
and their listeners answer by themselves: B learns r1 without ever reading its ``reader_open``,
never passes it, and its first directive continues A's ``seq``, so the listeners accept it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.settings import Settings, load_settings
from safepoint.streaming.job import build_query

from kafka_util import produce, read_topic, unique

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def settings_for(bootstrap: str, **values: Any) -> Settings:
    tag = unique("lost")
    settings = load_settings(flags={
        "bootstrap": bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "node_lease_ms": 4_000,
        "stall_ms": 0, "trigger_ms": 200, **values}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
    return settings


def mvcc_clock() -> int:
    return time.time_ns() // 1_000_000  # MVCC time in milliseconds: advances with the wall clock


def test_lost_checkpoint_keeps_the_floor_learns_open_readers_and_continues_seq(
    broker: Any, spark: Any, tmp_path: Path
) -> None:
    settings = settings_for(broker.bootstrap)
    ckpt_a, ckpt_b = tmp_path / "a", tmp_path / "b"
    produce(broker.bootstrap, settings.events_topic, [("c1", {
        "v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": int(time.time() * 1000),
        "nodes": {"n1": [], "n2": []}})])
    reporters = [Reporter(broker.bootstrap, n, cluster="c1", topic=settings.events_topic, mvcc_clock=mvcc_clock)
                 for n in ("n1", "n2")]
    listeners = [DirectiveListener(broker.bootstrap, reporter=r, topic=settings.directives_topic).start()
                 for r in reporters]
    n1_listener = listeners[0]
    query = build_query(spark, settings, str(ckpt_a))
    try:
        wait_for(lambda: n1_listener.safe_ts is not None, 120, "job A's first directive")
        reader = reporters[0].reader(label="report-job").open()
        r1_ts = reader.read_ts
        assert r1_ts is not None
        wait_for(lambda: (d := n1_listener.last_directive) is not None and (d.blocker or {}).get("id") == reader.reader_id,
                 60, "job A's safe point to stop at r1")
        assert n1_listener.safe_ts == r1_ts
        query.stop()
        last_seq, last_safe = n1_listener.seq, n1_listener.safe_ts
        shutil.rmtree(ckpt_a)  # the checkpoint is lost

        query = build_query(spark, settings.with_overrides(starting_offsets="latest"), str(ckpt_b))
        # Both listeners answer job B's snapshot requests by themselves. (Whether an awaiting_snapshot
        # alert is raised first depends on timing: an answer inside job B's discovery window, before
        # any round, completes the node before a round could abort for it.)
        answered = lambda: {e["node"] for e in read_topic(broker.bootstrap, settings.events_topic)  # noqa: E731
                            if e.get("type") == "snapshot"}
        wait_for(lambda: all(lst.stats().snapshot_requests >= 1 for lst in listeners) and answered() == {"n1", "n2"}, 120,
                 "both nodes' snapshots for job B")
        time.sleep(3)  # several batches of heartbeats after the snapshots: r1 must still hold
        directives = read_topic(broker.bootstrap, settings.directives_topic)
        compaction = [d for d in directives if d["type"] == "compaction"]
        assert max(d["seq"] for d in compaction) == last_seq, "job B must not advance past the open reader r1"
        assert all(d["safe_ts"] <= r1_ts for d in compaction)
        asked = sorted({d["node"] for d in directives if d["type"] == "snapshot_request"})
        assert asked == ["n1", "n2"]
        assert all(lst.stats().snapshot_requests >= 1 for lst in listeners)

        reader.close()
        wait_for(lambda: n1_listener.seq > last_seq, 60, "job B's first directive after r1 closes")
        assert n1_listener.safe_ts is not None and n1_listener.safe_ts > last_safe
        b_first = [d for d in read_topic(broker.bootstrap, settings.directives_topic)
                   if d["type"] == "compaction" and d["seq"] > last_seq][0]
        assert b_first["seq"] == last_seq + 1, "seq continues from the directives topic"
        awaiting = [a for a in read_topic(broker.bootstrap, settings.alerts_topic) if a["kind"] == "awaiting_snapshot"]
        assert {a["id"] for a in awaiting if a["state"] == "raised"} == {a["id"] for a in awaiting if a["state"] == "cleared"}, \
            "every node job B waited for was cleared by its snapshot"
    finally:
        query.stop()
        for lst in listeners:
            lst.close()
        for r in reporters:
            r.close()
