"""``safepoint demo --engine etcd``, ``--engine postgres`` and ``--engine mariadb`` as the README
says, in one run (each is a real engine beside the simulated cluster; one demo with all three checks
each and starts Spark once): a real etcd reported and compacted by its agent, a real PostgreSQL
whose forgotten report holds a snapshot and a real MariaDB whose forgotten report holds a read
view. The dashboard, in a real browser, shows cluster ``etcd-main`` in revisions with its
compactions, cluster ``pg-main`` in xids naming the report by its ``application_name`` and cluster
``mdb-main`` in InnoDB transaction numbers with the session idle in its transaction and the history
list, next to the simulated cluster's UTC times; Ctrl-C sums each up and stops every engine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from safepoint.devtools.story import get_json

from doc_blocks import ROOT, block
from etcd_util import _needs_etcd  # noqa: F401 - the module's tests need etcd
from mariadb_util import _needs_mariadb  # noqa: F401 - and MariaDB
from observers import browser_missing, dashboard_text, missing_tool
from pg_util import _needs_postgres  # noqa: F401 - and PostgreSQL
from tests_support import job_env, wait_for

pytestmark = pytest.mark.integration


def cluster(base: str, name: str) -> dict[str, Any]:
    try:
        got: dict[str, Any] = get_json(f"{base}api/v1/clusters/{name}")
    except (OSError, ValueError):
        return {}
    return got


def holds(base: str, name: str) -> list[dict[str, Any]]:
    try:
        return list(get_json(f"{base}api/v1/clusters/{name}/holds")["holds"])
    except (OSError, ValueError, KeyError):
        return []


def test_the_demo_runs_etcd_postgres_and_mariadb_beside_the_simulated_cluster(tmp_path: Path) -> None:
    why = browser_missing()
    if why:
        missing_tool(why)
    argv = block("README.md", ".venv/bin/safepoint demo --engine etcd").text.split()
    assert argv[:4] == [".venv/bin/safepoint", "demo", "--engine", "etcd"], argv
    pg_argv = block("README.md", ".venv/bin/safepoint demo --engine postgres").text.split()
    assert pg_argv == [".venv/bin/safepoint", "demo", "--engine", "postgres"], pg_argv
    mdb_argv = block("README.md", ".venv/bin/safepoint demo --engine mariadb").text.split()
    assert mdb_argv == [".venv/bin/safepoint", "demo", "--engine", "mariadb"], mdb_argv
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", *argv[1:], *pg_argv[2:], *mdb_argv[2:],
                                 "--duration", "300"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=job_env(), start_new_session=True)
    try:
        def text() -> str:
            return log.read_text(errors="replace")

        wait_for(lambda: "dashboard at http" in text() or proc.poll() is not None, 180, "the demo's dashboard")
        found = re.search(r"dashboard at (http://127\.0\.0\.1:\d+/)", text())
        assert found, text()[-3000:]
        base = found.group(1)
        wait_for(lambda: (cluster(base, "etcd-main").get("compactions") or 0) >= 1 or proc.poll() is not None, 180,
                 "the etcd cluster's first compaction in the job's status")
        st = cluster(base, "etcd-main")
        assert st.get("mvcc_unit") == "revision" and st["compacted_ts"] >= 1 and st["safe_ts"] >= st["compacted_ts"], st
        wait_for(lambda: any("nightly-report" in (h.get("label") or "") for h in holds(base, "pg-main"))
                 or proc.poll() is not None, 120, "the PostgreSQL report's snapshot in the holds API")
        wait_for(lambda: any("IDLE IN TRANSACTION" in (h.get("label") or "") for h in holds(base, "mdb-main"))
                 or proc.poll() is not None, 120, "the MariaDB report's read view in the holds API")
        # The two reports hold their snapshots 25 s of every 45, each on its own schedule: the page is
        # read again until it shows both at once (they overlap at least 5 s a cycle)
        deadline = time.monotonic() + 150
        while True:
            shown = dashboard_text(base, ["cluster etcd-main", "compacted to", "cluster default", "nightly-report",
                                          "cluster mdb-main", "purged below trx"], tmp_path / "engines.png")
            if ("IDLE IN TRANSACTION" in shown.get("mdb-main:", "") and "IDLE IN TRANSACTION" in shown.get("pg-main:", "")
                    or time.monotonic() > deadline or proc.poll() is not None):
                break
            time.sleep(1)
        etcd = shown.get("etcd-main:", "")
        assert "revision" in etcd and "compacted to" in etcd, etcd[:2000]
        pg = shown.get("pg-main:", "")
        assert "nightly-report" in pg and "IDLE IN TRANSACTION" in pg and "xid " in pg, pg[:2000]
        mdb = shown.get("mdb-main:", "")
        assert "IDLE IN TRANSACTION" in mdb and "trx " in mdb and "purged below trx" in mdb, mdb[:2000]
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown.get("default:", "")), "the simulated cluster in UTC"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the summary, then every engine stopped
        assert proc.wait(90) == 0, text()[-3000:]
        out = text()
        assert re.search(r"^  cluster etcd-main: seq \d+, safe point \d+$", out, re.M), out[-3000:]  # revisions
        assert re.search(r"^  cluster pg-main: seq \d+, safe point \d+$", out, re.M), out[-3000:]  # xids
        assert re.search(r"^  cluster mdb-main: seq \d+, safe point \d+$", out, re.M), out[-3000:]  # trx numbers
        assert "Traceback" not in out, out[-3000:]
        audited = re.search(r"^audit: (\d+) directives checked .* (\d+) violation\(s\)$", out, re.M)
        assert audited and int(audited.group(1)) >= 1 and audited.group(2) == "0", out[-3000:]
    finally:
        if proc.poll() is None:  # a failed step: Ctrl-C first, so that the demo stops its engines
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(1)
    # the demo's etcd, PostgreSQL and MariaDB run from directories named safepoint-demo-engines-* (other tests'
    # servers, running meanwhile in other workers, are not the demo's)
    leftover = subprocess.run(["pgrep", "-f", "safepoint-demo-engines-"], capture_output=True, text=True, check=False)
    assert not leftover.stdout.strip(), f"an engine of the demo was left running: {leftover.stdout}"
