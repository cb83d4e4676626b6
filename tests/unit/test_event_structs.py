"""``core/event_structs.py``, the hold events as structs, and the quiet path that reads them
(``Engine.process_at``, ``ClusterState.take_quiet_typed``). Its decoder is sure, never wrong:
whatever ``typed_event`` decodes, ``parse`` accepts with the same fields and values of the same
types (a ``True`` is not a ``1`` here); what it refuses, ``parse`` decides. And a log through the
structs gives, byte for byte, what the same log gives through the maps alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safepoint.core.codec import encode
from safepoint.core.engine import Engine
from safepoint.core.event_structs import TYPE_OF
from safepoint.core.events import Rejected, parse, typed_event
from safepoint.core.holds import KINDS
from safepoint.core.policy import Policy
from safepoint.replay import final_status
from safepoint.schemas import EVENT_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_workload import build_workload  # noqa: E402
from gen_event_records import STRUCT_TYPES  # noqa: E402
from test_fuzz import boundary_events, mutated_events, valid_events
from test_typed_decode import at_every_bound, same

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
MAX = 1 << 20


def sure_or_refused(raw: bytes) -> bool:
    """True when ``typed_event`` took ``raw``: then exactly the fields ``parse`` gives."""
    typed = typed_event(raw, MAX)
    if typed is None:
        return False
    ref = parse(raw, MAX, reference=True)
    assert not isinstance(ref, Rejected), (raw, ref)
    fields = {k: v for k, v in msgspec.structs.asdict(typed).items() if v is not msgspec.UNSET}
    assert same({"type": TYPE_OF[type(typed)], **fields}, {"type": ref.pop("type"), **ref}), (raw, fields, ref)
    return True


def test_the_structs_are_the_built_in_kinds_openings_and_closings() -> None:
    assert set(STRUCT_TYPES) == set(TYPE_OF.values()) == {e for k in KINDS[:2] for e in (k.opens, k.closes)}
    assert {k.name for k in KINDS[:2]} == {"reader", "tx"}


def test_every_valid_example_is_decoded_or_left_to_parse_and_every_invalid_one_refused() -> None:
    took = 0
    for path in sorted((EXAMPLES / "valid").glob("*.json")):
        event = json.loads(path.read_text())
        took += sure_or_refused(json.dumps(event).encode())
        assert sure_or_refused(json.dumps({**event, "log_ms": 5}).encode()) is False, "a field no schema names"
    assert took == len([p for p in (EXAMPLES / "valid").glob("*.json") if p.stem in TYPE_OF.values()]) > 0
    for case in json.loads((EXAMPLES / "invalid.json").read_text()):
        if isinstance(case.get("value"), str):
            assert sure_or_refused(case["value"].encode()) is False, case


def test_at_every_bound_of_every_field_it_is_sure_or_refuses() -> None:
    took = refused = 0
    for raw in at_every_bound(set(STRUCT_TYPES)):
        if sure_or_refused(raw):
            took += 1
        else:
            refused += 1
    assert took > 50 and refused > 100, (took, refused)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=st.one_of(st.builds(json.dumps, valid_events), mutated_events(), boundary_events()))
def test_generated_events_are_decoded_exactly_or_refused(text: str) -> None:
    sure_or_refused(text.encode("utf-8", "surrogatepass"))


def test_what_parse_must_see_is_left_to_it() -> None:
    opening = {"v": 1, "type": "reader_open", "node": "n1", "incarnation": 0, "seq": 1, "wall_ms": 1,
               "reader_id": "r", "read_ts": 5}
    raw = json.dumps(opening).encode()
    assert typed_event(raw, MAX) is not None
    assert typed_event(raw.decode(), MAX) is None, "text: parse measures it in UTF-8"
    assert typed_event(raw, len(raw) - 1) is None, "oversized: parse dead-letters it"
    lone = json.dumps({**opening, "reader_id": "\ud800"}).encode()
    assert typed_event(lone, MAX) is None and isinstance(parse(lone, MAX), Rejected), "a lone surrogate"
    after = json.dumps({**opening, "label": 'a "b" c\\', "reader_id": "\ud800"}).encode()
    assert b'\\"' in after and typed_event(after, MAX) is None and isinstance(parse(after, MAX), Rejected), \
        "a lone surrogate after other escapes"
    plain = json.dumps({**opening, "label": 'a "b" c\\'}).encode()
    assert typed_event(plain, MAX) is not None, "escapes other than \\u"
    assert typed_event(json.dumps({**opening, "reader_id": "é"}).encode(), MAX) is None  # any \u escape
    assert typed_event(None, MAX) is None
    for event_type in sorted(set(EVENT_TYPES) - set(STRUCT_TYPES)):
        assert typed_event(json.dumps({"v": 1, "type": event_type}).encode(), MAX) is None, event_type


def _run(values: list[bytes | str]) -> tuple[list[str], dict[str, Any], dict[str, int]]:
    engine = Engine(Policy(), record=True)
    out = [encode(o.value) for offset, v in enumerate(values) for o in engine.process_at(v, "events.jsonl", 0, offset)]
    assert engine.outcomes is not None
    return out, final_status(engine), dict(engine.labels) | {"outcomes": len(engine.outcomes)}


@pytest.mark.parametrize("nodes", [3, 40])
def test_a_log_through_the_structs_gives_what_it_gives_through_the_maps(nodes: int) -> None:
    """The bench's workload, each message as bytes (a hold's opening or closing decoded as a struct,
    offered to the quiet path) and as text (parsed into a map, offered as a map): the same
    directives and alerts, the same status, the same accounting."""
    wl = build_workload("throughput", nodes, 2_000.0, seed=7, long_share=0.01, probe_hz=10.0, events=20_000)
    values = [v for _, _, v in wl.events]
    assert sum(typed_event(v, MAX) is not None for v in values) > len(values) // 2
    as_bytes, as_text = _run(list(values)), _run([v.decode() for v in values])
    assert as_bytes[0], "the log makes directives"
    assert as_bytes == as_text
