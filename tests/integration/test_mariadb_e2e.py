"""A MariaDB server's purge horizon through the whole product: Debian's MariaDB 10.11 with a writer,
the broker, the Spark job (the cluster's policy in InnoDB's transaction numbers, from the guide's
``[clusters.mdb-main]`` table, with the pressure thresholds at this test's scale) and ``safepoint
agent mariadb --kill idle-in-transaction`` as a process started with the guide's command, its
password from the environment.

While a forgotten ``REPEATABLE READ`` session holds its read view, no directive's ``safe_ts``
passes it, the holds API names it with its user and cost and the node's status shows InnoDB's
history list growing; the job force-expires it, the agent kills it, the safe point passes it and
the history list falls. A prepared XA transaction is held until it is decided. Then the job equals
a replay of its log."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.mariadb_holds import parse_innodb_status
from safepoint.devtools.broker import free_port
from safepoint.devtools.mariadb import LocalMariaDB, MariaWriter
from safepoint.settings import load_settings

from doc_blocks import block
from kafka_util import read_topic
from mariadb_util import _needs_mariadb  # noqa: F401 - the module's tests need MariaDB
from tests_support import (
    JOB_START_TIMEOUT_S,
    JobProcess,
    answers,
    caught_up,
    get,
    guide_agent_cmd,
    job_env,
    job_flags,
    log_ends,
    make_settings,
    verify,
    wait_for,
)

pytestmark = pytest.mark.integration
CLUSTER = "mdb-main"
PRESSURE = """
node_lease_ms = 10000
pinned_warning_enter_bytes = 250000
pinned_warning_exit_bytes = 200000
pinned_critical_enter_bytes = 500000
pinned_critical_exit_bytes = 400000
band_enter_window_ms = 2000
band_exit_window_ms = 5000
expire_after_ms = 3000
max_reader_lifetime_ms = 15000
expire_grace_ms = 5000
"""


def agent_cmd(dsn: str, bootstrap: str, settings: Any, node: str, stats: Path) -> list[str]:
    """The guide's command (docs/mariadb.md), with this test's server, broker, topics and pace."""
    mine = {"--dsn": dsn, "--bootstrap": bootstrap, "--cluster": CLUSTER, "--node": node}
    return guide_agent_cmd(block("docs/mariadb.md", ".venv/bin/safepoint agent mariadb").text, "mariadb", mine, settings, stats, "--kill", "idle-in-transaction")


def test_no_directive_passes_a_read_view_until_the_agent_ends_it(broker: Any, mariadb: LocalMariaDB, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "mdb-e2e", 1, node_lease_ms=10_000, trigger_ms=200)
    config = tmp_path / "safepoint.toml"
    table = block("docs/mariadb.md", "[clusters.mdb-main]").text
    assert 'mvcc_unit = "trx"' in table
    config.write_text(table.replace("retention = 100", "retention = 20") + PRESSURE)
    settings = replace(settings, clusters=load_settings(config, environ={}).clusters)  # the replay's policy too
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    writer = MariaWriter(mariadb, rows=2000, per_tx=50, every_s=0.02).create()
    grants = block("docs/mariadb.md", "CREATE USER 'safepoint'").text  # the guide's user for the agent, on loopback
    mariadb.sql(*(st for st in grants.replace("10.0.0.%", "127.0.0.1").replace("'...'", "'agent-secret'").split(";")
                  if st.strip()))
    mariadb.sql("CREATE USER 'report'@'127.0.0.1' IDENTIFIED BY 'report-secret'",
                "GRANT SELECT, INSERT, UPDATE ON shop.* TO 'report'@'127.0.0.1'",
                "CREATE TABLE shop.payments (id INT PRIMARY KEY, state VARCHAR(20)) ENGINE=InnoDB",
                "INSERT INTO shop.payments VALUES (17, 'pending')")  # the writer's rows stay unlocked
    job = JobProcess(job_flags(settings, tmp_path / "ckpt", http_port=port, config=str(config)), tmp_path / "job.log")
    agent_log = tmp_path / "agent.log"
    agent = subprocess.Popen(agent_cmd(mariadb.dsn("safepoint"), broker.bootstrap, settings, "db1", tmp_path / "stats.json"),
                             stdout=agent_log.open("ab"), stderr=subprocess.STDOUT,
                             env={**job_env(), "SAFEPOINT_MARIADB_PASSWORD": "agent-secret"})

    def status() -> dict[str, Any]:
        try:
            return get(f"{base}/api/v1/clusters/{CLUSTER}")
        except OSError:
            return {}

    def safe() -> int:
        return int(status().get("safe_ts") or 0)

    def holds() -> list[dict[str, Any]]:
        try:
            return get(f"{base}/api/v1/clusters/{CLUSTER}/holds")["holds"]
        except (OSError, KeyError):
            return []

    def node() -> dict[str, Any]:
        try:
            return next(n for n in get(f"{base}/api/v1/clusters/{CLUSTER}/nodes")["nodes"] if n["node"] == "db1")
        except (OSError, KeyError, StopIteration):
            return {}

    def counter() -> int:
        return int(mariadb.sql("SHOW GLOBAL STATUS LIKE 'Innodb_max_trx_id'")[0][1])

    def alive(thread: int) -> bool:
        return bool(mariadb.sql(f"SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = {int(thread)}"))  # noqa: S608

    try:
        writer.start()
        wait_for(lambda: answers(base + "/healthz"), JOB_START_TIMEOUT_S, "the job's HTTP surface", job)
        wait_for(lambda: safe() > 0, 120, "the first directive", job)
        assert status()["mvcc_unit"] == "trx"

        # a prepared XA transaction whose client went (InnoDB keeps it), then a forgotten session above it
        xa = mariadb.connect("report", "report-secret", "shop")
        with xa.cursor() as cur:
            for st in ("XA START 'pay-17'", "UPDATE payments SET state = 'paid' WHERE id = 17", "XA END 'pay-17'",
                       "XA PREPARE 'pay-17'"):
                cur.execute(st)
        xa.close()
        wait_for(lambda: any((h["id"] or "").startswith("xa-") for h in holds()), 30, "the prepared transaction's hold", job)
        [prepared] = [h for h in holds() if (h["id"] or "").startswith("xa-")]
        assert prepared["kind"] == "prepared_tx" and "'pay-17'" in prepared["label"], prepared
        report = mariadb.snapshot("SELECT sum(total) FROM shop.orders", user="report", password="report-secret")
        thread = int(report.thread_id())
        wait_for(lambda: any((h["id"] or "").startswith(f"view-{thread}@") for h in holds()), 30, "the session's hold", job)
        view = int(next(h for h in holds() if (h["id"] or "").startswith(f"view-{thread}@"))["ts"])
        mariadb.sql("XA ROLLBACK 'pay-17'")  # decided: the session's view is now the oldest hold
        wait_for(lambda: not any((h["id"] or "").startswith("xa-") for h in holds()), 30, "the prepared one's close", job)

        # the writer moves the counter well past the view (the history list behind it grows by a hundred)
        # while the safe point stays at or below it; the job expires the session 15 s after it opened
        history: list[int] = []
        deadline = time.monotonic() + 15

        def grown() -> bool:
            return len(history) > 3 and history[-1] > history[0] + 100 and counter() > view + 200

        while alive(thread) and not grown() and time.monotonic() < deadline:
            assert safe() <= view, "the safe point passed an open read view"
            history.append(node().get("history_length", 0))
            time.sleep(0.3)
        top = next(h for h in holds() if (h["id"] or "").startswith(f"view-{thread}@"))
        assert top["node"] == "db1" and "report@127.0.0.1" in top["label"] and "IDLE IN TRANSACTION" in top["label"], top
        assert top["age_ms"] is not None and top["cost_bytes"] is not None, top  # trx_started; the history curve
        assert counter() > view + 200, "the writer moved the counter past the view"
        assert len(history) > 3 and history[-1] > history[0] + 100, f"the history list grows behind the view: {history}"
        # purge stops at the view: below the first transaction it cannot see (its upper limit, X in
        # "will not see trx with id >= X"), far behind the counter
        [blk] = [b for b in parse_innodb_status(mariadb.sql("SHOW ENGINE INNODB STATUS")[0][2]).transactions
                 if b.thread_id == thread]
        assert blk.view_low is not None and node().get("purged_ts", counter()) <= blk.view_low + 5 < counter() - 100, node()

        # the job force-expires it (critical undo, older than 15 s), the agent kills it
        while alive(thread):
            assert safe() <= view, "the safe point passed an open read view"
            assert time.monotonic() < deadline + 120, "the session was not ended"  # expired after 15 s (and pressure)
            history.append(node().get("history_length", 0))
            time.sleep(0.3)
        killed_ms = int(time.time() * 1000)
        peak = max(history)
        wait_for(lambda: safe() > view, 60, "the safe point to pass the ended session's view", job)
        wait_for(lambda: node().get("history_length", peak) < peak / 2, 60, f"the history list to fall from {peak}", job)
        stats = json.loads((tmp_path / "stats.json").read_text())
        assert stats["killed"] == 1 and stats["failures"] == 0 and stats["heartbeats"] > 10, stats
        expired = [d for d in read_topic(broker.bootstrap, settings.directives_topic, timeout_s=5)
                   if d.get("type") == "expire" and d.get("reader_id", "").startswith(f"view-{thread}@")]
        assert expired, "the job's expire directive for the session"
        early = [d for d in read_topic(broker.bootstrap, settings.directives_topic, timeout_s=5)
                 if d.get("type") == "compaction" and d.get("cluster") == CLUSTER and d["safe_ts"] > view
                 and d["cluster_wall_ms"] < killed_ms - 1000]
        assert not early, f"a directive passed the view before the session ended: {early[:1]}"
        writer.stop()
        agent.terminate()
        agent.wait(30)
        ends = log_ends(broker.bootstrap, settings)
        wait_for(lambda: caught_up(tmp_path / "ckpt", ends), 60, "the job to finish both topics", job)
        assert job.stop() == 0, job.tail()
    finally:
        writer.stop()
        if agent.poll() is None:
            agent.terminate()
            agent.wait(30)
        job.stop()
        print(agent_log.read_text(errors="replace")[-3000:])
    v = verify(broker.bootstrap, settings, tmp_path / "ckpt")
    assert v.directives[CLUSTER], "no directive replayed"
    assert "agent-secret" not in agent_log.read_text(errors="replace")
