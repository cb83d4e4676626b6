"""Helpers for integration tests: produce a log, read a topic back."""

from __future__ import annotations

import json
import uuid
from typing import Any

from confluent_kafka import Producer


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def topic_flags(tag: str, *more: str) -> dict[str, str]:
    """Settings flags naming a test's own events, control, directives, alerts and dead-letter topics (and
    ``more`` of them, e.g. ``status``) after ``tag``."""
    return {f"{name}_topic": f"{tag}.{name}" for name in ("events", "control", "directives", "alerts", "deadletter", *more)}


def of_any_generation(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Directives as another job would write them too: without the job's ``generation`` (each job's own,
    made when it starts on empty state), byte for byte the rest."""
    return [{k: v for k, v in r.items() if k != "generation"} for r in rows]


def produce(bootstrap: str, topic: str, messages: list[tuple[Any, ...]]) -> None:
    """Produce (key, value) pairs in order, or (key, value, headers); value dicts are JSON-encoded,
    bytes/str sent as is."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for key, value, *headers in messages:
        if isinstance(value, dict):
            value = json.dumps(value)
        p.produce(topic, key=key, value=value, headers=headers[0] if headers else None)
        p.poll(0)
    assert p.flush(30) == 0


def read_messages(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[Any]:
    """Every record of a topic up to its end now, as the consumer gives them (the project's own
    reader, ``connectors/follow.read_to_end``; what it read when ``timeout_s`` pass without progress)."""
    from safepoint.connectors.kafka.follow import read_to_end

    out: list[Any] = []
    try:
        out.extend(read_to_end({"bootstrap.servers": bootstrap}, topic, timeout_s, client_id=unique("read")))
    except TimeoutError:
        pass
    return out


def read_topic(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every message of a topic up to its end now (``read_messages``), in offset order per partition,
    values parsed as JSON, each with its record's key."""
    out: dict[int, list[dict[str, Any]]] = {}
    for m in read_messages(bootstrap, topic, timeout_s):
        out.setdefault(m.partition(), []).append({"key": m.key().decode() if m.key() else None, **json.loads(m.value())})
    return [x for p in sorted(out) for x in out[p]]
