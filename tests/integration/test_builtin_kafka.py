"""Issue 7: `source_format = "kafka"` selects Spark's own connector with the same options.
Runs the whole flow when the connector jar is on the classpath, else skips saying why."""

from __future__ import annotations

from typing import Any

import pytest

from safepoint.connectors.topics import ensure_topics, topic_specs
from safepoint.errors import ConfigError
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query, kafka_connector_missing, kafka_options

from kafka_util import produce, read_topic, unique

pytestmark = pytest.mark.integration


def test_option_wiring_for_both_formats() -> None:
    s = load_settings(flags={"bootstrap": "k1:9092,k2:9092"}, environ={},
                      config=None).with_overrides(kafka={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"})
    assert kafka_options(s, builtin=True) == {"kafka.bootstrap.servers": "k1:9092,k2:9092",
                                              "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN"}
    assert kafka_options(s, builtin=False) == {"bootstrap.servers": "k1:9092,k2:9092",
                                               "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN"}


def test_builtin_kafka_format(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("builtin")
    settings = load_settings(flags={
        "bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "node_lease_ms": 1_000,
        "source_format": "kafka"}, environ={})
    missing = kafka_connector_missing(spark)
    if missing:
        with pytest.raises(ConfigError, match="spark-sql-kafka-0-10"):
            build_query(spark, settings, str(tmp_path / "ckpt"))
        pytest.skip(missing)
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2))
    hb = {"v": 1, "type": "heartbeat", "node": "n1", "incarnation": 0, "mvcc_now": 100}
    produce(broker.bootstrap, settings.events_topic,
            [("n1", {**hb, "seq": 1, "wall_ms": 0}), ("n1", {**hb, "seq": 2, "wall_ms": 2_000, "mvcc_now": 200})])
    q = build_query(spark, settings, str(tmp_path / "ckpt"))
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert [d["safe_ts"] for d in read_topic(broker.bootstrap, settings.directives_topic)] == [200]
