"""Commands against a broker that is not there, or that goes away: one clear line, a bounded wait,
a non-zero exit (never hundreds of librdkafka lines, never a silent success)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from safepoint.connectors.kafka.topics import REACH_TIMEOUT_S
from safepoint.devtools.broker import EmbeddedBroker, free_port
from safepoint.ops.control_cli import CONTROL_REACH_TIMEOUT_S

pytestmark = pytest.mark.integration


COMMANDS = [
    ["run", "--checkpoint", "/tmp/safepoint-unreachable-ckpt"],
    ["view", "--duration", "30"],
    ["simulate", "--duration", "30"],
    ["hold", "set", "c1", "backup", "--ts", "5", "--ttl", "1h"],
    ["hold", "list", "c1"],
    ["pause", "c1", "--reason", "restore"],
    ["resume", "c1"],
    ["serve", "--http-port", "1"],
]


def test_an_unreachable_broker_is_one_line_within_a_bound() -> None:
    """Every command at once (each waits on its own reach timeout, so they run side by side)."""
    running = []
    for command in COMMANDS:
        bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
        proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", *command, "--bootstrap", bootstrap],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        running.append((command, bootstrap, proc, time.monotonic()))
    ended: dict[int, float] = {}
    deadline = time.monotonic() + 60
    while len(ended) < len(running) and time.monotonic() < deadline:
        for i, (_c, _b, proc, _s) in enumerate(running):
            if i not in ended and proc.poll() is not None:
                ended[i] = time.monotonic()
        time.sleep(0.05)
    for i, (command, bootstrap, proc, start) in enumerate(running):
        if proc.poll() is None:
            proc.kill()
        _out, err = proc.communicate()
        took = ended.get(i, time.monotonic()) - start
        lines = [x for x in err.splitlines() if x.strip()]
        assert proc.returncode == 2, (command, err)
        assert took < REACH_TIMEOUT_S + 15, f"{command[0]} gave up after {took:.0f} s"
        assert len(lines) == 1, (command, err)
        if command[0] in ("hold", "pause", "resume"):
            # an operator's action waits its own shorter bound: said in its line, which (unlike the
            # wall time from the start of eight processes at once on a loaded machine) does not
            # count the interpreter's start
            assert f"(tried for {CONTROL_REACH_TIMEOUT_S:g} s:" in lines[0], (command, lines)
        assert f"cannot reach the Kafka broker at {bootstrap}" in lines[0], (command, lines)
        assert lines[0].startswith(f"safepoint {command[0]}:"), (command, lines)


def test_simulate_exits_non_zero_when_its_events_are_not_delivered(tmp_path) -> None:
    broker = EmbeddedBroker(data_dir=str(tmp_path / "d")).start()
    proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", "simulate", "--bootstrap", broker.bootstrap,
                             "--duration", "4", "--rate", "200", "--flush-timeout", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
