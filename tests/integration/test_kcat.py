"""The operator guide's "Publishing from another language" blocks, run as written (only the broker's
address replaced) with Debian's kcat and ``safepoint check-node``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core.events import parse
from safepoint.devtools.broker import EmbeddedBroker

from doc_blocks import block
from kafka_util import produce, read_topic
from observers import missing_tool

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:  # its own broker: the blocks use the default topic names
        yield broker


def run_block(block: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    cmd = block.replace("127.0.0.1:9092", bootstrap).replace("safepoint check-node", f"{sys.executable} -m safepoint.cli check-node")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120, check=False)


def test_the_guides_kcat_and_check_node_blocks(kafka: EmbeddedBroker) -> None:
    if shutil.which("kcat") is None:
        missing_tool("kcat is not installed")
    publish = block("docs/operations.md", "echo '{\"v\":1,\"type\":\"heartbeat\"").text
    latest = block("docs/operations.md", "kcat -C -b 127.0.0.1:9092").text
    check = block("docs/operations.md", "safepoint check-node --bootstrap").text
    topics = {"events": "safepoint.events", "directives": "safepoint.directives", "alerts": "safepoint.alerts",
              "deadletter": "safepoint.deadletter"}
    ensure_topics({"bootstrap.servers": kafka.bootstrap}, topic_specs(topics, 2, log_append_time=False))
    for seq in (1, 2):  # what the job would have written
        produce(kafka.bootstrap, topics["directives"], [("c1", {"v": 1, "type": "compaction", "cluster": "c1", "seq": seq})])

    proc = run_block(publish, kafka.bootstrap)
    assert proc.returncode == 0, proc.stderr
    [event] = read_topic(kafka.bootstrap, topics["events"])
    assert event.pop("key") == "n1"
    assert not hasattr(parse(json.dumps(event), 1 << 20), "error"), "the published event is valid"

    proc = run_block(latest, kafka.bootstrap)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["seq"] for x in proc.stdout.splitlines()] == [2], "only the latest directive"

    proc = run_block(check, kafka.bootstrap)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "node n1 (cluster c1): 1 event(s) read, conforms"
