"""`source_format = "kafka"` selects Spark's own connector with the same options: the whole flow runs
on Apache Kafka with the connector setup installs (the suite's session has it on its classpath);
without it, a developer's run skips saying why and CI fails."""

from __future__ import annotations

from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core.ids import CLUSTER_HEADER
from safepoint.devtools.simulate import SimConfig, generate_log, key_of
from safepoint.errors import ConfigError
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query, kafka_connector_missing, kafka_options

from kafka_util import of_any_generation, produce, read_topic, unique
from observers import missing_tool

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def test_option_wiring_for_both_formats() -> None:
    s = load_settings(flags={"bootstrap": "k1:9092,k2:9092"}, environ={},
                      config=None).with_overrides(kafka={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"})
    assert kafka_options(s, builtin=True) == {"kafka.bootstrap.servers": "k1:9092,k2:9092",
                                              "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN"}
    assert kafka_options(s, builtin=False) == {"bootstrap.servers": "k1:9092,k2:9092",
                                               "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN"}


def test_builtin_kafka_format(broker: Any, spark: Any, tmp_path: Any) -> None:
    """Same log through the Python Data Source and through Spark's connector: identical directives.
    Half the nodes name their cluster in the record's header, as the node clients do, and one event
    comes under a header naming another cluster: both read the headers and dead-letter it alike."""
    tag = unique("builtin")
    base = {"bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "alerts_topic": f"{tag}.alerts",
            "node_lease_ms": 1_000}
    builtin = load_settings(flags={**base, "directives_topic": f"{tag}.d-kafka", "deadletter_topic": f"{tag}.dl-kafka",
                                      "source_format": "kafka"}, environ={})
    missing = kafka_connector_missing(spark)
    if missing:
        with pytest.raises(ConfigError, match="spark-sql-kafka-0-10"):
            build_query(spark, builtin, str(tmp_path / "ckpt"))
        missing_tool(missing)
    python = load_settings(flags={**base, "directives_topic": f"{tag}.d-python", "deadletter_topic": f"{tag}.dl-python",
                                     "source_format": "python"}, environ={})
    ensure_topics(python.librdkafka(), topic_specs(python.topics(), 2, log_append_time=False))
    ensure_topics(builtin.librdkafka(), topic_specs(builtin.topics(), 2, log_append_time=False))
    log = generate_log(SimConfig(nodes=4, rate=200, long_reader_share=0.02, long_reader_ms=(300, 2_000)), 6_000, seed=3)
    named = [(CLUSTER_HEADER, b"default")]
    msgs = [(key_of(e), e, named if e.get("node", "") in ("default-n1", "default-n3") else None) for e in log]
    stray = next(i for i, e in enumerate(log) if e["type"] == "reader_open" and e["node"] == "default-n2")
    msgs.insert(stray, (key_of(log[stray]), log[stray], [(CLUSTER_HEADER, b"another")]))
    assert {e.get("node") for e in log} >= {"default-n1", "default-n2", "default-n3"}
    produce(broker.bootstrap, python.events_topic, msgs)
    results = []
    for settings, name in ((python, "python"), (builtin, "kafka")):
        q = build_query(spark, settings, str(tmp_path / f"ckpt-{name}"))
        try:
            q.processAllAvailable()
        finally:
            q.stop()
        results.append(of_any_generation(read_topic(broker.bootstrap, settings.directives_topic)))  # two jobs
        (dead,) = read_topic(broker.bootstrap, settings.deadletter_topic)
        assert dead["error"] == ("invalid header safepoint-cluster: it names cluster 'another', the event's cluster is "
                                 "'default'"), name
    assert results[0] and results[0] == results[1]
