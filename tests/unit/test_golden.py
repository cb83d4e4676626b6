"""The golden files in schemas/examples/: valid events validate and parse, invalid ones are
dead-lettered with their class and text; replay reproduces every example log of examples/
exactly, and the README's replay command (taken from the doc) prints the worked example's."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from safepoint.core.events import DEADLETTER_CODES, Rejected, parse
from safepoint.replay import replay_file
from safepoint.schemas import EVENT_TYPES, load
from safepoint.settings import load_settings

from doc_blocks import block

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "schemas" / "examples"
LOGS = ROOT / "examples"
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


def test_the_fast_parser_gives_the_reference_verdict_on_every_golden_message() -> None:
    """msgspec's decoder and the quick schema test against ``json`` and the full validator."""
    values: list[bytes | None] = [json.dumps(json.loads(p.read_text())).encode() for p in sorted((EXAMPLES / "valid").glob("*.json"))]
    for case in json.loads((EXAMPLES / "invalid.json").read_text()):
        if "value_base64" in case:
            values.append(base64.b64decode(case["value_base64"]))
        elif "value" in case:
            values.append(None if case["value"] is None else case["value"].encode())
    for d in LOGS.iterdir():
        if (d / "events.jsonl").exists():
            values += (d / "events.jsonl").read_bytes().splitlines()
    assert len(values) > 150
    for raw in values:
        assert parse(raw, MAX) == parse(raw, MAX, reference=True), raw


def test_the_fast_parser_gives_the_reference_verdict_at_every_bound_of_every_field() -> None:
    """Each valid example with one value anywhere in it (a field, an array item, an item's field)
    set at and just past each bound its schema sets, and to the wrong types: every case exhaustively."""
    from test_fuzz import _boundaries, _paths, _with

    cases = 0
    for path in sorted((EXAMPLES / "valid").glob("*.json")):
        event = json.loads(path.read_text())
        for where, schema in _paths(event, load("events", event["type"])):
            for value in _boundaries(schema):
                raw = json.dumps(_with(event, where, value)).encode()
                assert parse(raw, MAX) == parse(raw, MAX, reference=True), (path.name, where, value)
                cases += 1
    assert cases > 1_000


def test_replay_reproduces_the_worked_example() -> None:
    d = LOGS / "worked-example"
    policy = load_settings(d / "safepoint.toml", environ={}).policy()
    out, dead = io.StringIO(), io.StringIO()
    replay_file(str(d / "events.jsonl"), out, policy, dead)
    assert out.getvalue().splitlines() == (d / "expected.jsonl").read_text().splitlines()

    def no_topic(lines: list[str]) -> list[dict[str, object]]:
        return [{k: v for k, v in json.loads(x).items() if k != "topic"} for x in lines]

    assert no_topic(dead.getvalue().splitlines()) == no_topic((d / "expected-deadletter.jsonl").read_text().splitlines())
    kinds = [json.loads(x)["type"] for x in out.getvalue().splitlines()]
    assert kinds.count("compaction") == 6 and "alert" in kinds


def replayed(d: Path) -> list[dict[str, object]]:
    policy = load_settings(d / "safepoint.toml", environ={}).policy()
    out = io.StringIO()
    replay_file(str(d / "events.jsonl"), out, policy, io.StringIO())
    return [json.loads(x) for x in out.getvalue().splitlines()]


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.iterdir() if (p / "events.jsonl").exists()))
def test_every_example_log_replays_to_its_expected_output(name: str) -> None:
    d = LOGS / name
    assert replayed(d) == [json.loads(x) for x in (d / "expected.jsonl").read_text().splitlines()]
    assert name in (LOGS / "README.md").read_text(), "examples/README.md says what each example shows"


