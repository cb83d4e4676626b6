"""The example node of each native client (``clients/go/example/node``, the Java client's ExampleNode),
run as its README says against the broker for a few seconds: it reports its long report reader, a
stream of short transactions and heartbeats, ends cleanly, and what it published is what
``safepoint check-node`` accepts."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from safepoint.cli import main as cli

from kafka_util import read_topic, unique

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EVENTS = "safepoint.events"
"""The examples publish to the default topics."""


def example_command(language: str, tmp_path: Path) -> list[str]:
    if language == "go":
        binary = tmp_path / "node"
        subprocess.run(["go", "build", "-o", str(binary), "./example/node"], cwd=ROOT / "clients" / "go",  # noqa: S607
                       check=True, capture_output=True, timeout=300)
        return [str(binary)]
    jar = next((ROOT / "clients" / "java" / "example" / "target").glob("safepoint-example-*.jar"), None)
    assert jar is not None, "the Java client's example is built (setup, or mvn package in clients/java)"
    return ["java", "-jar", str(jar)]


@pytest.mark.parametrize("language", ["go", "java"])
def test_the_example_node_runs(broker: Any, tmp_path: Path, language: str, capsys: pytest.CaptureFixture[str]) -> None:
    cluster, node = unique("examples"), f"{language}-1"
    command = example_command(language, tmp_path)
    done = subprocess.run([*command, "-bootstrap", broker.bootstrap, "-cluster", cluster, "-node", node, "-for", "4s"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    events = [e for e in read_topic(broker.bootstrap, EVENTS) if e.get("cluster") == cluster]
    kinds = Counter(e["type"] for e in events)
    assert kinds["reader_open"] == 1 and kinds["reader_close"] == 1, kinds
    assert kinds["tx_begin"] >= 10 and kinds["tx_begin"] == kinds["tx_end"], kinds
    assert kinds["heartbeat"] >= 2, kinds
    report = next(e for e in events if e["type"] == "reader_open")
    assert report["label"] == "nightly report" and report["node"] == node
    assert [e["seq"] for e in events] == list(range(len(events))), "one partition, seq from 0 without a gap"
    assert cli(["check-node", "--bootstrap", broker.bootstrap, "--events-topic", EVENTS, "--cluster", cluster,
                "--node", node, "--from-beginning", "--duration", "1"]) == 0, capsys.readouterr().out[-2000:]
