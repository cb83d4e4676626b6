"""Two live processes under one node id, and a genuine restart, through the job: real Reporters on
the broker, the job as a query of the shared Spark session."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.reporter import Reporter

from kafka_util import read_topic
from tests_support import QueryJob, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def mvcc() -> int:
    """The nodes' MVCC clock: microseconds of wall time."""
    return int(time.time() * 1_000_000)


def test_two_live_reporters_under_one_node_id_and_a_genuine_restart(broker: Any, spark: Any, tmp_path: Path) -> None:
    # heartbeats every 0.2 s and a grace of 2 s of log time (delivery delays count in it): room for a loaded host
    settings = make_settings(broker.bootstrap, "twins", 2, node_lease_ms=4_000, incarnation_grace_ms=2_000,
                             trigger_ms=300)
    events = settings.events_topic

    def reporter(node: str, incarnation: int) -> Reporter:
        return Reporter(broker.bootstrap, node, mvcc_clock=mvcc, cluster="c1", incarnation=incarnation, topic=events,
                        heartbeat_interval_s=0.2)

    def directives() -> list[dict[str, Any]]:
        return [d for d in read_topic(broker.bootstrap, settings.directives_topic, 2) if d["type"] == "compaction"]

    def alerts(kind: str) -> list[dict[str, Any]]:
        return [a for a in read_topic(broker.bootstrap, settings.alerts_topic, 2) if a.get("kind") == kind]

    job = QueryJob(spark, settings, tmp_path / "ckpt")
    reporters: list[Reporter] = []
    try:
        a = reporter("n1", 100)
        reporters.append(a)
        held = mvcc() - 1_000_000
        a.reader(held, label="long report", reader_id="report").open()
        dead = reporter("n3", 1)
        reporters.append(dead)
        dead_ts = mvcc() - 500_000
        dead.reader(dead_ts, reader_id="lost-with-its-process").open()
        wait_for(lambda: bool(directives()), 90, "a first directive", job)
        # a second process starts as n1 (a copied configuration) while the first still speaks
        b = reporter("n1", 200)
        reporters.append(b)
        wait_for(lambda: any(x["state"] == "raised" for x in alerts("duplicate_node")), 30, "duplicate_node", job)
        time.sleep(4.5)  # past the grace, and a lease: both speak all along
        assert max(d["safe_ts"] for d in directives()) <= held, "the older process's reader was passed while it spoke"
        (raised,) = [x for x in alerts("duplicate_node") if x["state"] == "raised"]
        assert raised["node"] == "n1" and raised["severity"] == "critical"
        assert (raised["value"], raised["threshold"]) == (100, 200) and "100, 200" in raised["detail"]

        # a genuine restart of n3: its process ends, a new one starts; the old reader goes within the grace
        dead.close()
        restarted_at = time.monotonic()
        reporters.append(reporter("n3", 2))
        time.sleep(0.5)
        assert max(d["safe_ts"] for d in directives()) <= held

        # the first n1 process stops: after a lease of silence its reader goes and the alert clears
        a.close()
        stopped = time.monotonic()
        wait_for(lambda: directives()[-1]["safe_ts"] > held, 60, "the safe point passing the silent process's reader", job)
        passed_after = time.monotonic() - stopped
        wait_for(lambda: any(x["state"] == "cleared" for x in alerts("duplicate_node")), 30, "duplicate_node cleared", job)
        assert directives()[-1]["safe_ts"] > dead_ts, "the dead process's reader went"
        assert not [x for x in alerts("duplicate_node") if x["node"] == "n3"], "a restart is no second process"
        assert passed_after >= 3.0, f"passed {passed_after:.1f} s after the process stopped: before its lease ran out"
        assert time.monotonic() - restarted_at > 2.0
    finally:
        for r in reporters:
            r.close()
        job.stop()
