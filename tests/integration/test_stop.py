"""Stopping ``safepoint run`` as an operator does: SIGTERM or SIGINT to its whole process group
ends it cleanly (exit 0, "stopped", no traceback), and no Spark JVM is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests_support import job_env, make_settings, noisy_lines

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_stops_the_job_cleanly(broker: Any, tmp_path: Path, sig: signal.Signals) -> None:
    settings = make_settings(broker.bootstrap, "stop", 1)
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", "run", "--bootstrap", broker.bootstrap,
                                 "--checkpoint", str(tmp_path / "ck"), "--events-topic", settings.events_topic,
                                 "--control-topic", settings.control_topic,
                                 "--directives-topic", settings.directives_topic, "--alerts-topic", settings.alerts_topic,
                                 "--deadletter-topic", settings.deadletter_topic, "--trigger-ms", "200"],
                                stdout=out, stderr=subprocess.STDOUT, env=job_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "safepoint run: reading" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        time.sleep(3)  # a few (empty) batches
        family = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, sig)
        assert proc.wait(60) == 0, log.read_text(errors="replace")[-3000:]
        text = log.read_text(errors="replace")
        assert "safepoint run: stopped" in text and "Traceback" not in text, text[-3000:]
        assert noisy_lines(text) == [], text[-3000:]
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, f"left behind: {[p.cmdline()[:3] for p in alive]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
