"""Issue 7: one job serves many database clusters; each gets its own correct safe point, and
the per-cluster work spreads over the shuffle partitions."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import Engine, Position
from safepoint.devtools.simulate import SimConfig, generate_log, key_of
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query

from kafka_util import produce, read_topic, unique
from tests_support import replay_policies

pytestmark = pytest.mark.integration
CLUSTERS = 20


def test_twenty_clusters_each_get_their_own_safe_point(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("multi")
    settings = load_settings(flags={
        "bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "retention": 500_000,
        "node_lease_ms": 3_000}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 4, log_append_time=False))
    logs = {f"c{i:02d}": generate_log(SimConfig(nodes=3, rate=60, cluster=f"c{i:02d}", long_reader_share=0.02,
                                                long_reader_ms=(500, 3_000)), 8_000, seed=i,
                                       start_ms=1_700_000_000_000 + i * 7)
            for i in range(CLUSTERS)}
    merged = sorted((e for log in logs.values() for e in log), key=lambda e: e["wall_ms"])
    produce(broker.bootstrap, settings.events_topic, [(key_of(e), e) for e in merged])
    q = build_query(spark, settings, str(tmp_path / "ckpt"))
    try:
        q.processAllAvailable()
    finally:
        q.stop()

    latest: dict[str, dict[str, Any]] = {}
    seqs: dict[str, list[int]] = defaultdict(list)
    for d in read_topic(broker.bootstrap, settings.directives_topic):
        if d["type"] == "members":
            assert d["key"] == f"{d['cluster']}/%members" and d["nodes"] == [f"{d['cluster']}-n{k}" for k in (1, 2, 3)]
            continue
        assert d["key"] == d["cluster"]
        seqs[d["cluster"]].append(d["seq"])
        latest[d["cluster"]] = d
    assert sorted(latest) == sorted(logs), "every cluster got directives"
    for cluster, log in logs.items():
        assert seqs[cluster] == list(range(1, len(seqs[cluster]) + 1))
        engine = Engine(replay_policies(settings, tmp_path / "ckpt"))  # each cluster alone, in its own order
        for i, e in enumerate(log):
            engine.process(json.dumps(e), Position("x", 0, i))
        assert latest[cluster]["safe_ts"] == engine.clusters[cluster].safe_ts, cluster
        assert set(latest[cluster]["basis"]) == {f"{cluster}-n{k}" for k in (1, 2, 3)}

    from pyspark.sql import functions as F

    spread = (spark.createDataFrame([(c,) for c in logs], "cluster string")
              .repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), "cluster")
              .groupBy(F.spark_partition_id().alias("p")).count().collect())
    assert len(spread) > 1, "clusters hash to more than one shuffle partition of the cluster stage"
