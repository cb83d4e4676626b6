"""The Prometheus alerting rules operators deploy beside safepoint (docker/prometheus/alerts.yml): promtool
finds them valid and their own tests pass (each rule fires where it must and stays quiet beside it,
docker/prometheus/alerts.test.yml); every metric they read is one the project exports (the operator
guide's metrics reference), and every alert has its runbook line in the guide. Debian's prometheus
package brings promtool (scripts/setup.sh installs it as root); without it a developer's run skips,
CI fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docker" / "prometheus" / "alerts.yml"
GUIDE = ROOT / "docs" / "operations.md"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "Debian's prometheus (promtool) is not installed (scripts/setup.sh installs it as root)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"{why}: CI must run this test")
        pytest.skip(why)
    return found


def alerts() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M)


def section(title: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0 and f"SUCCESS: {len(alerts())} rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run([tool, "test", "rules", "alerts.test.yml"], capture_output=True, text=True, check=False,
                            cwd=RULES.parent)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_is_tested_and_has_its_runbook_line() -> None:
    names = alerts()
    assert len(names) == len(set(names)) >= 12
    tests = (RULES.parent / "alerts.test.yml").read_text()
    runbook = section("Alerting rules")
    for name in names:
        assert f"alertname: {name}" in tests, f"{name} has no promtool test"
        assert f"| `{name}` |" in runbook, f"{name} has no runbook line in the operator guide's Alerting rules"


def test_the_rules_read_only_metrics_the_project_exports() -> None:
    reference = set(re.findall(r"^\| `(safepoint_\w+)` \|", GUIDE.read_text(), re.M))
    lines = [ln for ln in RULES.read_text().splitlines() if not ln.strip().startswith("#")]
    used = set(re.findall(r"\b(safepoint_\w+)\b", "\n".join(lines)))
    assert len(used) >= 10, used
    missing = sorted(m for m in used if m not in reference)
    assert not missing, f"the rules read {missing}, which the metrics reference does not list"
