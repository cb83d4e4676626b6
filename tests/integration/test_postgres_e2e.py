"""A PostgreSQL instance's vacuum horizon through the whole product: Debian's PostgreSQL 15 with a
streaming standby and a writer, the broker, the Spark job (the cluster's policy in xids, from the
guide's ``[clusters.pg-main]`` table) and ``safepoint agent postgres`` as a process started with the
guide's command.

While a ``REPEATABLE READ`` session holds a snapshot, no directive's ``safe_ts`` passes its xmin and
the holds API names it by its ``application_name``; after it ends the safe point passes it. Likewise a
prepared transaction, a logical slot and a standby's feedback (a snapshot held on the standby). Then
the job equals a replay of its log."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from safepoint.devtools.broker import free_port
from safepoint.devtools.postgres import LocalPostgres, Writer
from safepoint.settings import load_settings

from doc_blocks import block
from kafka_util import read_topic
from pg_util import _needs_postgres  # noqa: F401 - the module's tests need PostgreSQL
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
CLUSTER = "pg-main"


def agent_cmd(dsn: str, bootstrap: str, settings: Any, node: str, stats: Path) -> list[str]:
    """The guide's command (docs/postgres.md), with this test's server, broker, topics and pace."""
    mine = {"--dsn": dsn, "--bootstrap": bootstrap, "--cluster": CLUSTER, "--node": node}
    return guide_agent_cmd(block("docs/postgres.md", ".venv/bin/safepoint agent postgres").text, "postgres", mine, settings, stats)


def test_no_directive_passes_a_postgres_hold_until_it_ends(broker: Any, pg: LocalPostgres, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "pg-e2e", 1, node_lease_ms=10_000, trigger_ms=200)
    config = tmp_path / "safepoint.toml"
    table = block("docs/postgres.md", "[clusters.pg-main]").text
    assert 'mvcc_unit = "xid"' in table
    config.write_text(table.replace("retention = 100", "retention = 20"))  # this writer is slower than a fleet
    settings = replace(settings, clusters=load_settings(config, environ={}).clusters)  # the replay's policy too
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    c = psycopg.connect(pg.dsn(), autocommit=True)
    # a transaction every 20 ms on row 0 (the xids move on, and dead tuples pile up); row 1 is the
    # prepared transaction's, which the writer never waits for
    writer = Writer(pg.dsn(), "t", rows=1, per_tx=1, every_s=0.02).create()
    c.execute("INSERT INTO t VALUES (1, 0, '')")
    standby = pg.standby()
    standby.wait_ready()
    job = JobProcess(job_flags(settings, tmp_path / "ckpt", http_port=port, config=str(config)), tmp_path / "job.log")
    agent_log = tmp_path / "agent.log"
    agent = subprocess.Popen(agent_cmd(pg.dsn(), broker.bootstrap, settings, "pg-primary", tmp_path / "stats.json"),
                             stdout=agent_log.open("ab"), stderr=subprocess.STDOUT, env=job_env())
    released: dict[str, tuple[int, int]] = {}
    """hold -> (its xid8, when it was released, ms)."""

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

    def next_xid() -> int:
        return int(c.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()[0])  # type: ignore[index]

    def stays_below(xid8: int, what: str) -> None:
        """The xids move well past ``xid8`` while the safe point stays at or below it."""
        target = xid8 + 100
        deadline = time.monotonic() + 60
        while next_xid() < target and time.monotonic() < deadline:
            assert safe() <= xid8, f"the safe point passed {what}"
            time.sleep(0.2)
        time.sleep(1.5)  # a few more batches
        assert 0 < safe() <= xid8, (what, safe(), xid8)

    def release(name: str, xid8: int, end: Any) -> None:
        end()
        released[name] = (xid8, int(time.time() * 1000))
        wait_for(lambda: safe() > xid8, 60, f"the safe point to pass {name}", job)

    try:
        writer.start()
        wait_for(lambda: answers(base + "/healthz"), JOB_START_TIMEOUT_S, "the job's HTTP surface", job)
        wait_for(lambda: safe() > 0, 120, "the first directive", job)
        assert status()["mvcc_unit"] == "xid"

        # 1. a forgotten REPEATABLE READ session
        report = psycopg.connect(pg.dsn(application_name="report-job"))
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        xmin = int(report.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()[0])  # type: ignore[index]
        wait_for(lambda: any("report-job" in (h["label"] or "") and h["ts"] == xmin for h in holds()), 30,
                 "the holds API to name the session", job)
        stays_below(xmin, "the REPEATABLE READ session's xmin")
        top = next(h for h in holds() if "report-job" in (h["label"] or ""))  # the standby's feedback may be older
        assert top["ts"] == xmin and top["node"] == "pg-primary" and "IDLE IN TRANSACTION" in top["label"], top
        assert top["age_ms"] is not None and top["cost_bytes"] is not None, top  # xact_start; the history curve

        # 2. a prepared transaction (behind the session: the session's end moves the safe point to it)
        c.execute("BEGIN")
        c.execute("UPDATE t SET total = total WHERE id = 1")
        prepared = int(c.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
        c.execute("PREPARE TRANSACTION 'pay-17'")
        release("the session", xmin, report.rollback)
        stays_below(prepared, "the prepared transaction")
        assert any(h["id"] == "prepared-pay-17" and h["kind"] == "prepared_tx" for h in holds())

        # 3. a logical slot nobody reads (made while the prepared transaction stands: it waits for
        # running transactions, so it is made on a thread and the prepared one committed meanwhile)
        made: list[int] = []
        slot = threading.Thread(target=lambda: made.append(int(psycopg.connect(pg.dsn(), autocommit=True).execute(
            "SELECT xmin::text::bigint FROM pg_create_logical_replication_slot('forgotten', 'test_decoding') s, "
            "pg_replication_slots r WHERE r.slot_name = 'forgotten'").fetchone()[0] or 0)), daemon=True)  # type: ignore[index]
        release("the prepared transaction", prepared, lambda: c.execute("COMMIT PREPARED 'pay-17'"))
        slot.start()
        slot.join(60)
        catalog_xmin = int(c.execute("SELECT catalog_xmin::text::bigint FROM pg_replication_slots "
                                     "WHERE slot_name = 'forgotten'").fetchone()[0])  # type: ignore[index]
        wait_for(lambda: any((h["id"] or "").startswith("slot-forgotten.catalog@") for h in holds()), 30, "the slot's hold", job)
        stays_below(catalog_xmin, "the slot's catalog_xmin")
        assert any("INACTIVE" in (h["label"] or "") for h in holds() if (h["id"] or "").startswith("slot-forgotten"))

        # 4. a snapshot held on the standby: its feedback holds the primary back
        replica = psycopg.connect(standby.dsn(application_name="replica-report"))
        replica.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        replica_xmin = int(replica.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()[0])  # type: ignore[index]
        release("the slot", catalog_xmin, lambda: c.execute("SELECT pg_drop_replication_slot('forgotten')"))
        wait_for(lambda: any((h["id"] or "").startswith("standby-") for h in holds()), 30, "the standby's feedback", job)
        stays_below(replica_xmin, "the standby's snapshot (through its feedback)")
        release("the standby's snapshot", replica_xmin, replica.rollback)

        # every directive that passed a hold came after its release (cluster time: the nodes' clocks)
        directives = [d for d in read_topic(broker.bootstrap, settings.directives_topic, timeout_s=5)
                      if d.get("type") == "compaction" and d.get("cluster") == CLUSTER]
        assert directives
        for name, (xid8, at_ms) in released.items():
            early = [d for d in directives if d["safe_ts"] > xid8 and d["cluster_wall_ms"] < at_ms - 1000]
            assert not early, f"{name}: a directive passed {xid8} before its release: {early[:1]}"
        stats = json.loads((tmp_path / "stats.json").read_text())
        assert stats["failures"] == 0 and stats["heartbeats"] > 10, stats
        nodes = get(f"{base}/api/v1/clusters/{CLUSTER}/nodes")
        assert any(n.get("wraparound_left", 0) > 2_000_000_000 for n in nodes["nodes"]), nodes
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
        standby.stop()
    v = verify(broker.bootstrap, settings, tmp_path / "ckpt")
    assert v.directives[CLUSTER], "no directive replayed"
