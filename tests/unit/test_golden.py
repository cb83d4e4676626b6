"""The golden files in schemas/examples/: valid events validate and parse, invalid ones are
dead-lettered with their class and text, and replay reproduces the worked example exactly."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import jsonschema
import pytest

from safepoint.core.events import DEADLETTER_CODES, Rejected, parse
from safepoint.replay import replay_file
from safepoint.schemas import EVENT_TYPES, load
from safepoint.settings import load_settings

EXAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "examples"
MAX = 1 << 20


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_every_event_type_has_a_valid_example(event_type: str) -> None:
    event = json.loads((EXAMPLES / "valid" / f"{event_type}.json").read_text())
    jsonschema.Draft7Validator(load("events", event_type)).validate(event)
    parsed = parse(json.dumps(event).encode(), MAX)
    assert not isinstance(parsed, Rejected), parsed
    assert parsed["type"] == event_type


def test_every_invalid_example_is_dead_lettered_with_its_class() -> None:
    cases = json.loads((EXAMPLES / "invalid.json").read_text())
    assert {c["class"] for c in cases} == set(DEADLETTER_CODES), "every dead-letter class has an example"
    for case in cases:
        if "value_base64" in case:
            raw: bytes | None = base64.b64decode(case["value_base64"])
        elif "value_of_size" in case:
            raw = b'{"pad": "' + b"x" * (case["value_of_size"] - 11) + b'"}'
            assert len(raw) == case["value_of_size"]
        else:
            raw = None if case["value"] is None else case["value"].encode()
        got = parse(raw, MAX)
        assert isinstance(got, Rejected), case["name"]
        assert (got.code, got.error) == (case["class"], case["error"]), case["name"]


def test_replay_reproduces_the_worked_example() -> None:
    d = EXAMPLES / "worked-example"
    policy = load_settings(d / "safepoint.toml", environ={}).policy()
    out, dead = io.StringIO(), io.StringIO()
    replay_file(str(d / "events.jsonl"), out, policy, dead)
    assert out.getvalue().splitlines() == (d / "expected.jsonl").read_text().splitlines()

    def no_topic(lines: list[str]) -> list[dict[str, object]]:
        return [{k: v for k, v in json.loads(x).items() if k != "topic"} for x in lines]

    assert no_topic(dead.getvalue().splitlines()) == no_topic((d / "expected-deadletter.jsonl").read_text().splitlines())
    kinds = [json.loads(x)["type"] for x in out.getvalue().splitlines()]
    assert kinds.count("compaction") == 6 and "alert" in kinds
