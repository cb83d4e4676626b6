"""`safepoint broker`: a ready line with the bootstrap address, clients connect, SIGTERM stops it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from safepoint.devtools.broker import free_port, wait_for_kafka

pytestmark = pytest.mark.integration


def test_broker_command_prints_ready_and_stops_on_sigterm(tmp_path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", "broker", "--port", str(port),
                             "--data-dir", str(tmp_path / "d")], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "ready" in line and f"127.0.0.1:{port}" in line, line
        bootstrap = re.search(r"bootstrap=(\S+)", line).group(1)
        wait_for_kafka(bootstrap, 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    with pytest.raises(Exception):  # noqa: B017 - the broker is gone: nothing answers
        while time.monotonic() < deadline:
            wait_for_kafka(bootstrap, 1)
            time.sleep(0.2)
