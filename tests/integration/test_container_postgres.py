"""The watched PostgreSQL restarted under its agent: the PostgreSQL image in a container of the test's
own network (testcontainers), ``safepoint agent postgres`` on the host started with the guide's
command, the broker and the job on the host.

A ``REPEATABLE READ`` session holds the vacuum horizon: no directive passes its xmin while it is open.
``docker restart`` ends it with the server (a fast shutdown ends every session); the agent says the
server cannot be read, goes on, says when it answers again, and reports what holds the horizon now:
the safe point passes the ended session's xmin, and a session opened after the restart holds it again
until it ends. The agent never exits; the job is replay's. Against an agent that keeps its broken
connection (it never connects again), it fails."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.listener import DirectiveListener
from safepoint.ops.status_store import StatusStore
from safepoint.settings import load_settings

from doc_blocks import block
from observers import missing_tool
from tests_support import QueryJob, caught_up, guide_agent_cmd, job_env, log_ends, make_settings, report, verify, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.docker]
CLUSTER = "pg-main"


@pytest.fixture
def pg() -> Iterator[Any]:
    from safepoint.devtools.containers import POSTGRES_IMAGE, PostgresContainer, TestNetwork, images_missing, sweep

    why = images_missing(POSTGRES_IMAGE)
    if why:
        missing_tool(why)
    sweep()
    with TestNetwork() as net:
        yield PostgresContainer(net).start()


def writes(dsn: str, stop: threading.Event) -> None:
    """A transaction every 20 ms (the xids move on), through the server's restart: reconnects."""
    import psycopg

    while not stop.is_set():
        try:
            with psycopg.connect(dsn, autocommit=True, application_name="writer", connect_timeout=3) as c:
                c.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, total int)")
                c.execute("INSERT INTO t VALUES (0, 0) ON CONFLICT DO NOTHING")
                while not stop.wait(0.02):
                    c.execute("UPDATE t SET total = total + 1 WHERE id = 0")
        except psycopg.Error:
            stop.wait(0.3)


def test_the_agent_goes_on_through_a_restart_of_its_postgres(broker: Any, spark: Any, pg: Any, tmp_path: Path) -> None:
    import psycopg

    settings = make_settings(broker.bootstrap, "pg-restart", 1, node_lease_ms=10_000, trigger_ms=200)
    config = tmp_path / "safepoint.toml"
    config.write_text(block("docs/postgres.md", "[clusters.pg-main]").text.replace("retention = 100", "retention = 20"))
    settings = replace(settings, clusters=load_settings(config, environ={}).clusters)
    stop = threading.Event()
    writer = threading.Thread(target=writes, args=(pg.dsn(), stop), daemon=True)
    seen: list[tuple[float, int]] = []
    """(arrival, safe_ts) of every directive of the cluster, in monotonic seconds."""
    listener = DirectiveListener(broker.bootstrap, CLUSTER, topic=settings.directives_topic,
                                 on_directive=lambda d: seen.append((time.monotonic(), d.safe_ts)))
    store = StatusStore()
    job = QueryJob(spark, settings, tmp_path / "ckpt")
    log = tmp_path / "agent.log"
    mine = {"--dsn": pg.dsn(), "--bootstrap": broker.bootstrap, "--cluster": CLUSTER, "--node": "pg-primary"}
    cmd = guide_agent_cmd(block("docs/postgres.md", ".venv/bin/safepoint agent postgres").text, "postgres", mine, settings,
                          tmp_path / "stats.json")
    agent = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=job_env())

    def safe() -> int:
        return seen[-1][1] if seen else 0

    def held(xmin: int) -> bool:
        status = store.status(CLUSTER) or {}
        return any(h["ts"] == xmin and "report" in (h.get("label") or "") for h in status.get("holds") or [])

    def snapshot() -> tuple[Any, int]:
        session = psycopg.connect(pg.dsn(application_name="report"))
        session.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        row = session.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
        assert row is not None
        return session, int(row[0])

    def stays_below(xmin: int, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            assert safe() <= xmin, f"the safe point {safe()} passed the open session's xmin {xmin}"
            assert agent.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)

    figures: dict[str, float] = {}
    try:
        writer.start()
        listener.start()
        store.follow(settings.librdkafka(), settings.status_topic)
        wait_for(lambda: safe() > 0, 120, "the first directive", job)
        first, xmin1 = snapshot()
        wait_for(lambda: held(xmin1), 30, "the status to name the session", job)
        stays_below(xmin1, 3.0)

        restarted = time.monotonic()
        pg.restart()  # the session ends with the server
        figures["restart_s"] = time.monotonic() - restarted
        with pytest.raises(psycopg.Error):
            first.execute("SELECT 1")
        wait_for(lambda: safe() > xmin1, 60, "the safe point to pass the session the restart ended", job)
        figures["restart_to_release_s"] = time.monotonic() - restarted
        assert not [t for t, s in seen if s > xmin1 and t < restarted], "a directive passed the session while it was open"

        second, xmin2 = snapshot()
        wait_for(lambda: held(xmin2), 30, "the status to name the session opened after the restart", job)
        stays_below(xmin2, 3.0)
        ended = time.monotonic()
        second.rollback()
        wait_for(lambda: safe() > xmin2, 60, "the safe point to pass the second session", job)
        assert not [t for t, s in seen if s > xmin2 and t < ended], "a directive passed the second session while it was open"

        assert agent.poll() is None, log.read_text()[-3000:]
        said = log.read_text()
        assert "cannot be read" in said and "answers again" in said, said[-3000:]
        assert "Traceback" not in said, said[-3000:]
        stop.set()
        agent.terminate()
        assert agent.wait(30) == 0, log.read_text()[-3000:]
        ends = log_ends(broker.bootstrap, settings)
        wait_for(lambda: caught_up(tmp_path / "ckpt", ends), 60, "the job to read the whole log", job)
        assert job.stop() == 0
    finally:
        stop.set()
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)
        listener.close()
        store.close()
        job.stop()
    v = verify(broker.bootstrap, settings, tmp_path / "ckpt")
    assert v.directives[CLUSTER]
    report("pg-restart", **{k: round(x, 1) for k, x in figures.items()}, directives=len(v.directives[CLUSTER]))
