"""`safepoint broker`: a ready line with the bootstrap address, clients connect, SIGTERM stops it; the
same for Apache Kafka (`--kafka`), one broker and three."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from safepoint.devtools.broker import free_port, wait_for_kafka
from safepoint.jars import KAFKA

from conftest import require_jars
from doc_blocks import block

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


def test_the_deployment_pages_kafka_brokers_start_answer_and_stop(tmp_path: Path) -> None:
    """`safepoint broker --kafka` as the deployment page runs it (its ports and folders this test's own):
    one broker, stopped with SIGTERM, and three, one of which is killed while the command goes on,
    stopped with Ctrl-C (SIGINT)."""
    require_jars(KAFKA)
    lines = [ln.split("#", 1)[0].split() for ln in block("docs/deploying.md", ".venv/bin/safepoint broker --kafka").text.splitlines()]
    assert [ln[:4] for ln in lines] == [[".venv/bin/safepoint", "broker", "--kafka", "--port"],
                                        [".venv/bin/safepoint", "broker", "--kafka", "--nodes"]]
    for i, (words, stop) in enumerate(zip(lines, (signal.SIGTERM, signal.SIGINT), strict=True)):
        swap = {"--port": str(free_port()), "--data-dir": str(tmp_path / f"d{i}")}
        argv = [swap.get(words[j - 1], w) for j, w in enumerate(words)]
        nodes = int(argv[argv.index("--nodes") + 1]) if "--nodes" in argv else 1
        if "--data-dir" not in argv:
            argv += ["--data-dir", str(tmp_path / f"d{i}")]
        proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", *argv[1:]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            ready = re.search(r"safepoint broker ready bootstrap=(\S+) data_dir=(\S+) pids=(\S+)", proc.stdout.readline())
            assert ready, proc.stderr.read() if proc.poll() is not None else "no ready line"
            bootstrap, pids = ready.group(1), [int(p) for p in ready.group(3).split(",")]
            assert len(bootstrap.split(",")) == len(pids) == nodes
            assert re.match(rf"safepoint broker: Apache Kafka \S+, {nodes} nodes?, started in [0-9.]+ s", proc.stdout.readline())
            wait_for_kafka(bootstrap, 10)
            if nodes == 3:
                os.kill(pids[2], signal.SIGKILL)
                time.sleep(1.0)
                assert proc.poll() is None, "the command goes on with two brokers"
                wait_for_kafka(bootstrap, 10)
            proc.send_signal(stop)
            assert proc.wait(60) == 0
            assert "exited" in proc.stderr.read() if nodes == 3 else True
        finally:
            if proc.poll() is None:
                proc.kill()
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
