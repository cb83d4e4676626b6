"""The events' typed records (``core/event_records.py``) and the alerts' kinds (``core/alert_kinds.py``)
are the schemas' own: the generator writes them from ``schemas/``, a schema changed without them
fails here, and what the parser returns for each golden event is the record its type names (its
required fields there, each declared field of the declared kind)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType, UnionType
from typing import Any, Literal, NotRequired, get_args, get_origin

import pytest

from safepoint.core import event_records
from safepoint.core.events import Rejected, parse
from safepoint.schemas import EVENT_TYPES

from doc_blocks import block

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_event_records.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_event_records", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_alert_kinds_are_the_schemas() -> None:
    from safepoint.core.alert_kinds import AlertKind, Severity
    from safepoint.schemas import ALERT_KINDS, load

    assert get_args(AlertKind) == ALERT_KINDS
    assert get_args(Severity) == tuple(load("outputs", "alert")["properties"]["severity"]["enum"])


def test_the_records_are_written_from_the_schemas() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_developers_page_writes_the_records_and_checks_the_rules() -> None:
    """``docs/development.md``'s two lines: the generator (run here with the ``--check`` its comment
    names, so that the test writes nothing under the other tests' feet) and the type check, which the
    test command runs (``scripts/test.sh``)."""
    text = block("docs/development.md", ".venv/bin/python scripts/gen_event_records.py").text
    generate, typecheck = [line.split("#")[0].strip() for line in text.splitlines()]
    argv = shlex.split(generate)
    assert argv[0] == ".venv/bin/python" and "--check" in text
    done = subprocess.run([sys.executable, *argv[1:], "--check"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert typecheck in (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")


def test_a_schema_changed_without_its_record_is_caught(tmp_path: Path) -> None:
    gen = generator()
    schemas = tmp_path / "events"
    shutil.copytree(ROOT / "schemas" / "events", schemas)
    reader_open = json.loads((schemas / "reader_open.json").read_text())
    reader_open["properties"]["priority"] = {"type": "integer", "minimum": 0}
    reader_open["required"].append("priority")
    (schemas / "reader_open.json").write_text(json.dumps(reader_open))
    gen.SCHEMAS = schemas
    text = gen.render()
    assert "    priority: int\n" in text
    assert text != (ROOT / "src" / "safepoint" / "core" / "event_records.py").read_text(encoding="utf-8")


def _conforms(value: Any, hint: Any) -> bool:
    """``value`` is of the kind ``hint`` declares (nested records by their own fields)."""
    origin = get_origin(hint)
    if origin is NotRequired:
        return _conforms(value, get_args(hint)[0])
    if origin in (UnionType, typing.Union):
        return any(_conforms(value, h) for h in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, get_args(hint)[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(v, get_args(hint)[1]) for v in value.values())
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if typing.is_typeddict(hint):
        return isinstance(value, dict) and _record_errors(value, hint) == []
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _record_errors(value: dict[str, Any], record: Any) -> list[str]:
    hints = typing.get_type_hints(record, include_extras=True)
    missing = sorted(record.__required_keys__ - value.keys())
    wrong = sorted(k for k, h in hints.items() if k in value and not _conforms(value[k], h))
    return [f"missing {k}" for k in missing] + [f"{k} is not {hints[k]}" for k in wrong]


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_each_golden_event_parses_into_the_record_of_its_type(event_type: str) -> None:
    raw = json.loads((ROOT / "schemas" / "examples" / "valid" / f"{event_type}.json").read_text())
    parsed = parse(json.dumps(raw).encode(), 1 << 20)
    assert not isinstance(parsed, Rejected), parsed
    record = event_records.BY_TYPE[event_type]
    assert _record_errors(dict(parsed), record) == []
    assert _record_errors({k: v for k, v in parsed.items() if k != "cluster"}, record) == ["missing cluster"], (
        "the edge sets cluster where the message leaves it out: the record requires it")


def test_the_unions_cover_every_type_once() -> None:
    def names(union: Any) -> set[str]:
        return {r.__name__ for r in get_args(union)}

    node, cluster, control = names(event_records.NodeEvent), names(event_records.ClusterEvent), names(event_records.ControlEvent)
    assert node | cluster == names(event_records.Event) == {r.__name__ for r in event_records.BY_TYPE.values()}
    assert not node & cluster and control <= cluster
    assert len(event_records.BY_TYPE) == len(EVENT_TYPES)
