"""Parsing and dead letters: CONTRACT "Every message value is one UTF-8 JSON object..." and "Dead letters"."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from safepoint.core import Policy, Rejected, parse

from core_helpers import EVENTS_TOPIC, INT64_MAX, INT64_MIN, NodeClient, Run, dead_letters

HB: dict[str, Any] = {"v": 1, "type": "heartbeat", "node": "n1", "incarnation": 0, "seq": 0, "wall_ms": 1000, "mvcc_now": 5}


def hb(**changes: Any) -> dict[str, Any]:
    ev = dict(HB)
    for k, v in changes.items():
        if v is ...:
            del ev[k]
        else:
            ev[k] = v
    return ev


def rejected(value: bytes | str | None, max_bytes: int = 1 << 20) -> str:
    result = parse(value, max_bytes)
    assert isinstance(result, Rejected), result
    return result.error


def one_dead_letter(run: Run, value: bytes | str | None, key: bytes | str | None = "n1") -> dict[str, Any]:
    outs = run.raw(value, key)
    assert len(outs) == 1, outs
    [dl] = dead_letters(outs)
    return dl


def test_not_utf8_is_dead_lettered_with_base64_value() -> None:
    """CONTRACT Dead letters: value is the original text, or base64 if not UTF-8."""
    run = Run()
    raw = b'{"v": 1, "type": "heartbeat", "node": "\xff\xfe"}'
    dl = one_dead_letter(run, raw, key=b"n1")
    assert dl["error"].startswith("not UTF-8")
    assert dl["value_encoding"] == "base64"
    assert base64.b64decode(dl["value"]) == raw
    assert dl["key"] == "n1"
    assert (dl["topic"], dl["partition"], dl["offset"]) == (EVENTS_TOPIC, 0, 0)
    assert run.counts == {"deadlettered": 1}


@pytest.mark.parametrize("text", ["{", "", "heartbeat", '{"v": 1,}', "NaN", '{"v": NaN}', '{"v": Infinity}'])
def test_not_json(text: str) -> None:
    """CONTRACT: every message value is one UTF-8 JSON object (NaN/Infinity are not JSON)."""
    assert rejected(text).startswith("not JSON")
    dl = one_dead_letter(Run(), text)
    assert dl["value"] == text
    assert dl["value_encoding"] == "utf-8"


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("[1, 2]", "array"),
        ('"x"', "string"),
        ("3", "integer"),
        ("1.5", "number with a fraction"),
        ("null", "null"),
        ("true", "boolean"),
    ],
)
def test_not_an_object(text: str, name: str) -> None:
    """CONTRACT: every message value is one JSON *object*."""
    assert rejected(text) == f"not an object: the value is a JSON {name}"


def test_null_value_is_dead_lettered() -> None:
    """CONTRACT Dead letters: nothing that arrives is silently lost (a tombstone/null value included)."""
    dl = one_dead_letter(Run(), None)
    assert dl["error"].startswith("empty message")
    assert dl["value"] is None


def test_unknown_type() -> None:
    """CONTRACT: an unknown `type` sends the message to the dead-letter topic."""
    assert rejected(json.dumps(hb(type="reader_opened"))) == "unknown type 'reader_opened'"
    long = "x" * 500
    error = rejected(json.dumps(hb(type=long)))
    assert error.startswith("unknown type") and len(error) < 100, "the reason stays short for a huge type"


@pytest.mark.parametrize("v", [0, 2, -1, 10**30])
def test_unsupported_v(v: int) -> None:
    """CONTRACT Events: common field `v` (int, 1)."""
    assert rejected(json.dumps(hb(v=v))).startswith(f"unsupported v {v}")


@pytest.mark.parametrize(("v", "name"), [("1", "string"), (1.0, "number with a fraction"), (True, "boolean"), (None, "null")])
def test_mistyped_v(v: Any, name: str) -> None:
    """CONTRACT Events: `v` is an int; 1.0 and true are not."""
    assert rejected(json.dumps(hb(v=v))) == f"mistyped field v: expected integer, got {name}"


def test_missing_v_and_type() -> None:
    """CONTRACT: a missing required field sends the message to the dead-letter topic."""
    assert rejected(json.dumps(hb(v=...))) == "missing field v (contract version)"
    assert rejected(json.dumps(hb(type=...))) == "missing field type"
    assert rejected(json.dumps(hb(type=7))) == "mistyped field type: expected string, got integer"


@pytest.mark.parametrize("field", ["node", "incarnation", "seq", "wall_ms", "mvcc_now"])
def test_missing_required_field(field: str) -> None:
    """CONTRACT: a missing required field dead-letters (node events carry node, incarnation, seq; all carry wall_ms)."""
    error = rejected(json.dumps(hb(**{field: ...})))
    assert error.startswith("invalid heartbeat: missing field")
    assert field in error


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"type": "reader_open", "reader_id": "r"}, "read_ts"),
        ({"type": "reader_close"}, "reader_id"),
        ({"type": "tx_begin", "tx_id": "t"}, "begin_ts"),
        ({"type": "tx_prepare", "tx_id": "t", "coordinator": "n1"}, "participants"),
        ({"type": "tx_end", "tx_id": "t"}, "outcome"),
        ({"type": "snapshot", "cut": 1, "readers": []}, "txs"),
    ],
)
def test_missing_type_specific_field(event: dict[str, Any], field: str) -> None:
    """CONTRACT Events table: each type's own fields are required (opt. ones aside)."""
    ev = hb(mvcc_now=...) | event
    error = rejected(json.dumps(ev))
    assert error.startswith(f"invalid {event['type']}: missing field") and field in error


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"type": "topology", "version": 1}, "nodes"),
        ({"type": "catalog", "version": 1, "catalog_version": 3}, "activated_at"),
        ({"type": "index_build", "version": 1, "index": "i", "catalog_version": 3}, "state"),
        ({"type": "rebalance", "version": 1, "group": "g", "state": "started"}, "catalog_version"),
        ({"type": "catalog", "catalog_version": 3, "activated_at": 5}, "version"),
    ],
)
def test_missing_cluster_event_field(event: dict[str, Any], field: str) -> None:
    """CONTRACT Cluster events carry `version` and their own fields."""
    ev = {"v": 1, "wall_ms": 1000} | event
    error = rejected(json.dumps(ev))
    assert error.startswith(f"invalid {event['type']}: missing field") and field in error


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", 1.0),  # a float where an int is required, even with no fraction
        ("seq", 1.5),
        ("seq", 1e3),
        ("seq", True),  # a boolean is not an int on the wire
        ("incarnation", False),
        ("wall_ms", "1000"),
        ("mvcc_now", 5.0),
        ("mvcc_now", None),
        ("node", 7),
        ("node", ["n1"]),
        ("pinned_bytes", 1.25),
        ("groups", {"group": "g"}),
        ("groups", [{"group": "g", "leader": 1}]),
        ("groups", [{"group": "g", "published_min_tx_time": 1.5}]),
        ("groups", [{"group": "g", "published_min_tx_time": True}]),
        ("groups", [{"leader": True}]),
    ],
)
def test_mistyped_field(field: str, value: Any) -> None:
    """CONTRACT: a wrong type dead-letters: floats and booleans are not ints."""
    error = rejected(json.dumps(hb(**{field: value})))
    assert error.startswith("invalid heartbeat:"), error


