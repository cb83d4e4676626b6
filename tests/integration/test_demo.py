"""The README's first command, the demo, end to end and as written (``./scripts/demo.sh --duration
120``: setup, which is quick on a set-up checkout, then ``safepoint demo``): the embedded broker,
the simulated cluster, the job and the live view give directives, the live auditor beside them
finds no violation, and the process ends soon after "demo finished". (A shorter run fails on a
loaded machine: beside the other test worker, batch 0 of the demo's job took over a minute.)
Spark's log lines and its Python workers' notices go to the log file the demo names, not to the
screen."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from doc_blocks import ROOT, block

pytestmark = pytest.mark.integration


def test_the_readmes_demo_command_gives_directives_and_ends_soon_after_it_says_so() -> None:
    command = block("README.md", "./scripts/demo.sh --duration 120").text
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    finished_at = None
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("demo finished"):
            finished_at = time.monotonic()
    try:
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ended = time.monotonic()
    text = "".join(lines)
    assert "Traceback" not in text, text[-3000:]
    assert rc == 0, text[-3000:]
    assert finished_at is not None
    found = re.search(r"demo finished: (\d+) directives", text)
    assert found and int(found.group(1)) >= 1, text[-3000:]
    assert ended - finished_at < 30, f"the demo took {ended - finished_at:.0f} s to end after it finished"
    spark_lines = [x for x in lines if re.match(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO|ERROR) ", x)
                   or "TransformWithStateInPandas Python worker" in x]
    assert spark_lines == [], spark_lines[:5]
    assert re.search(r"^demo: status API, metrics and dashboard at http://127\.0\.0\.1:\d+/$", text, re.M), text[:3000]
    audited = re.search(r"^audit: (\d+) directives checked .* (\d+) violation\(s\)$", text, re.M)
    assert audited and int(audited.group(1)) >= 1 and audited.group(2) == "0", text[-3000:]  # the live auditor beside it
    named = re.search(r"its log: (\S+)\)", text)
    assert named, text[:2000]
    log = open(named.group(1), encoding="utf-8", errors="replace").read()
    assert "WARN" in log or "Python worker" in log, "Spark wrote its lines to the file the demo named"
    os.unlink(named.group(1))
    print(f"[demo] ran {ended - t0:.0f} s; {found.group(1)} directives; ended {ended - finished_at:.1f} s after 'demo finished'")
