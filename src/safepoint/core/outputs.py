"""What the core emits: directives, alerts and dead letters, in the contract's shape."""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

__all__ = ["Output", "DIRECTIVES", "ALERTS", "DEADLETTER", "dead_letter", "alert"]

DIRECTIVES = "directives"
ALERTS = "alerts"
DEADLETTER = "deadletter"


class Output(NamedTuple):
    """One message for one output topic: ``channel`` names the topic setting, not the topic."""

    channel: str
    key: str
    value: dict[str, Any]


def dead_letter(
    error: str,
    value: bytes | str | None,
    key: bytes | str | None,
    topic: str,
    partition: int,
    offset: int,
) -> Output:
    text: str | None
    encoding = "utf-8"
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            text = base64.b64encode(value).decode("ascii")
            encoding = "base64"
    else:
        text = value
    key_text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    body = {
        "v": 1,
        "error": error,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key_text,
        "value": text,
        "value_encoding": encoding,
    }
    return Output(DEADLETTER, key_text or "", body)


def alert(
    *,
    kind: str,
    state: str,
    severity: str,
    cluster: str,
    node: str | None,
    value: int | None,
    threshold: int | None,
    since_wall_ms: int,
    cluster_wall_ms: int,
    detail: str,
    alert_id: str,
) -> Output:
    body = {
        "v": 1,
        "type": "alert",
        "kind": kind,
        "state": state,
        "severity": severity,
        "cluster": cluster,
        "node": node,
        "value": value,
        "threshold": threshold,
        "since_wall_ms": since_wall_ms,
        "cluster_wall_ms": cluster_wall_ms,
        "detail": detail,
        "id": alert_id,
    }
    return Output(ALERTS, node if node is not None else cluster, body)
