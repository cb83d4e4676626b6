"""A second, independent Kafka client: kafka-python (pure Python, no librdkafka) against the job.

The contract is all a node shares with safepoint, so the same log produced with kafka-python and
with confluent-kafka must be applied exactly alike, and everything the job writes, read back with
kafka-python, must validate against ``schemas/``. The node client itself runs on kafka-python
too (``client="kafka-python"``): ``test_client.py`` runs every client test on both libraries, and
the last test here runs the client in a process where confluent-kafka cannot even be imported.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
import zlib
from typing import Any

import jsonschema
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from safepoint.connectors.kafka.clients import KAFKA_PYTHON, crc32_partition
from safepoint.connectors.kafka.producer import make_producer
from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.devtools.simulate import SimConfig, generate_log
from safepoint.schemas import load
from safepoint.settings import Settings, load_settings

from kafka_util import of_any_generation, produce, unique
from test_parity import as_message, drained
from tests_support import run_to_end

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)
PARTITIONS = 3


def settings_for(bootstrap: str, name: str) -> Settings:
    tag = unique(name)
    settings = load_settings(flags={
        "bootstrap": bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "retention": 1_000_000,
        "node_lease_ms": 3_000}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), PARTITIONS, log_append_time=False))
    return settings


def read_with_kafka_python(bootstrap: str, topic: str, timeout_s: float = 20.0) -> list[tuple[int, bytes | None, bytes]]:
    """(partition, key, value) of every message, per partition in offset order, read by kafka-python."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        got: dict[int, list[tuple[int, bytes | None, bytes]]] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"kafka-python did not read {topic} to its end"
            for tp, records in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend((tp.partition, r.key, r.value) for r in records)
        return [m for p in sorted(got) for m in got[p]]
    finally:
        consumer.close()


def outputs(bootstrap: str, settings: Settings) -> dict[str, list[dict[str, Any]]]:
    """Every output, read with kafka-python, validated against its schema; the events topic's name
    (the only thing that differs between the two runs) is taken out of dead letters."""
    out: dict[str, list[dict[str, Any]]] = {}
    for channel, topic in (("directives", settings.directives_topic), ("alerts", settings.alerts_topic),
                           ("deadletter", settings.deadletter_topic)):
        values = []
        for _p, key, raw in read_with_kafka_python(bootstrap, topic):
            value = json.loads(raw)
            schema = "alert" if channel == "alerts" else "deadletter" if channel == "deadletter" else value["type"]
            jsonschema.Draft7Validator(load("outputs", schema)).validate(value)
            assert key is not None
            if channel == "deadletter":
                assert value.pop("topic") == settings.events_topic
            values.append({"key": key.decode(), **value})
        out[channel] = of_any_generation(values) if channel == "directives" else values  # two jobs, two generations
    return out


def test_a_log_produced_with_kafka_python_is_applied_exactly_as_confluent_kafkas(broker: Any, spark: Any,
                                                                                  tmp_path: Any) -> None:
    cfg = SimConfig(nodes=4, rate=300, long_reader_share=0.01, long_reader_ms=(1_000, 4_000),
                    restart_per_node_per_min=3.0, groups_per_node=1)
    events = drained(generate_log(cfg, 8_000, seed=11), random.Random(11))
    last = [e for e in events if isinstance(e, dict) and e.get("node")][-1]  # and a late reader: an alert
    events.append({**{k: last[k] for k in ("v", "cluster", "node", "incarnation")}, "type": "reader_open",
                   "seq": last["seq"] + 1, "wall_ms": last["wall_ms"] + 1, "reader_id": "late", "read_ts": 0})
    log = [as_message(e) for e in events]
    by_confluent, by_kafka_python = settings_for(broker.bootstrap, "kp-c"), settings_for(broker.bootstrap, "kp-k")

    produce(broker.bootstrap, by_confluent.events_topic, log)  # librdkafka's default partitioner
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
    for key, value in log:  # a Java-style client: the node's partition chosen by the key's CRC-32, as librdkafka does
        k = key.encode() if key is not None else None
        producer.send(by_kafka_python.events_topic, key=k, value=value if isinstance(value, bytes) else value.encode(),
                      partition=crc32_partition(k, range(PARTITIONS)))
    producer.flush(30)
    producer.close()
    placed = read_with_kafka_python(broker.bootstrap, by_confluent.events_topic)
    assert placed == read_with_kafka_python(broker.bootstrap, by_kafka_python.events_topic), (
        "the same messages on the same partitions in the same order")

    assert run_to_end(spark, by_confluent, str(tmp_path / "c")) == len(log)
    assert run_to_end(spark, by_kafka_python, str(tmp_path / "k")) == len(log)
    a, b = outputs(broker.bootstrap, by_confluent), outputs(broker.bootstrap, by_kafka_python)
    assert len(a["directives"]) > 5 and a["alerts"] and a["deadletter"]
    assert a == b


