"""``pip install safepoint`` is the node client: in a fresh virtualenv with the bare package (no
extra), a Reporter publishes, a DirectiveListener learns the safe point and a ServiceHold holds,
against the embedded broker; Spark, the web server and the broker are not installed, and a
command that needs them says which extra brings them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import DIRECTIVES, Engine, Policy, Position
from safepoint.core.codec import encode
from safepoint.settings import load_settings

from doc_blocks import block
from kafka_util import produce, read_topic, unique

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

CLIENT = """
import importlib.util, json, sys, time
left_out = [m for m in ("pyspark", "pyarrow", "pandas", "fastapi", "uvicorn", "prometheus_client", "noida_db", "rich")
            if importlib.util.find_spec(m) is not None]
assert not left_out, f"the bare install brought {left_out}"
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.connectors.service_hold import ServiceHold
B, EVENTS, DIRECTIVES, CONTROL = sys.argv[1:5]
clock = iter(range(1_000, 10**9, 10))
with Reporter(B, "n1", cluster="c1", topic=EVENTS, mvcc_clock=lambda: next(clock), heartbeat_interval_s=None) as rep:
    listener = DirectiveListener(B, topic=DIRECTIVES, reporter=rep)
    deadline = time.monotonic() + 30
    while listener.safe_ts is None and time.monotonic() < deadline:
        listener.poll(0.5)
    rep.heartbeat()
    with rep.reader(label="nightly-report") as r:
        rep.heartbeat()
    assert rep.flush(10) == 0
    listener.close()
with ServiceHold(B, "c1", "backup", ts=5_000, ttl_ms=60_000, control_topic=CONTROL, status_topic="") as hold:
    pass
print(json.dumps({"safe_ts": listener.safe_ts, "reader": r.reader_id, "outcomes": hold.outcomes_available}))
"""


def test_the_bare_package_is_the_node_client(broker: Any, tmp_path: Path) -> None:
    tag = unique("bare")
    settings = load_settings(flags={"bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control",
                                    "directives_topic": f"{tag}.d", "alerts_topic": f"{tag}.a",
                                    "deadletter_topic": f"{tag}.dl"}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 1, log_append_time=False))
    engine, directives = Engine(Policy(directive_interval_ms=0, node_lease_ms=10_000)), []
    for i in range(12):  # past the discovery window (no topology): then the first directive
        beat = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n0", "incarnation": 1, "seq": i + 1,
                "wall_ms": 1_700_000_000_000 + 1_000 * i, "mvcc_now": 1_000}
        directives += [(o.key, encode(o.value)) for o in engine.process(encode(beat), Position("events", 0, i))
                       if o.channel == DIRECTIVES]
    assert directives
    produce(broker.bootstrap, settings.directives_topic, directives)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    command = block("README.md", "pip install .").first.split("#")[0].split()  # the README's line, as it is
    assert command == ["pip", "install", "."]
    installed = subprocess.run([py, "-m", *command, "-q", "--disable-pip-version-check"], cwd=ROOT,
                               capture_output=True, text=True, timeout=600, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    run = subprocess.run([py, "-c", textwrap.dedent(CLIENT), broker.bootstrap, settings.events_topic,
                          settings.directives_topic, settings.control_topic], capture_output=True, text=True, timeout=180, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["safe_ts"] == 1_000 and out["outcomes"] is False
    events = read_topic(broker.bootstrap, settings.events_topic)
    assert [e["type"] for e in events] == ["heartbeat", "reader_open", "heartbeat", "reader_close"]
    assert [e["type"] for e in read_topic(broker.bootstrap, settings.control_topic)] == ["service_hold", "service_release"]
    assert events[1]["reader_id"] == out["reader"] and events[1]["label"] == "nightly-report"

    job = subprocess.run([str(venv / "bin" / "safepoint"), "run", "--bootstrap", broker.bootstrap], capture_output=True,
                         text=True, timeout=60, check=False)
    assert job.returncode == 2 and "pip install 'safepoint[job]'" in job.stderr, job.stderr
