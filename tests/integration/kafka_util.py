"""Helpers for integration tests: produce a log, read a topic back."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, messages: list[tuple[str | None, Any]]) -> None:
    """Produce (key, value) pairs in order; value dicts are JSON-encoded, bytes/str sent as is."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for key, value in messages:
        if isinstance(value, dict):
            value = json.dumps(value)
        p.produce(topic, key=key, value=value)
        p.poll(0)
    assert p.flush(30) == 0


def read_topic(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every message of a topic, in offset order per partition, values parsed as JSON."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("read"), "enable.auto.commit": False,
                  "receive.message.max.bytes": 1_000_000_000})
    try:
        md = c.list_topics(topic, timeout=10)
        parts = sorted(md.topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: dict[int, list[dict[str, Any]]] = {p: [] for p in parts}
        pos = {p: 0 for p in parts}
        deadline = time.monotonic() + timeout_s
        while any(pos[p] < ends[p] for p in parts) and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            pos[m.partition()] = m.offset() + 1
            out[m.partition()].append({"key": m.key().decode() if m.key() else None, **json.loads(m.value())})
        return [x for p in parts for x in out[p]]
    finally:
        c.close()
