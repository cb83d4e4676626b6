"""A node too big for one message: a snapshot of 100,000 open readers goes out in parts and the job
applies it as one (the node client on both Kafka libraries, the broker, the job)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.reporter import Reporter

from kafka_util import produce, read_topic
from tests_support import QueryJob, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def node_status(bootstrap: str, topic: str, node: str) -> dict[str, Any] | None:
    parts = [s for s in read_topic(bootstrap, topic, 3) if s.get("type") == "node_status" and s.get("node") == node]
    return parts[-1] if parts else None


@pytest.mark.parametrize(("client", "readers", "part_bytes"), [("confluent", 100_000, 500_000),
                                                                ("kafka-python", 10_000, 50_000)])
def test_a_snapshot_of_any_size_goes_out_in_parts_and_is_applied_as_one(broker: Any, spark: Any, tmp_path: Path,
                                                                       client: str, readers: int, part_bytes: int) -> None:
    settings = make_settings(broker.bootstrap, f"parts-{client}", 2, node_lease_ms=60_000, retention=1_000)
    clock = [10_000_000]
    rep = Reporter(broker.bootstrap, "big", mvcc_clock=lambda: clock[0], cluster="c1", incarnation=1,
                   topic=settings.events_topic, heartbeat_interval_s=None, client=client, retention=1_000,
                   snapshot_part_bytes=part_bytes)
    produce(broker.bootstrap, settings.events_topic, [("c1", {"v": 1, "type": "topology", "cluster": "c1", "version": 1,
                                                              "wall_ms": int(time.time() * 1000), "nodes": {"big": []}})])
    job = QueryJob(spark, settings, tmp_path / "ckpt")
    try:
        rep.heartbeat()  # its bound: readers above mvcc_now - retention are published lazily (not at all here)
        opened = [rep.reader(clock[0] - 500 + i % 400, reader_id=f"r{i}").open() for i in range(readers)]
        assert rep.stats().sent < 10, "the readers themselves were not published"
        sent_before = rep.stats().sent
        rep.snapshot()
        parts = rep.stats().sent - sent_before
        assert parts > 1 and parts >= readers * 60 // part_bytes, f"a {readers}-reader snapshot in {parts} part(s)"
        clock[0] += 1_000
        rep.heartbeat()
        assert rep.flush(60) == 0
        status: dict[str, Any] | None = None

        def applied() -> bool:
            """Every reader held and the heartbeat after the snapshot taken: a batch may end between the
            snapshot's last part and that heartbeat, and its status has the older floor."""
            nonlocal status
            status = node_status(broker.bootstrap, settings.status_topic, "big")
            return status is not None and status["open"]["reader"] == readers and status["mvcc_now"] == clock[0]

        wait_for(applied, 240, f"the job holding all {readers} readers and the heartbeat after them", job)
        assert status is not None and status["local_min"] == clock[0] - 1_000 - 500
        dead = [m for m in read_topic(broker.bootstrap, settings.deadletter_topic, 2)]
        assert dead == [], "no part was too big for the job"
        directives = [d for d in read_topic(broker.bootstrap, settings.directives_topic, 2) if d["type"] == "compaction"]
        assert directives and directives[-1]["safe_ts"] <= clock[0] - 1_500, "the lowest reader holds the safe point"
        for r in opened[: readers // 2]:
            r.close()  # closes of readers named by a snapshot are published from then on
        rep.heartbeat()
        assert rep.flush(60) == 0
        wait_for(lambda: (node_status(broker.bootstrap, settings.status_topic, "big") or {}).get("open", {}).get(
            "reader") == readers - readers // 2, 120, "half of them closed", job)
    finally:
        rep.close()
        job.stop()
        time.sleep(0.1)
