"""The README's first command, the demo, end to end and as written (``./scripts/demo.sh``: setup,
which is quick on a set-up checkout, then ``safepoint demo`` until Ctrl-C): the embedded broker,
the simulated cluster, the job and the live view give directives; Ctrl-C (SIGINT to the process
group, as a terminal sends it) prints the summary, the live auditor beside the job found no
violation, and the process ends soon after "demo finished". Spark's log lines and its Python
workers' notices go to the log file the demo names, not to the screen."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from doc_blocks import ROOT, block
from observers import dashboard_text
from tests_support import noisy_lines, wait_for

pytestmark = pytest.mark.integration


def stuck_cost(base: str) -> int:
    """The bytes the stuck report alone keeps, by the API (0 while it is not there or costs nothing)."""
    try:
        with urllib.request.urlopen(base + "api/v1/clusters/default/holds?order=cost", timeout=5) as resp:  # noqa: S310
            held = json.loads(resp.read())["holds"]
    except (OSError, ValueError):
        return 0
    return max([h.get("cost_bytes") or 0 for h in held if h.get("label") == "stuck-report"], default=0)


def test_the_readmes_demo_command_gives_directives_and_ends_soon_after_ctrl_c(tmp_path: Path) -> None:
    command = block("README.md", "./scripts/demo.sh").text
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    finished_at = interrupted_at = first_at = None
    lines = []
    costs: dict[str, str] | None = None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            seen = re.search(r"directives seen: (\d+)", line)
            if seen and int(seen.group(1)) >= 1 and costs is None:  # the dashboard, as a person sees it
                url = re.search(r"dashboard at (http://127\.0\.0\.1:\d+/)", "".join(lines))
                assert url, "".join(lines)[:3000]
                # the stuck report (opened about 20 s into the demo) keeps history of its own once it is
                # older than the retention: the costliest holds name it with its bytes
                base = url.group(1)
                wait_for(lambda: stuck_cost(base) > 0, 150, "the stuck report's cost above 0")  # noqa: B023
                costs = dashboard_text(base, ["costliest holds", "stuck-report"], tmp_path / "demo.png", 60)
            if seen and int(seen.group(1)) >= 3 and interrupted_at is None:
                first_at = first_at or time.monotonic()
                if time.monotonic() - first_at >= 5:  # a few more, for the auditor to check
                    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
                    interrupted_at = time.monotonic()
            elif seen and int(seen.group(1)) >= 1 and first_at is None:
                first_at = time.monotonic()
            if interrupted_at is None and time.monotonic() - t0 > 240:
                break  # no directive in 4 minutes: the assertions below say so
            if line.startswith("demo finished"):
                finished_at = time.monotonic()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ended = time.monotonic()
    text = "".join(lines)
    assert interrupted_at is not None, "no directive on the screen in 4 minutes: " + text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert rc == 0, text[-3000:]
    assert finished_at is not None and finished_at - interrupted_at < 30, text[-3000:]
    found = re.search(r"demo finished: (\d+) directives", text)
    assert found and int(found.group(1)) >= 1, text[-3000:]
    shown = costs.get("default:", "") if costs is not None else ""
    costliest = shown[shown.find("costliest holds"):]
    assert re.search(r"stuck-report.*\b[1-9]\d*(\.\d+)? [kMG]B", costliest), (
        "the stuck report's cost is on the dashboard: " + costliest[:2000])
    assert re.search(r"^  cluster \S+: seq \d+, safe point \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \(\d+\)$", text, re.M), (
        "the summary speaks in UTC times: " + text[-1500:])
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
    assert noisy_lines(log) == [], noisy_lines(log)[:5]
    os.unlink(named.group(1))
    print(f"[demo] first directive at {first_at - t0:.0f} s, Ctrl-C at {interrupted_at - t0:.0f} s; {found.group(1)} "
          f"directives; ended {ended - finished_at:.1f} s after 'demo finished'")
