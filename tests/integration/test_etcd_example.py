"""``examples/etcd/run.py`` as a newcomer runs it, against Debian's etcd, the broker and the job:
every step does what it says (the list breaks under etcd's own auto-compaction, survives under a
revision hold while compaction goes on, a killed holder's TTL ends and compaction resumes), and the
dashboard, in a real browser, names the backup's hold by its label beside the compacted revision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from safepoint.devtools.broker import free_port

from doc_blocks import block
from etcd_util import _needs_etcd  # noqa: F401 - the module's tests need etcd
from observers import ExampleRun, browser_missing, dashboard_text, missing_tool
from tests_support import job_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_the_etcd_example_tells_its_story_and_the_dashboard_names_the_hold(tmp_path: Path) -> None:
    why = browser_missing()
    if why:
        missing_tool(why)
    port = free_port()
    command = block("docs/etcd.md", ".venv/bin/python examples/etcd/run.py").text.split()
    assert command == block("README.md", ".venv/bin/python examples/etcd/run.py").text.split() == [
        ".venv/bin/python", "examples/etcd/run.py"]
    with ExampleRun(ROOT, command, port, tmp_path, job_env()) as run:
        text = run.story()
        assert "every step did what it says" in text, text
        assert "the list: etcdserver: mvcc: required revision has been compacted" in text, text
        assert text.count("   ok: ") == 6, text
        figures: dict[str, Any] = dashboard_text(f"http://127.0.0.1:{port}/", ["nightly backup", "compacted to"],
                                                 tmp_path / "dashboard.png")
        section = figures["etcd-main:"]
        assert "nightly backup" in section and "compactions" in section, section
        assert figures["etcd-main:compacted_ts"].startswith("rev "), "in revisions, not as a time"
    assert run.returncode == 0, text
