"""Reading a topic's raw messages back, per partition in offset order."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from kafka_util import unique


def events_by_partition(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("raw"), "enable.auto.commit": False})
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    try:
        for p in sorted(c.list_topics(topic, timeout=10).topics[topic].partitions):
            end = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            c.assign([TopicPartition(topic, p, 0)])
            pos, deadline = 0, time.monotonic() + 20
            while pos < end and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                out.append((p, m.offset(), m.key(), m.value()))
                pos = m.offset() + 1
        return out
    finally:
        c.close()


def run_to_end(spark: Any, settings: Any, checkpoint: str) -> int:
    """Start the job's query, run it until it has read everything there is, stop it: messages read."""
    from safepoint.streaming.job import build_query, messages_in

    q = build_query(spark, settings, checkpoint)
    try:
        q.processAllAvailable()
        return sum(messages_in(p) for p in q.recentProgress)
    finally:
        q.stop()


def get(url: str) -> Any:
    """GET a loopback URL: JSON decoded when the answer is JSON, text otherwise."""
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        body = resp.read()
        return json.loads(body) if resp.headers.get_content_type() == "application/json" else body.decode()


def answers(url: str) -> bool:
    """Whether an HTTP server answers ``url`` (any status)."""
    try:
        get(url)
    except (OSError, http.client.HTTPException):
        return False
    return True