def test_the_backup_example_shows_what_it_says() -> None:
    out = replayed(LOGS / "backup-hold")
    blockers = {(d["blocker"]["kind"], d["blocker"]["id"]) for d in out if d["type"] == "compaction"}  # type: ignore[index]
    assert {("service", "backup"), ("service", "cdc")} <= blockers
    raised = [d["kind"] for d in out if d["type"] == "alert" and d["state"] == "raised"]
    assert {"service_hold_refused", "paused", "service_hold_expired"} <= set(raised)
    paused = [i for i, d in enumerate(out) if d["type"] == "alert" and d["kind"] == "paused"]
    during = [d for d in out[paused[0]:paused[1]] if d["type"] == "compaction"]
    # the pause itself rides on one directive at the same safe point (a job that loses its
    # checkpoint stays paused); no directive advances until the resume
    assert [d["paused"]["reason"] for d in during] == ["restore of table orders"]  # type: ignore[index]
    before = [d["safe_ts"] for d in out[:paused[0]] if d["type"] == "compaction"]
    assert during[0]["safe_ts"] == before[-1], "no directive advances while paused"


def test_the_tenants_example_shows_what_it_says() -> None:
    out = [d for d in replayed(LOGS / "tenants") if d["type"] == "compaction"]
    held = [d for d in out if d.get("namespaces", {}).get("a") is not None]  # type: ignore[union-attr]
    assert held and any(d["namespace_safe_ts"] > d["namespaces"]["a"] + 30_000 for d in held)  # type: ignore[index, operator]
    assert out[-1]["namespaces"] == {} and out[-1]["safe_ts"] == out[-1]["namespace_safe_ts"]


def test_the_pressure_example_is_what_its_script_writes_and_shows_what_it_says() -> None:
    """The log is the closed loop of examples/pressure/make_log.py (the node client's admission
    control fed with the core's directives); replayed it shows each step of the story."""
    spec = importlib.util.spec_from_file_location("make_log", LOGS / "pressure" / "make_log.py")
    assert spec is not None and spec.loader is not None
    make_log = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_log)
    log = make_log.simulate()
    assert [json.loads(x) for x in (LOGS / "pressure" / "events.jsonl").read_text().splitlines()] == log
    out = replayed(LOGS / "pressure")
    story = [(d["kind"], d["state"], d.get("severity")) if d["type"] == "alert" else (d["type"], d.get("band"))
             for d in out if d["type"] in ("alert", "band", "expire")]
    assert story == [
        ("pressure_forecast", "raised", "warning"),
        ("band", "warning"), ("pinned_bytes", "raised", "warning"),
        ("band", "critical"), ("pinned_bytes", "raised", "critical"), ("pressure_forecast", "cleared", "warning"),
        ("emergency", "raised", "critical"),
        ("expire", None), ("forced_expiry", "raised", "warning"), ("forced_expiry", "cleared", "warning"),
        ("band", "normal"), ("pinned_bytes", "cleared", "critical"),
        ("emergency", "cleared", "critical"),
    ], story
    beats = [e for e in log if e["type"] == "heartbeat"]
    assert beats[-1]["admission_throttled"] > 0 and beats[-1]["admission_refused"] > 0
    critical = [e for e in log if e["type"] == "reader_open" and 220_000 < e["wall_ms"] - make_log.T0 < 250_000]
    assert critical and all(e["label"] == "point read" for e in critical), "short reads go on; no long one is admitted"
    costs = [d["blocker"].get("cost_bytes") for d in out if d["type"] == "compaction" and d["blocker"]]
    assert any(c and c > 500_000_000 for c in costs), "the report's cost rides on the directives"


def test_the_docs_replay_command_prints_the_worked_example() -> None:
    readme = block("README.md", ".venv/bin/safepoint replay --config examples/").text.strip()
    assert block("examples/README.md", ".venv/bin/safepoint replay --config examples/").text.strip() == readme
    argv = shlex.split(readme)
    argv[0] = str(Path(sys.executable).parent / "safepoint")
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = (LOGS / "worked-example" / "expected.jsonl").read_text().splitlines()
    assert proc.stdout.splitlines() == expected
    assert "final safe_ts {'c1': 4900}" in proc.stderr and "missing_field 1" in proc.stderr
