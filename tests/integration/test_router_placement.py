"""The Spark job routes in the Python source's read tasks, or (as with Spark's own kafka format)
in a separate mapInArrow: same log, same outputs, and both are replay's.

A generated multi-partition log with two clusters, restarts, duplicates and bad messages is in
the broker before either query starts (cluster c0's node events name it in the record's
``safepoint-cluster`` header, as the node clients send them, so the Python source hands them to
the operator unread; c1's come without, as from an older client, and the mapInArrow router gets
no headers from the Python source: it parses every message), so both plan the same micro-batches; every output topic
(directives, alerts, dead letters, per-offset accounting) and the observed counters must match,
and each run is checked against ``Engine`` replayed in the job's batch order (tests_support.verify).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core.ids import CLUSTER_HEADER
from safepoint.devtools.simulate import SimConfig, generate_log, key_of
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query, messages_in

from kafka_util import of_any_generation, produce, read_topic, unique
from tests_support import verify

pytestmark = pytest.mark.integration

JUNK: list[Any] = [b"\xff\xfe", "{not json", "[]", json.dumps({"v": 2, "type": "heartbeat"}),
                   json.dumps({"v": 1, "type": "reader_open", "cluster": "c1"})]


def log(seed: int = 11) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    evs: list[dict[str, Any]] = []
    for c in range(2):
        cfg = SimConfig(nodes=4 + c, rate=300, cluster=f"c{c}", long_reader_share=0.02, long_reader_ms=(500, 3_000),
                        restart_per_node_per_min=4.0, groups_per_node=1)
        evs += generate_log(cfg, 6_000, seed=seed + c)  # ms of simulated time
    evs.sort(key=lambda e: e["wall_ms"])
    out: list[tuple[Any, ...]] = []
    for ev in evs:
        headers = [(CLUSTER_HEADER, b"c0")] if ev["cluster"] == "c0" and "node" in ev else None
        out.append((key_of(ev), json.dumps(ev), headers))
        if rng.random() < 0.02:
            out.append((key_of(ev), json.dumps(ev), headers))
        if rng.random() < 0.01:
            out.append(("junk", rng.choice(JUNK), headers))
    return out


def run(spark: Any, bootstrap: str, events_topic: str, tag: str, tmp_path: Any, pack_in_source: bool = True) -> dict[str, Any]:
    settings = load_settings(flags={
        "bootstrap": bootstrap, "events_topic": events_topic, "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "accounting_topic": f"{tag}.acct",
        "retention": 200_000, "node_lease_ms": 1_500, "directive_interval_ms": 100, "reader_age_warning_ms": 1_500,
        "reader_age_critical_ms": 3_000, "max_offsets_per_trigger": 500, "node_buckets": 3},
        environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 3, log_append_time=False))
    ckpt = tmp_path / f"ckpt-{tag}"
    q = build_query(spark, settings, str(ckpt), pack_in_source=pack_in_source)
    try:
        q.processAllAvailable()
        progress = list(q.recentProgress)
    finally:
        q.stop()
    counters: Counter[str] = Counter()
    for p in progress:
        row = (p.observedMetrics or {}).get("accounting")
        for k, v in (row.asDict() if row is not None else {}).items():
            counters[k] += v or 0
    by_cluster = lambda rows: sorted(rows, key=lambda r: r["cluster"])  # noqa: E731 - stable: each cluster's order kept
    by_offset = lambda rows: sorted(rows, key=lambda r: (r["partition"], r["offset"]))  # noqa: E731
    verify(bootstrap, settings, ckpt)  # replay's outputs, in the job's batch order
    return {  # (two jobs: each has its own generation)
        "directives": of_any_generation(by_cluster(read_topic(bootstrap, settings.directives_topic))),
        "alerts": by_cluster(read_topic(bootstrap, settings.alerts_topic)),
        "deadletter": by_offset(read_topic(bootstrap, settings.deadletter_topic)),
        "accounting": by_offset(read_topic(bootstrap, settings.accounting_topic)),
        "counters": dict(counters),
        "batches": [messages_in(p) for p in progress],
    }


def test_routing_in_the_source_or_in_spark_writes_replays_outputs(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("router")
    events_topic = f"{tag}.events"
    ensure_topics({"bootstrap.servers": broker.bootstrap}, [NewTopic(events_topic, num_partitions=3, replication_factor=1)])
    msgs = log()
    produce(broker.bootstrap, events_topic, msgs)
    fast = run(spark, broker.bootstrap, events_topic, f"{tag}-source", tmp_path)
    # the plan Spark's own kafka format gets: the router as a separate mapInArrow
    mapped = run(spark, broker.bootstrap, events_topic, f"{tag}-mapped", tmp_path, pack_in_source=False)
    assert fast["batches"] == mapped["batches"] and len([b for b in fast["batches"] if b]) > 3
    assert len(fast["directives"]) >= 5 and fast["deadletter"] and fast["alerts"]
    assert fast["counters"]["consumed"] == len(msgs) == len(fast["accounting"])
    for topic in ("directives", "alerts", "deadletter", "accounting", "counters"):
        assert mapped[topic] == fast[topic], topic
