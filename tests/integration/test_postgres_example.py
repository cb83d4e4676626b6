"""``examples/postgres/run.py`` as a newcomer runs it, against Debian's PostgreSQL, the broker and the
job: every step does what it says (three forgotten holds named with their costs, the idle session
ended by forced expiry and the slot and the prepared transaction left alone, the safe point past the
released holds and the dead tuples vacuumed), and the dashboard, in a real browser, names the export's
snapshot in xids with the node's wraparound distance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from safepoint.devtools.broker import free_port

from doc_blocks import block
from observers import ExampleRun, browser_missing, dashboard_text, missing_tool
from pg_util import _needs_postgres  # noqa: F401 - the module's tests need PostgreSQL
from tests_support import job_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_the_postgres_example_tells_its_story(tmp_path: Path) -> None:
    why = browser_missing()
    if why:
        missing_tool(why)
    port = free_port()
    command = block("docs/postgres.md", ".venv/bin/python examples/postgres/run.py").text.split()
    assert command == block("README.md", ".venv/bin/python examples/postgres/run.py").text.split() == [
        ".venv/bin/python", "examples/postgres/run.py"]
    with ExampleRun(ROOT, command, port, tmp_path, job_env()) as run:
        text = run.story()
        assert "every step did what it says" in text, text
        assert text.count("   ok: ") == 7, text
        assert "INACTIVE: catalog_xmin (alone keeps" in text and "IDLE IN TRANSACTION" in text, text
        figures: dict[str, Any] = dashboard_text(f"http://127.0.0.1:{port}/", ["nightly-export", "wraparound in"],
                                                 tmp_path / "dashboard.png")
        section = figures["pg-main:"]
        assert "nightly-export" in section and " xids" in section, section
        assert figures["pg-main:safe_ts"].startswith("xid "), "in xids, not as a time"
    assert run.returncode == 0, text