@pytest.mark.parametrize(
    "changes",
    [
        {"type": "reader_open", "reader_id": "r", "read_ts": 2.0},
        {"type": "reader_open", "reader_id": 5, "read_ts": 2},
        {"type": "reader_open", "reader_id": "r", "read_ts": 2, "groups": "g1"},
        {"type": "tx_begin", "tx_id": "t", "begin_ts": False},
        {"type": "tx_end", "tx_id": "t", "outcome": "maybe"},
        {"type": "tx_end", "tx_id": "t", "outcome": "commit", "commit_ts": 3.5},
        {"type": "tx_prepare", "tx_id": "t", "coordinator": "n1", "participants": "n1"},
        {"type": "snapshot", "cut": 1, "readers": [{"reader_id": "r", "read_ts": 1.5}], "txs": []},
        {"type": "snapshot", "cut": 1, "readers": [], "txs": [{"tx_id": "t"}]},
    ],
)
def test_mistyped_node_event_fields(changes: dict[str, Any]) -> None:
    """CONTRACT Events table: field types per event type."""
    ev = hb(mvcc_now=...) | changes
    assert rejected(json.dumps(ev)).startswith(f"invalid {changes['type']}:")


@pytest.mark.parametrize(
    "event",
    [
        {"type": "topology", "version": 1, "nodes": ["n1"]},
        {"type": "topology", "version": 1, "nodes": {"n1": "g1"}},
        {"type": "topology", "version": 1.0, "nodes": {}},
        {"type": "catalog", "version": 1, "catalog_version": 3, "activated_at": 1.5},
        {"type": "index_build", "version": 1, "index": "i", "catalog_version": 3, "state": "done"},
        {"type": "rebalance", "version": True, "group": "g", "catalog_version": 3, "state": "started"},
        {"type": "catalog", "version": 1, "catalog_version": 3, "activated_at": 5, "cluster": 9},
        {"type": "catalog", "version": 1, "catalog_version": 3, "activated_at": 5, "cluster": ""},
    ],
)
def test_mistyped_cluster_event_fields(event: dict[str, Any]) -> None:
    """CONTRACT Cluster events table: field types; `cluster` is a (non-empty) string."""
    ev = {"v": 1, "wall_ms": 1000} | event
    assert rejected(json.dumps(ev)).startswith(f"invalid {event['type']}:")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", -1),  # CONTRACT: seq (int >= 0)
        ("incarnation", -1),  # CONTRACT: incarnation (int >= 0)
        ("wall_ms", -5),  # ms since the Unix epoch
        ("wall_ms", 10**17),  # absurd: far beyond year 3000
        ("mvcc_now", INT64_MAX + 1),  # CONTRACT Time: signed 64-bit integers
        ("mvcc_now", INT64_MIN - 1),
        ("seq", 10**40),
        ("pinned_bytes", -1),
    ],
)
def test_out_of_range_values(field: str, value: int) -> None:
    """CONTRACT Events: ints >= 0 where stated; MVCC timestamps are signed 64-bit."""
    error = rejected(json.dumps(hb(**{field: value})))
    assert error.startswith("invalid heartbeat: out of range"), error


