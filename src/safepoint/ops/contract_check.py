"""The checker's own validation of an event, written again from the contract (it never imports
``safepoint.core``): what it accepts and rejects must agree with the job's dead letters, which
the checker matches by (partition, offset)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SnapshotParts", "CLUSTER_TYPES", "CONTROL_TYPES", "INT64_MIN", "NODE_TYPES", "is_int", "validate_event"]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
WALL_MAX = 32_503_680_000_000  # year 3000, in ms
MAX_EXAMPLES = 20  # violations kept verbatim; all are counted

NODE_TYPES: dict[str, dict[str, type]] = {
    "reader_open": {"reader_id": str, "read_ts": int},
    "reader_close": {"reader_id": str},
    "tx_begin": {"tx_id": str, "begin_ts": int},
    "tx_prepare": {"tx_id": str, "coordinator": str, "participants": list},
    "tx_end": {"tx_id": str, "outcome": str},
    "heartbeat": {"mvcc_now": int},
    "snapshot": {"cut": int, "readers": list, "txs": list},
}
CLUSTER_TYPES: dict[str, dict[str, type]] = {
    "topology": {"version": int, "nodes": dict},
    "catalog": {"version": int, "catalog_version": int, "activated_at": int},
    "index_build": {"version": int, "index": str, "catalog_version": int, "state": str},
    "rebalance": {"version": int, "group": str, "catalog_version": int, "state": str},
}
CONTROL_TYPES: dict[str, dict[str, type]] = {
    "service_hold": {"cluster": str, "holder": str, "ts": int, "ttl_ms": int},
    "service_release": {"cluster": str, "holder": str},
    "pause": {"cluster": str, "reason": str},
    "resume": {"cluster": str},
}
"""Control events: cluster events without a version, in log order (they never move cluster time)."""
_ID_FIELDS = frozenset({"reader_id", "tx_id", "node", "coordinator", "index", "group", "cluster"})
_NON_NEGATIVE = frozenset({"incarnation", "seq", "version", "catalog_version", "wall_ms"})


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and INT64_MIN <= x <= INT64_MAX


def _field_error(name: str, value: Any, kind: type) -> str | None:
    if kind is int:
        if not is_int(value):
            return f"{name} is not a 64-bit integer"
        if name in _NON_NEGATIVE and value < 0:
            return f"{name} is negative"
        if name == "wall_ms" and value > WALL_MAX:
            return "wall_ms is past year 3000"
        return None
    if not isinstance(value, kind):
        return f"{name} is not a {kind.__name__}"
    if kind is str and name in _ID_FIELDS and not value:
        return f"{name} is empty"
    return None


def validate_event(value: bytes | str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(event, None) for a message the contract lets through, (None, why) for a dead letter."""
    if value is None:
        return None, "null value"
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None, "not UTF-8"
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return None, "not JSON"
    if "\\u" in value and not _encodable(obj):
        return None, "a string holds a lone UTF-16 surrogate"
    if not isinstance(obj, dict):
        return None, "not an object"
    if not is_int(obj.get("v")) or obj["v"] != 1:
        return None, "v is missing or not 1"
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in NODE_TYPES and kind not in CLUSTER_TYPES and kind not in CONTROL_TYPES:
        return None, "unknown type"
    required: dict[str, type] = {"wall_ms": int}
    if kind in NODE_TYPES:
        required.update({"node": str, "incarnation": int, "seq": int}, **NODE_TYPES[kind])
    elif kind in CONTROL_TYPES:
        required.update(CONTROL_TYPES[kind])
    else:
        required.update(CLUSTER_TYPES[kind])
    for name, ftype in required.items():
        if name not in obj:
            return None, f"missing {name}"
        why = _field_error(name, obj[name], ftype)
        if why:
            return None, why
    if "cluster" in obj:
        why = _field_error("cluster", obj["cluster"], str)
        if why:
            return None, why
    why = _deep_errors(kind, obj)
    if why:
        return None, why
    return obj, None


def _encodable(obj: Any) -> bool:
    """Every string (keys included) can be written as UTF-8: JSON may escape a lone surrogate."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _deep_errors(kind: str, obj: dict[str, Any]) -> str | None:
    """The nested fields this checker's model reads."""
    if kind == "service_hold" and not 1 <= obj["ttl_ms"] <= 31_536_000_000:
        return "ttl_ms is not between 1 ms and a year"
    if kind == "tx_end" and obj["outcome"] not in ("commit", "abort"):
        return "outcome is not commit or abort"
    if kind in ("index_build", "rebalance") and obj["state"] not in ("started", "finished"):
        return "state is not started or finished"
    if kind == "snapshot":
        for items, id_key, ts_key in ((obj["readers"], "reader_id", "read_ts"), (obj["txs"], "tx_id", "begin_ts")):
            for item in items:
                if not isinstance(item, dict) or _field_error(id_key, item.get(id_key), str) or not is_int(item.get(ts_key)):
                    return f"a snapshot entry lacks a valid {id_key} or {ts_key}"
                if "prepared" in item and not isinstance(item["prepared"], bool):
                    return "a snapshot entry's prepared is not a boolean"
    if kind == "heartbeat" and "groups" in obj:
        if not isinstance(obj["groups"], list):
            return "groups is not an array"
        for g in obj["groups"]:
            if not isinstance(g, dict) or _field_error("group", g.get("group"), str):
                return "a group entry lacks a valid group"
            if "leader" in g and not isinstance(g["leader"], bool):
                return "a group's leader is not a boolean"
            pub = g.get("published_min_tx_time")
            if pub is not None and not is_int(pub):
                return "a group's published_min_tx_time is not an integer or null"
    if kind == "topology":
        for name, groups in obj["nodes"].items():
            if not name or not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
                return "topology nodes must map node ids to lists of group ids"
    return None


class SnapshotParts:
    """A snapshot sent in several messages (``part``, ``parts``), read as the contract says: whole once
    its last part arrives, none of it when its parts do not follow one another (a part skipped,
    another event of the node between two parts, another ``cut``)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[Any] | None = None
        """[cut, parts, next part, readers, txs] received so far."""

    def take(self, ev: dict[str, Any]) -> dict[str, Any] | None:
        """The event to apply for ``ev`` (the whole snapshot at its last part), or None (a part kept, or
        dropped)."""
        parts = ev.get("parts", 1) if ev["type"] == "snapshot" else 1
        if parts == 1:
            self.pending = None
            return ev
        part = ev.get("part", 0)
        if part == 0:
            self.pending = [ev["cut"], parts, 0, [], []]
        p = self.pending
        if p is None or p[:3] != [ev["cut"], parts, part]:
            self.pending = None
            return None
        p[2] += 1
        p[3] += ev["readers"]
        p[4] += ev["txs"]
        if p[2] < parts:
            return None
        self.pending = None
        return {**ev, "readers": p[3], "txs": p[4]}
