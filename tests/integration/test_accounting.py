"""Issue 5: every input offset is applied, ignored (with why) or dead-lettered, exactly once;
the job's per-batch counters add up to what it consumed, and match replay offset by offset."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import Engine, Position
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query
from safepoint.streaming.kafka_source import partition_offsets

from kafka_util import produce, read_topic, unique
from tests_support import events_by_partition

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


def messages() -> list[tuple[str, Any]]:
    hb = {"v": 1, "type": "heartbeat", "cluster": "c1", "incarnation": 1}
    out: list[tuple[str, Any]] = [
        ("c1", {"v": 1, "type": "topology", "cluster": "c1", "wall_ms": 0, "version": 2, "nodes": {"a": [], "b": []}}),
        ("c1", {"v": 1, "type": "topology", "cluster": "c1", "wall_ms": 1, "version": 1, "nodes": {"a": []}}),  # stale
        ("c1", {"v": 1, "type": "topology", "cluster": "c1", "node": "a", "wall_ms": 1, "version": 2,
                "nodes": {"a": []}}),  # a stray node field does not move it out of the cluster's gate: stale
    ]
    for i in range(1, 30):
        for n in ("a", "b"):
            out.append((n, {**hb, "node": n, "seq": i, "wall_ms": i * 100, "mvcc_now": i * 10}))
        if i % 7 == 0:
            out.append(("a", {**hb, "node": "a", "seq": i, "wall_ms": i * 100, "mvcc_now": i * 10}))  # duplicate
            out.append(("a", {**hb, "node": "a", "seq": i - 3, "wall_ms": i * 100, "mvcc_now": i * 10}))  # older seq
            out.append(("b", {**hb, "node": "b", "incarnation": 0, "seq": 99, "wall_ms": i * 100, "mvcc_now": 1}))
    out += [("x", b"\xff\xfe"), ("x", "{nope"), ("x", "[1,2]"), ("x", json.dumps({"v": 9, "type": "heartbeat"})),
            ("x", json.dumps({"v": 1, "type": "meteor"})), ("a", json.dumps({**hb, "node": "a", "seq": "7", "wall_ms": 1,
                                                                              "mvcc_now": 1})),
            ("a", json.dumps({**hb, "node": "a", "seq": 100, "wall_ms": -5, "mvcc_now": 1})),
            ("a", json.dumps({**hb, "node": "a", "seq": 101, "wall_ms": 5})), ("x", "x" * 2_000)]
    return out


def test_every_offset_is_accounted_for_once(broker: Any, spark: Any, tmp_path: Any) -> None:
    tag = unique("acct")
    settings = load_settings(flags={
        "bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control", "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "accounting_topic": f"{tag}.acct",
        "node_lease_ms": 1_000, "max_message_bytes": 1_000, "max_offsets_per_trigger": 40}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 3, log_append_time=False))
    msgs = messages()
    produce(broker.bootstrap, settings.events_topic, msgs)
    q = build_query(spark, settings, str(tmp_path / "ckpt"))
    try:
        q.processAllAvailable()
        progress = list(q.recentProgress)
    finally:
        q.stop()

    observed = Counter()
    for p in progress:
        row = (p.observedMetrics or {}).get("accounting")
        for k, v in (row.asDict() if row is not None else {}).items():
            observed[k] += v or 0
    def offsets(text: str | None) -> dict[str, int]:  # its partitions' (the topics' ids and the gaps left out)
        return partition_offsets((json.loads(text) if text else None) or {})

    read = sum(end - offsets(p["sources"][0]["startOffset"]).get(part, 0)
               for p in progress for part, end in offsets(p["sources"][0]["endOffset"]).items())
    assert observed["consumed"] == len(msgs) == read, "the counters count every offset the source read"
    assert observed["applied"] + observed["ignored"] + observed["deadlettered"] == observed["consumed"]
    assert observed["ignored_duplicate"] == 4 and observed["ignored_older_seq"] == 4
    assert observed["ignored_stale_incarnation"] == 4 and observed["ignored_stale_version"] == 2
    assert observed["deadlettered"] == 9 and observed["deadlettered_oversized"] == 1
    assert observed["deadlettered_mistyped_field"] == 1 and observed["deadlettered_out_of_range"] == 1

    rows = read_topic(broker.bootstrap, settings.accounting_topic)
    per_offset = {(r["partition"], r["offset"]): r["outcome"] for r in rows}
    assert len(per_offset) == len(rows) == len(msgs), "each offset accounted exactly once"

    # Replay the same messages, per partition in offset order, and compare labels offset by offset.
    engine = Engine(settings.policy(), record=True)
    for part, off, key, value in events_by_partition(broker.bootstrap, settings.events_topic):
        engine.process(value, Position(settings.events_topic, part, off, key))
    assert engine.outcomes is not None
    assert {(p, o): label for p, o, label in engine.outcomes} == per_offset
    assert len(read_topic(broker.bootstrap, settings.deadletter_topic)) == 9
