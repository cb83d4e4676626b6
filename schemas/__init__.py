"""The contract's JSON Schema files, loaded by the client library, the job and the tests.

The files in this folder are the single source of the wire format: ``events/<type>.json`` for
every input event, ``outputs/<name>.json`` for directives, alerts and dead letters.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["ALERT_KINDS", "EVENT_TYPES", "NODE_EVENT_TYPES", "CLUSTER_EVENT_TYPES", "CONTROL_EVENT_TYPES", "OUTPUT_NAMES",
           "load"]

NODE_EVENT_TYPES = (
    "reader_open",
    "reader_close",
    "tx_begin",
    "tx_prepare",
    "tx_end",
    "heartbeat",
    "snapshot",
)
CLUSTER_EVENT_TYPES = ("topology", "catalog", "index_build", "rebalance", "service_hold", "service_release", "pause",
                       "resume", "gap_ack")
CONTROL_EVENT_TYPES = ("service_hold", "service_release", "pause", "resume", "gap_ack")
"""Cluster events an operator or a holder publishes on the control topic (``core/control.py``,
``core/origin.py``): no ``version``, in their order in the log."""
EVENT_TYPES = NODE_EVENT_TYPES + CLUSTER_EVENT_TYPES
OUTPUT_NAMES = ("compaction", "members", "expire", "snapshot_request", "band", "alert", "deadletter")


@cache
def load(kind: str, name: str) -> dict[str, Any]:
    """Return the parsed schema ``<kind>/<name>.json`` (kind is ``events`` or ``outputs``)."""
    if kind not in ("events", "outputs"):
        msg = f"unknown schema kind {kind!r}: use 'events' or 'outputs'"
        raise ValueError(msg)
    text = resources.files(__name__).joinpath(kind, f"{name}.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


ALERT_KINDS: tuple[str, ...] = tuple(load("outputs", "alert")["properties"]["kind"]["enum"])
"""Every kind of alert the job raises (``outputs/alert.json``'s ``kind``); the operator guide's
alert reference has a row for each."""
