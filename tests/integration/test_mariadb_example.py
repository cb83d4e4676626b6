"""``examples/mariadb/run.py`` as a newcomer runs it, against Debian's MariaDB, the broker and the
job: every step does what it says (the forgotten session named with its cost while the history
list grows behind it, force-expired and killed, the safe point past it and the history list
fallen), and the dashboard, in a real browser, shows the cluster in transaction numbers with the
node's history list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from safepoint.devtools.broker import free_port

from doc_blocks import block
from mariadb_util import _needs_mariadb  # noqa: F401 - the module's tests need MariaDB
from observers import ExampleRun, browser_missing, dashboard_text, missing_tool
from tests_support import job_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_the_mariadb_example_tells_its_story(tmp_path: Path) -> None:
    why = browser_missing()
    if why:
        missing_tool(why)
    port = free_port()
    command = block("docs/mariadb.md", ".venv/bin/python examples/mariadb/run.py").text.split()
    assert command == block("README.md", ".venv/bin/python examples/mariadb/run.py").text.split() == [
        ".venv/bin/python", "examples/mariadb/run.py"]
    with ExampleRun(ROOT, command, port, tmp_path, job_env()) as run:
        text = run.story()
        assert "every step did what it says" in text, text
        assert text.count("   ok: ") == 7, text
        assert "report@127.0.0.1" in text and "IDLE IN TRANSACTION" in text and "(alone keeps" in text, text
        figures: dict[str, Any] = dashboard_text(f"http://127.0.0.1:{port}/", ["export@", "history not purged"],
                                                 tmp_path / "dashboard.png")
        section = figures["mdb-main:"]
        assert "export@127.0.0.1" in section and "purged below trx " in section, section
        assert figures["mdb-main:safe_ts"].startswith("trx "), "in transaction numbers, not as a time"
    assert run.returncode == 0, text
