"""Commands against a broker that is not there, or that goes away: one clear line, a bounded wait,
a non-zero exit (never hundreds of librdkafka lines, never a silent success)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from safepoint.connectors.topics import REACH_TIMEOUT_S
from safepoint.devtools.broker import EmbeddedBroker, free_port
from safepoint.ops.control_cli import CONTROL_REACH_TIMEOUT_S

pytestmark = pytest.mark.integration


def safepoint(*args: str, timeout_s: float = 60.0) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "safepoint.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    return proc.returncode, proc.stderr, time.monotonic() - start


@pytest.mark.parametrize("command", [
    ["run", "--checkpoint", "/tmp/safepoint-unreachable-ckpt"],
    ["view", "--duration", "30"],
    ["simulate", "--duration", "30"],
    ["hold", "set", "c1", "backup", "--ts", "5", "--ttl", "1h"],
    ["hold", "list", "c1"],
    ["pause", "c1", "--reason", "restore"],
    ["resume", "c1"],
    ["serve", "--http-port", "1"],
])
def test_an_unreachable_broker_is_one_line_within_a_bound(command: list[str]) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    rc, err, took = safepoint(*command, "--bootstrap", bootstrap)
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, err
    assert took < REACH_TIMEOUT_S + 15, f"gave up after {took:.0f} s"
    if command[0] in ("hold", "pause", "resume"):
        assert took < CONTROL_REACH_TIMEOUT_S + 5, f"an operator's action gave up after {took:.0f} s"
    assert len(lines) == 1, err
    assert f"cannot reach the Kafka broker at {bootstrap}" in lines[0] and lines[0].startswith(f"safepoint {command[0]}:")


def test_simulate_exits_non_zero_when_its_events_are_not_delivered(tmp_path) -> None:
    broker = EmbeddedBroker(data_dir=str(tmp_path / "d")).start()
    proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", "simulate", "--bootstrap", broker.bootstrap,
                             "--duration", "4", "--rate", "200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        broker.kill()  # the broker goes away while the simulator sends
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        broker.cleanup()
    assert proc.returncode == 1, (out, err)
    assert "were not delivered" in err
