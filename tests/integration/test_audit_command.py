"""``safepoint audit`` against the embedded broker: silent (exit 0) on the directives the core emits
for a log, and on a deliberately wrong directive (a safe point past a live reader) it prints the
violation, publishes an ``audit_violation`` alert and exits 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import Engine, Position
from safepoint.settings import load_settings

from kafka_util import produce, read_topic, unique

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def setup_topics(broker: Any) -> Any:
    prefix = unique("audit")
    settings = load_settings(None, {"bootstrap": broker.bootstrap, "events_topic": f"{prefix}.events", "control_topic": f"{prefix}.control",
                                    "directives_topic": f"{prefix}.directives", "alerts_topic": f"{prefix}.alerts",
                                    "deadletter_topic": f"{prefix}.dl", "status_topic": f"{prefix}.status",
                                    "events_partitions": 1})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 1, log_append_time=False))
    return settings


def core_directives(events: list[dict[str, Any]], policy: Any) -> list[dict[str, Any]]:
    engine = Engine(policy)
    out = []
    for i, ev in enumerate(events):
        for o in engine.process(json.dumps(ev), Position("ev", 0, i, None)):
            if o.channel == "directives" and o.value["type"] == "compaction":
                out.append(o.value)
    return out


def audit(settings: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "safepoint.cli", "audit", "--bootstrap", settings.bootstrap, "--until-idle", "3",
         "--events-topic", settings.events_topic, "--control-topic", settings.control_topic,
         "--directives-topic", settings.directives_topic,
         "--alerts-topic", settings.alerts_topic],
        capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("wrong", [False, True])
def test_the_auditor_is_silent_on_the_core_and_catches_a_wrong_safe_point(broker: Any, wrong: bool) -> None:
    d = ROOT / "examples" / "worked-example"
    policy = load_settings(str(d / "safepoint.toml"), {}).policy()
    events = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines() if x.strip()]
    events = [e for e in events if isinstance(e, dict) and e.get("v") == 1 and "type" in e]
    directives = core_directives(events, policy)
    assert len(directives) >= 2
    if wrong:  # the first directive passes the lowest hold it was made with: a wrong safe point
        first = directives[0]
        directives[0] = {**first, "safe_ts": first["safe_ts"] + 1_000_000_000}
    settings = setup_topics(broker)
    produce(settings.bootstrap, settings.events_topic, [(str(e.get("node") or e.get("cluster", "default")), e)
                                                         for e in events])
    produce(settings.bootstrap, settings.directives_topic, [(x["cluster"], x) for x in directives])
    proc = audit(settings)
    last = proc.stdout.strip().splitlines()[-1]
    assert f"{len(directives)} directives checked" in last, proc.stdout + proc.stderr
    alerts = [a for a in read_topic(settings.bootstrap, settings.alerts_topic, timeout_s=5) if a["kind"] == "audit_violation"]
    if not wrong:
        assert proc.returncode == 0 and "0 violation(s)" in last, proc.stdout + proc.stderr
        assert alerts == []
        return
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "audit: VIOLATION" in proc.stdout and "passed" in proc.stdout, proc.stdout
    assert alerts and alerts[0]["severity"] == "critical" and alerts[0]["state"] == "raised", alerts