def test_the_node_client_places_a_node_on_librdkafkas_partition(broker: Any) -> None:
    """``client="kafka-python"`` keeps a node on the partition confluent-kafka gives it."""
    topic = unique("kp-place")
    ensure_topics({"bootstrap.servers": broker.bootstrap}, topic_specs(
        {"events": topic, "directives": topic + ".d", "alerts": topic + ".a", "deadletter": topic + ".dl"}, 5))
    keys = [f"node-{i}" for i in range(20)]
    produce(broker.bootstrap, topic, [(k, {"k": k}) for k in keys])
    producer = make_producer(KAFKA_PYTHON, {"bootstrap.servers": broker.bootstrap})
    reports: list[Any] = []
    for k in keys:
        producer.produce(topic, value=b"{}", key=k.encode(), on_delivery=lambda err, msg: reports.append((err, msg)))
    assert producer.flush(20) == 0
    producer.close()
    by_confluent = {json.loads(v)["k"]: p for p, _k, v in read_with_kafka_python(broker.bootstrap, topic) if v != b"{}"}
    assert all(err is None for err, _ in reports) and len(reports) == len(keys)
    assert {msg.key().decode(): msg.partition() for _, msg in reports} == by_confluent
    assert by_confluent == {k: zlib.crc32(k.encode()) % 5 for k in keys}


def test_the_node_client_runs_where_confluent_kafka_cannot_be_imported(broker: Any) -> None:
    """A node without librdkafka's wheel: the reporter publishes, the listener reads, on kafka-python alone."""
    topic, directives = unique("kp-only.events"), unique("kp-only.directives")
    ensure_topics({"bootstrap.servers": broker.bootstrap}, topic_specs(
        {"events": topic, "directives": directives, "alerts": topic + ".a", "deadletter": topic + ".dl"}, 2))
    produce(broker.bootstrap, directives, [("c1", {
        "v": 1, "type": "compaction", "cluster": "c1", "seq": 3, "safe_ts": 500, "catalog_floor": None,
        "cluster_wall_ms": 1, "blocker": None, "basis": {}})])
    script = textwrap.dedent(f"""
        import sys
        sys.modules["confluent_kafka"] = None  # as if librdkafka's wheel could not be installed
        from safepoint.connectors.listener import DirectiveListener
        from safepoint.connectors.reporter import Reporter
        from safepoint.errors import ReaderRefused
        rep = Reporter({broker.bootstrap!r}, "n1", cluster="c1", topic={topic!r}, mvcc_clock=lambda: 900,
                       heartbeat_interval_s=None, client="kafka-python")
        lst = DirectiveListener({broker.bootstrap!r}, reporter=rep, topic={directives!r})
        d = None
        for _ in range(50):
            d = d or lst.poll(0.5)
            if d is not None:
                break
        assert d is not None and d.seq == 3 and rep.safe_ts == 500, d
        try:
            rep.reader(400).open()
        except ReaderRefused:
            pass
        else:
            raise AssertionError("a reader below the safe point must be refused")
        with rep.reader(600, label="kp"):
            rep.heartbeat()
        assert rep.flush(20) == 0
        lst.close()
        rep.close()
        print("ok", rep.stats().delivered)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "3"]
    types = [json.loads(v)["type"] for _p, _k, v in read_with_kafka_python(broker.bootstrap, topic)]
    assert types == ["reader_open", "heartbeat", "reader_close"]
