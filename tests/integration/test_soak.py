"""``safepoint soak`` end to end, shortened: embedded broker, simulator with bad messages and
restarts, the job, then the independent checker. The run must be safe and say so, with figures.
Part of the nightly target (``./scripts/nightly.sh``, ``pytest -m nightly``), not of ``.ci/run``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.nightly]


def test_a_short_soak_is_safe_and_reports_its_figures(tmp_path: Path) -> None:
    report = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "safepoint.cli", "soak", "--duration", "40", "--bad-rate", "0.005", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = proc.stdout
    tail = out[out.find("== safepoint soak report"):]
    assert proc.returncode == 0, f"exit {proc.returncode}\n{tail or out[-3000:]}\n{proc.stderr[-3000:]}"
    assert "safety: OK" in tail and "liveness: OK" in tail and "accounting: OK" in tail, tail
    assert "live audit: OK" in tail, tail
    data = json.loads(report.read_text())
    check = data["check"]
    assert data["safety_ok"] and check["violations"] == 0 and check["basis_unverified"] == 0
    assert data["events"] > 3_000 and data["events_per_s"] > 50
    assert check["directives"] >= 3 and check["basis_checked"] >= 3 * 5
    logged = data["spark_log"]  # Spark's JVM said nothing of its normal operation, and stopped without a trace
    assert logged["errors"] == 0 and logged["traces"] == 0, logged
    assert set(logged["by_logger"]) <= {"WARN ProcessingTimeExecutor"}, logged
    audit = data["audit"]  # the live auditor ran beside the job and stayed silent
    assert audit["violations"] == 0 and audit["directives_checked"] >= 3 and audit["holds_checked"] > 0, audit
    assert check["bad"] > 0 and check["dead_letters"] == check["bad"] and check["ignored"] > 0
    assert check["applied"] + check["ignored"] + check["bad"] == data["events"]
    assert check["max_lag"] is not None and check["max_lag"] <= check["lag_bound"]
    assert len(data["samples"]) >= 2 and data["samples"][-1]["jvm_rss"] > 0 and data["samples"][-1]["state_bytes"] > 0
    for key in ("jvm_rss", "workers_rss", "state_bytes"):
        assert data["flat"][key]["end"] is not None