def test_int64_bounds_are_accepted() -> None:
    """CONTRACT Time: MVCC timestamps are opaque signed 64-bit integers (the extremes are valid)."""
    for ts in (INT64_MIN, INT64_MAX, -5, 0):
        assert not isinstance(parse(json.dumps(hb(mvcc_now=ts)), 1 << 20), Rejected)


def test_oversized_message_bytes_and_text() -> None:
    """Policy max_message_bytes: larger input messages go to the dead-letter topic, measured in bytes."""
    ev = hb(label="x" * 200)
    text = json.dumps(ev)
    limit = len(text.encode()) - 1
    assert rejected(text.encode(), limit).startswith("oversized message")
    assert rejected(text, limit).startswith("oversized message")
    assert not isinstance(parse(text, limit + 1), Rejected)
    # multi-byte characters count as bytes, not characters
    wide = json.dumps(hb(label="é" * 100), ensure_ascii=False)
    assert len(wide) < len(wide.encode())
    assert rejected(wide, len(wide)).startswith("oversized message")
    assert not isinstance(parse(wide, len(wide.encode())), Rejected)

    run = Run(max_message_bytes=limit)
    dl = one_dead_letter(run, text.encode())
    assert dl["value"] == text, "the dead letter still carries the original text"


def test_deeply_nested_json_is_dead_lettered() -> None:
    """docs/contract.md, Outputs (dead letters): bad input never kills the query (docs/contributing.md, rule 6)."""
    text = "[" * 100_000 + "]" * 100_000
    assert rejected(text, 1 << 20).startswith("not JSON")


def test_unknown_fields_are_ignored() -> None:
    """CONTRACT: Unknown fields are ignored (forward compatibility)."""
    ev = hb(future_field={"nested": [1, 2.5, None]}, another=1.5)
    parsed = parse(json.dumps(ev), 1 << 20)
    assert not isinstance(parsed, Rejected)
    run = Run()
    assert run.feed(ev) == []
    assert run.counts == {"applied": 1}
    snap = NodeClient("n2").snapshot(1000, readers=[{"reader_id": "r", "read_ts": 3, "x": 1.5}], txs=[])
    assert not isinstance(parse(json.dumps(snap), 1 << 20), Rejected)


def test_cluster_defaults_to_default() -> None:
    """CONTRACT Events: `cluster` (string, default "default")."""
    parsed = parse(json.dumps(hb()), 1 << 20)
    assert isinstance(parsed, dict) and parsed["cluster"] == "default"
    parsed = parse(json.dumps(hb(cluster="c9")), 1 << 20)
    assert isinstance(parsed, dict) and parsed["cluster"] == "c9"
    run = Run()
    run.feed(hb())
    assert set(run.engine.clusters) == {"default"}
    assert set(run.engine.nodes) == {("default", "n1")}


def test_dead_letter_names_position_and_key() -> None:
    """CONTRACT Dead letters: {"v", "error", "topic", "partition", "offset", "key", "value"}."""
    run = Run()
    run.feed(hb())
    dl = one_dead_letter(run, '{"v": 1, "type": "heartbeat"}', key="node-7")
    assert dl["offset"] == 1
    assert dl["key"] == "node-7"
    assert dl["value"] == '{"v": 1, "type": "heartbeat"}'
    assert dl["error"].startswith("invalid heartbeat: missing field")
    assert run.counts == {"applied": 1, "deadlettered": 1}


def test_dead_letter_does_not_touch_state() -> None:
    """CONTRACT Dead letters: a dead-lettered event is not applied (here: its seq is not consumed)."""
    run = Run()
    run.feed(hb(seq=0))
    run.raw(json.dumps(hb(seq=1, mvcc_now=1.5)))
    assert run.feed(hb(seq=1, mvcc_now=7)) == []
    assert run.counts == {"applied": 2, "deadlettered": 1}
    assert run.engine.nodes[("default", "n1")].mvcc_now == 7


def test_policy_rejects_bad_values() -> None:
    """Policy: integers >= 0, node_lease_ms > 0 (a misconfiguration fails fast, not silently)."""
    for bad in ({"retention": -1}, {"node_lease_ms": 0}, {"retention": 1.5}, {"directive_interval_ms": True}):
        with pytest.raises(ValueError, match="policy key"):
            Policy(**bad)
    assert Policy.from_dict({"retention": 5, "unknown": 1}).retention == 5
    assert Policy().node_lease_ms == 30_000, "CONTRACT Operator interface: node_lease_ms default 30000"
    assert Policy().retention == 0, "CONTRACT Operator interface: retention default 0"
