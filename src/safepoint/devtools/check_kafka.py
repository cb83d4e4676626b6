"""The checker over a whole run on a broker: it reads the events, directives, alerts and dead-letter
topics back and checks them with ``checker.check_logs``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from safepoint.devtools.check_result import CheckResult
from safepoint.devtools.checker import check_logs

__all__ = ["check_kafka", "read_topic"]


def read_topic(conf: dict[str, Any], topic: str, timeout_s: float = 120.0
               ) -> Iterator[tuple[int, int, bytes | None, bytes | None, int | None]]:
    """(partition, offset, key, value, broker time) of every message up to the high watermarks (the
    broker time: the record's timestamp when the broker set it, ``LogAppendTime``; else None)."""
    from safepoint.connectors.kafka.follow import read_to_end
    from safepoint.connectors.kafka.topics import TIMESTAMP_LOG_APPEND_TIME

    for m in read_to_end(conf, topic, timeout_s, client_id="safepoint-checker"):
        kind, stamp = m.timestamp()
        yield m.partition(), m.offset(), m.key(), m.value(), stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None


def _json_values(conf: dict[str, Any], topic: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _p, _o, _k, value, _t in read_topic(conf, topic):
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
    incarnation_grace_ms: int = 5_000,
) -> CheckResult:
    """Read the events, directives, alerts and dead-letter topics back and check them."""
    directives = _json_values(conf, topics["directives"])
    alerts = _json_values(conf, topics["alerts"])
    dead = _json_values(conf, topics["deadletter"])
    events = ((p, o, v, t) for p, o, _k, v, t in read_topic(conf, topics["events"]))
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
        incarnation_grace_ms=incarnation_grace_ms,
    )
