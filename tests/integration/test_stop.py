"""Stopping ``safepoint run`` as an operator does: SIGTERM or SIGINT to its whole process group
ends it cleanly (exit 0, "stopped", no traceback), and no Spark JVM is left behind: a few batches
in, and at the moment the stateful operator's driver-side Python process starts (a run of the full
suite once caught it there: PySpark's ``transform_with_state_driver_worker`` printed an ``EOFError``
and a ``BrokenPipeError`` as the stopping JVM closed its connection, and in a later run its
``python_streaming_source_runner`` did the same)."""

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


DRIVER_WORKER = "transform_with_state_driver_worker"


def driver_worker_running(pid: int) -> bool:
    """Whether the job ``pid``'s operator's driver-side Python process (its first batch's init) runs now
    (it lives a fraction of a second: asked every few milliseconds)."""
    try:
        return any(DRIVER_WORKER in " ".join(p.cmdline()) for p in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return False


@pytest.mark.parametrize(("sig", "when"), [(signal.SIGTERM, "running"), (signal.SIGINT, "running"),
                                           (signal.SIGTERM, "operator-start"), (signal.SIGTERM, "starting")],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-at-operator-start", "SIGTERM-while-starting"])
def test_a_signal_to_the_process_group_stops_the_job_cleanly(broker: Any, tmp_path: Path, sig: signal.Signals,
                                                             when: str) -> None:
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
        if when == "starting":  # the HTTP surface is up, the Spark session not yet
            while "status API, metrics and dashboard at" not in log.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
                time.sleep(0.01)
        elif when == "operator-start":  # the moment the first batch's operator starts (or just after, if missed)
            while not driver_worker_running(proc.pid) and "safepoint run: reading" not in log.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
                time.sleep(0.01)
        else:
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
