"""The checker over a whole run on a broker: it reads the events, directives, alerts and dead-letter
topics back and checks them with ``checker.check_logs``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from safepoint.devtools.check_result import CheckResult
from safepoint.devtools.checker import check_logs

__all__ = ["check_kafka", "read_topic"]


def read_topic(conf: dict[str, Any], topic: str, timeout_s: float = 120.0) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every message up to the high watermarks, partition by partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"safepoint-checker-{time.time_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "receive.message.max.bytes": 1_000_000_000,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=30)
        if topic not in md.topics or md.topics[topic].error is not None:
            return
        for p in sorted(md.topics[topic].partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            pos = low
            deadline = time.monotonic() + timeout_s
            while pos < high:
                if time.monotonic() > deadline:
                    msg = f"reading {topic}[{p}] stopped at offset {pos} of {high} after {timeout_s:.0f} s"
                    raise TimeoutError(msg)
                for m in consumer.consume(2000, 1.0):
                    offset = m.offset()
                    if m.error() or offset is None or offset < pos:
                        continue
                    pos = offset + 1
                    deadline = time.monotonic() + timeout_s
                    yield p, offset, m.key(), m.value()
                    if pos >= high:
                        break
            consumer.unassign()
    finally:
        consumer.close()


def _json_values(conf: dict[str, Any], topic: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _p, _o, _k, value in read_topic(conf, topic):
        if value is None:
            continue  # a tombstone on the compacted topic
        obj = json.loads(value)
        if isinstance(obj, dict):
            out.append(obj)
    return out


def check_kafka(
    conf: dict[str, Any],
    topics: dict[str, str],
    *,
    retention: int,
    node_lease_ms: int,
    directive_interval_ms: int,
    warmup_ms: int,
    mvcc_per_ms: int = 1000,
) -> CheckResult:
    """Read the events, directives, alerts and dead-letter topics back and check them."""
    directives = _json_values(conf, topics["directives"])
    alerts = _json_values(conf, topics["alerts"])
    dead = _json_values(conf, topics["deadletter"])
    events = ((p, o, v) for p, o, _k, v in read_topic(conf, topics["events"]))
    return check_logs(
        events,
        directives,
        alerts,
        dead,
        events_topic=topics["events"],
        retention=retention,
        node_lease_ms=node_lease_ms,
        directive_interval_ms=directive_interval_ms,
        warmup_ms=warmup_ms,
        mvcc_per_ms=mvcc_per_ms,
    )
