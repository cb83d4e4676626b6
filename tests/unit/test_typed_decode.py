"""benchmarks/bench_typed.py, the benchmark's probe of a typed decode: its one decoder is sure,
never wrong, so that what the probe times is a decode the core could take. Whatever it decodes, the
reference parser (``json``'s decoder and the schema's full validator) accepts too, with the same
fields and values of the same types (a ``True`` is not a ``1`` here, as it is to ``==``); what it
refuses, ``parse`` decides the old way. The commonest events all have a struct."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safepoint.core.events import Rejected, parse
from safepoint.schemas import NODE_EVENT_TYPES, load

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_typed import DECODER, TYPED, to_record, typed_decode_cost  # noqa: E402
from test_fuzz import _boundaries, _paths, _with, boundary_events, mutated_events, valid_events

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
MAX = 1 << 20


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same type all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def sure_or_refused(raw: bytes) -> bool:
    """True when the typed decoder took ``raw``: then exactly what the reference gives."""
    try:
        record = to_record(DECODER.decode(raw))
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return False
    ref = parse(raw, MAX, reference=True)
    assert not isinstance(ref, Rejected), (raw, ref)
    if "cluster" not in record:  # the edge's default, which parse sets after either decode
        ref.pop("cluster")
    assert same(record, dict(ref)), (raw, record, ref)
    assert list(record)[0] == "type"
    return True


def test_every_node_event_and_the_control_events_have_a_struct() -> None:
    assert set(NODE_EVENT_TYPES) <= set(TYPED)
    assert {"service_hold", "service_release", "pause", "resume", "gap_ack"} <= set(TYPED)


def test_every_valid_example_is_decoded_and_every_invalid_one_refused() -> None:
    took = 0
    for path in sorted((EXAMPLES / "valid").glob("*.json")):
        event = json.loads(path.read_text())
        took += sure_or_refused(json.dumps(event).encode())
        assert sure_or_refused(json.dumps({**event, "log_ms": 5}).encode()) is False, "a field no schema names"
    assert took == len([p for p in (EXAMPLES / "valid").glob("*.json") if p.stem in TYPED])
    for case in json.loads((EXAMPLES / "invalid.json").read_text()):
        if isinstance(case.get("value"), str):
            assert sure_or_refused(case["value"].encode()) is False, case


def test_at_every_bound_of_every_field_it_is_sure_or_refuses() -> None:
    """Each valid example with one value anywhere set at and just past each bound of its schema, and
    to the wrong types: decoded only where the reference accepts, then the same record."""
    took = refused = 0
    for raw in at_every_bound(set(TYPED)):
        if sure_or_refused(raw):
            took += 1
        else:
            refused += 1
            assert parse(raw, MAX) == parse(raw, MAX, reference=True), raw
    assert took > 200 and refused > 500, (took, refused)


def at_every_bound(types: set[str]) -> Iterator[bytes]:
    """Each valid example of ``types`` with one value anywhere set at and just past each bound of
    its schema, and to the wrong types."""
    for path in sorted((EXAMPLES / "valid").glob("*.json")):
        event = json.loads(path.read_text())
        if event["type"] in types:
            for where, schema in _paths(event, load("events", event["type"])):
                for value in _boundaries(schema):
                    yield json.dumps(_with(event, where, value)).encode()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=st.one_of(st.builds(json.dumps, valid_events), mutated_events(), boundary_events()))
def test_generated_events_are_decoded_exactly_or_refused(text: str) -> None:
    sure_or_refused(text.encode("utf-8", "surrogatepass"))


@pytest.mark.parametrize("raw", [b'{"v":1,"type":"reader_close","node":"n1","incarnation":0,"seq":1,"wall_ms":1,'
                                 b'"reader_id":"r","reader_id":"s"}',
                                 b'{"type":"reader_close","v":1,"node":"n1","incarnation":0,"seq":1,"wall_ms":1,'
                                 b'"reader_id":"r"}'])
def test_a_repeated_field_and_the_wire_order(raw: bytes) -> None:
    """A repeated field's last value, as ``json``'s; the tag wherever it is on the wire."""
    assert sure_or_refused(raw)


def test_the_probe_times_the_lines_it_decodes() -> None:
    lines = [json.dumps(json.loads(p.read_text())).encode() for p in sorted((EXAMPLES / "valid").glob("*.json"))]
    cost = typed_decode_cost([*lines, b'{"v":1,"type":"reader_close"}'], repeat=1)
    assert cost["events"] == len([p for p in (EXAMPLES / "valid").glob("*.json") if p.stem in TYPED])
    assert cost["refused"] == len(lines) + 1 - cost["events"]
    assert all(cost[f"{name}_us"] > 0 for name in ("parse", "typed", "typed_map"))
