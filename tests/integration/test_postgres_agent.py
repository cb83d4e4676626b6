"""``safepoint agent postgres`` against the real PostgreSQL 15 (Debian's, run as the ``postgres``
user on loopback) and the real broker: each kind of hold appears with PostgreSQL's own xid and its
label and goes when it ends; a streaming standby (``pg_basebackup``, ``hot_standby_feedback``) is
seen through its primary and through its own agent; xids right across the 32-bit wrap (a throwaway
server moved there with ``pg_resetwal``); forced expiry ends the right backend and nothing else;
the agent restarted; the database stopped and started under it; the broker away while holds change.
(With the job: test_postgres_e2e.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from safepoint.connectors.postgres_agent import PostgresAgent
from safepoint.devtools.postgres import LocalPostgres

from pg_util import Running, _needs_postgres, holds_published, last_heartbeat  # noqa: F401 - the module's tests need PostgreSQL
from tests_support import make_settings, wait_for

pytestmark = pytest.mark.integration
CLUSTER = "pg-main"


def agent_of(server: LocalPostgres, broker: Any, settings: Any, node: str, **kw: Any) -> PostgresAgent:
    return PostgresAgent(server.dsn(), broker.bootstrap, CLUSTER, node=node, events_topic=settings.events_topic,
                         directives_topic=settings.directives_topic, poll_s=0.2, timeout_s=2, **kw)


def one(conn: psycopg.Connection[Any], sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None, sql
    return row[0]


def test_every_hold_kind_with_its_xid_and_label_and_gone_when_it_ends(broker: Any, pg: LocalPostgres) -> None:
    settings = make_settings(broker.bootstrap, "pg-holds", 1)
    c = psycopg.connect(pg.dsn(), autocommit=True)
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    c.execute("SELECT pg_create_logical_replication_slot('forgotten', 'test_decoding')")  # before any open xact
    standby = pg.standby()
    standby.wait_ready()
    primary = Running(agent_of(pg, broker, settings, "primary"))
    replica = Running(agent_of(standby, broker, settings, "replica"))
    try:
        report = pg.snapshot("report-job", "SELECT count(*) FROM t")
        writer = psycopg.connect(pg.dsn(application_name="writer"))
        writer.execute("INSERT INTO t VALUES (1, 'a')")
        prep = psycopg.connect(pg.dsn(), autocommit=True)
        prep.execute("BEGIN")
        prep.execute("INSERT INTO t VALUES (2, 'b')")
        prep.execute("PREPARE TRANSACTION 'pay-17'")
        replica_report = standby.snapshot("replica-report", "SELECT count(*) FROM t")

        # PostgreSQL's own figures (epoch 0: an xid is its xid8)
        pid = one(c, "SELECT pid FROM pg_stat_activity WHERE application_name = 'report-job'")
        xmin = int(one(report, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"))
        xid = int(one(writer, "SELECT pg_current_xact_id()::text"))
        prepared = one(c, "SELECT transaction::text::bigint FROM pg_prepared_xacts WHERE gid = 'pay-17'")
        catalog_xmin = one(c, "SELECT catalog_xmin::text::bigint FROM pg_replication_slots WHERE slot_name = 'forgotten'")
        wait_for(lambda: c.execute("SELECT backend_xmin FROM pg_stat_replication WHERE backend_xmin IS NOT NULL")
                 .fetchone() is not None, 30, "the standby's feedback")
        feedback = one(c, "SELECT backend_xmin::text::bigint FROM pg_stat_replication")
        replica_pid = one(standby_conn := psycopg.connect(standby.dsn(), autocommit=True),
                          "SELECT pid FROM pg_stat_activity WHERE application_name = 'replica-report'")
        replica_xmin = int(one(replica_report, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"))

        ids = {f"backend-{pid}@{xmin}", f"xact-{xid}", "prepared-pay-17", f"slot-forgotten.catalog@{catalog_xmin}"}

        def primary_holds() -> dict[str, dict[str, Any]]:
            return holds_published(broker.bootstrap, settings.events_topic, "primary")

        wait_for(lambda: ids <= set(primary_holds()), 30, "the primary's holds")
        held = primary_holds()
        snap = held[f"backend-{pid}@{xmin}"]
        assert snap["type"] == "reader_open" and snap["read_ts"] == xmin
        assert snap["label"].startswith(f"report-job pid {pid} (postgres@postgres, IDLE IN TRANSACTION): SELECT ")
        assert held[f"xact-{xid}"]["begin_ts"] == xid and held[f"xact-{xid}"]["label"].startswith("writer pid")
        assert held["prepared-pay-17"]["begin_ts"] == prepared and held["prepared-pay-17"].get("prepared")
        assert "INACTIVE" in held[f"slot-forgotten.catalog@{catalog_xmin}"]["label"]
        wait_for(lambda: any(h.startswith("standby-standby@") for h in primary_holds()), 30, "the standby's feedback hold")
        assert any(h["read_ts"] <= feedback and h["label"].startswith("standby standby (127.0.0.1")
                   for k, h in primary_holds().items() if k.startswith("standby-"))
        # the standby's own agent: its backends' snapshots
        wait_for(lambda: f"backend-{replica_pid}@{replica_xmin}" in holds_published(
            broker.bootstrap, settings.events_topic, "replica"), 30, "the standby's own reader")
        beat = last_heartbeat(broker.bootstrap, settings.events_topic, "primary")
        assert beat["mvcc_now"] >= xid and beat["wraparound_left"] > 2_000_000_000 and "pinned_bytes" in beat
        assert all(h["ts"] <= beat["mvcc_now"] for h in beat.get("history_above", [{"ts": 0}]))

        # each goes when it ends
        report.rollback()
        writer.commit()
        c.execute("COMMIT PREPARED 'pay-17'")
        c.execute("SELECT pg_drop_replication_slot('forgotten')")
        replica_report.rollback()
        wait_for(lambda: not ids & set(primary_holds()), 30, "the primary's holds to close")
        wait_for(lambda: f"backend-{replica_pid}@{replica_xmin}" not in holds_published(
            broker.bootstrap, settings.events_topic, "replica"), 30, "the standby's reader to close")
        assert primary.agent.stats.failures == 0 and replica.agent.stats.failures == 0
        standby_conn.close()
    finally:
        primary.stop()
        replica.stop()
        standby.stop()


def test_xids_right_across_the_32_bit_wrap(broker: Any) -> None:
    settings = make_settings(broker.bootstrap, "pg-wrap", 1)
    server = LocalPostgres()
    try:
        server.reset_xid((1 << 32) - 30)
        server.start()
        c = psycopg.connect(server.dsn(), autocommit=True)
        old = psycopg.connect(server.dsn(application_name="before-the-wrap"))
        old.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        before = int(one(old, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"))
        for _ in range(60):
            c.execute("SELECT pg_current_xact_id()")
        new = psycopg.connect(server.dsn(application_name="after-the-wrap"))
        after = int(one(new, "SELECT pg_current_xact_id()::text"))
        assert before < (1 << 32) < after, (before, after)
        pid_old = one(c, "SELECT pid FROM pg_stat_activity WHERE application_name = 'before-the-wrap'")
        running = Running(agent_of(server, broker, settings, "wrapped"))
        try:
            want = {f"backend-{pid_old}@{before}": before, f"xact-{after}": after}
            wait_for(lambda: set(want) <= set(holds_published(broker.bootstrap, settings.events_topic, "wrapped")), 30,
                     "the holds either side of the wrap")
            held = holds_published(broker.bootstrap, settings.events_topic, "wrapped")
            assert {k: held[k].get("read_ts", held[k].get("begin_ts")) for k in want} == want
            assert last_heartbeat(broker.bootstrap, settings.events_topic, "wrapped")["mvcc_now"] > (1 << 32)
        finally:
            running.stop()
    finally:
        server.cleanup()


def test_forced_expiry_ends_the_right_backend_and_nothing_else(broker: Any, pg: LocalPostgres) -> None:
    """Expire directives as the job sends them: ``idle-in-transaction`` ends an idle session, leaves a
    running one (and says why), never touches a prepared transaction; ``any`` ends the running one
    on a hard expiry. Every other session lives on."""
    settings = make_settings(broker.bootstrap, "pg-expiry", 1)
    c = psycopg.connect(pg.dsn(), autocommit=True)
    c.execute("CREATE TABLE t (id int)")
    _idle = pg.snapshot("forgotten-session", "SELECT count(*) FROM t")  # held open: its snapshot is the hold
    busy = psycopg.connect(pg.dsn(application_name="busy"), autocommit=True)
    _bystander = pg.snapshot("bystander")
    c.execute("BEGIN")
    c.execute("INSERT INTO t VALUES (1)")
    c.execute("PREPARE TRANSACTION 'keep-me'")
    import threading

    sleeper = threading.Thread(target=lambda: _swallow(busy, "SELECT pg_sleep(60)"), daemon=True)
    sleeper.start()
    pids = {row[0]: row[1] for row in c.execute("SELECT application_name, pid FROM pg_stat_activity "
                                                 "WHERE application_name IN ('forgotten-session', 'busy', 'bystander')")}
    wait_for(lambda: len(pids) == 3 or pids.update(dict(c.execute(
        "SELECT application_name, pid FROM pg_stat_activity WHERE application_name = 'busy'").fetchall())) or False,
        10, "the three sessions")
    running = Running(agent_of(pg, broker, settings, "pg1", terminate="idle-in-transaction"))
    seq = 0

    def expire(hold_id: str, mode: str, tx: bool = False) -> None:
        nonlocal seq
        seq += 1
        body = {"v": 1, "type": "expire", "cluster": CLUSTER, "node": "pg1", "seq": seq, "reason": "test",
                "mode": mode, "cluster_wall_ms": int(time.time() * 1000), ("tx_id" if tx else "reader_id"): hold_id}
        p = Producer({"bootstrap.servers": broker.bootstrap})
        p.produce(settings.directives_topic, key=f"{CLUSTER}/pg1/{hold_id}", value=json.dumps(body))
        assert p.flush(10) == 0

    def hold_of(pid: int) -> str:
        return next(k for k in holds_published(broker.bootstrap, settings.events_topic, "pg1")
                    if k.startswith(f"backend-{pid}@"))

    def alive(pid: int) -> bool:
        return c.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is not None

    try:
        wait_for(lambda: all(any(k.startswith(f"backend-{p}@") for k in holds_published(
            broker.bootstrap, settings.events_topic, "pg1")) for p in pids.values()), 30, "the sessions' holds")
        stats = running.agent.stats
        expire(hold_of(pids["busy"]), "hard")  # running a statement: not under idle-in-transaction
        expire("prepared-keep-me", "hard", tx=True)  # never touched
        expire(hold_of(pids["forgotten-session"]), "graceful")  # idle in a transaction: ended
        wait_for(lambda: not alive(pids["forgotten-session"]), 30, "the idle session to end")
        wait_for(lambda: stats.expiries >= 2 and stats.expiries_not_acted >= 1 and stats.terminated == 1, 30,
                 "the expiries taken")
        assert stats.terminated == 1 and alive(pids["busy"]) and alive(pids["bystander"])
        assert one(c, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'keep-me'") == 1
        wait_for(lambda: not any(k.startswith(f"backend-{pids['forgotten-session']}@") for k in holds_published(
            broker.bootstrap, settings.events_topic, "pg1")), 30, "the ended session's hold to close")
        # a session first seen running the statement that took its snapshot, idle in its transaction
        # only later: what counts is its state when the expiry comes, not when its hold was first seen
        late = psycopg.connect(pg.dsn(application_name="late-idle"))
        late.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        statement = threading.Thread(target=lambda: late.execute("SELECT pg_sleep(3), count(*) FROM t"), daemon=True)
        statement.start()
        found: list[int] = []
        wait_for(lambda: found.extend(r[0] for r in c.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'late-idle' AND state = 'active' "
            "AND backend_xmin IS NOT NULL")) or bool(found), 10, "its statement running")
        late_pid = found[0]
        wait_for(lambda: any(k.startswith(f"backend-{late_pid}@") for k in holds_published(
            broker.bootstrap, settings.events_topic, "pg1")), 10, "its hold, published while it runs")
        statement.join(10)
        wait_for(lambda: "IDLE IN TRANSACTION" in (holds_published(broker.bootstrap, settings.events_topic, "pg1")
                                                   [hold_of(late_pid)].get("label") or ""), 15,
                 "its hold restated with a label that marks it idle in its transaction")
        assert stats.relabeled >= 1
        expire(hold_of(late_pid), "graceful")
        wait_for(lambda: not alive(late_pid), 30, "the session that went idle to end")
        wait_for(lambda: stats.terminated == 2, 10, "the agent's count of it")
        assert any(k.startswith(f"backend-{pids['busy']}@") for k in holds_published(
            broker.bootstrap, settings.events_topic, "pg1")), "a hold the agent did not end was released"
        running.stop()
        # restarted with --terminate any: the hard expiry still names that very snapshot (the same
        # backend, the same xmin), and the directives' backlog hands it over: the running backend ends
        running = Running(agent_of(pg, broker, settings, "pg1", terminate="any"))
        wait_for(lambda: not alive(pids["busy"]), 30, "the busy session to end")
        # the backend is gone the instant pg_terminate_backend signals it; the agent counts it just after
        wait_for(lambda: running.agent.stats.terminated == 1, 10, "the agent's count of it")
        assert alive(pids["bystander"]) and running.agent.stats.terminated == 1
    finally:
        running.stop()
        c.execute("ROLLBACK PREPARED 'keep-me'")


def _swallow(conn: psycopg.Connection[Any], sql: str) -> None:
    try:
        conn.execute(sql)
    except psycopg.Error:
        pass  # ended by the agent: what the test wants


def test_the_agent_restarted_and_the_database_stopped_under_it(broker: Any, pg: LocalPostgres, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "pg-faults", 1)
    c = psycopg.connect(pg.dsn(), autocommit=True)
    c.execute("CREATE TABLE t (id int)")
    c.execute("BEGIN")
    c.execute("INSERT INTO t VALUES (1)")
    c.execute("PREPARE TRANSACTION 'survivor'")
    _reader = pg.snapshot("long-report")  # held open: its snapshot is the hold
    running = Running(agent_of(pg, broker, settings, "pg1", state_dir=str(tmp_path / "agent")))
    first = running.agent.reporter.incarnation if running.agent.reporter else None

    def published() -> dict[str, dict[str, Any]]:
        return holds_published(broker.bootstrap, settings.events_topic, "pg1")

    try:
        wait_for(lambda: "prepared-survivor" in published() and any(k.startswith("backend-") for k in published()), 30,
                 "the holds")
        running.stop()
        running = Running(agent_of(pg, broker, settings, "pg1", state_dir=str(tmp_path / "agent")))
        assert running.agent.reporter is not None and running.agent.reporter.incarnation != first
        wait_for(lambda: "prepared-survivor" in published() and any(k.startswith("backend-") for k in published()), 30,
                 "the restarted agent's holds (a new incarnation states them all)")

        # the database stops under it: said once, nothing published, then back
        stats = running.agent.stats
        pg.stop()
        wait_for(lambda: stats.failures >= 1, 30, "the agent to see the database away")
        beats, holds_before = stats.heartbeats, dict(published())
        time.sleep(1.5)
        assert stats.heartbeats == beats, "heartbeats while the database cannot be read"
        assert published() == holds_before, "holds closed while the database could not be read"
        pg.start()
        wait_for(lambda: stats.heartbeats > beats + 2, 60, "heartbeats again")
        # the restart ended every session; the prepared transaction lives on
        wait_for(lambda: not any(k.startswith("backend-") for k in published()), 30, "the ended sessions' holds to close")
        assert "prepared-survivor" in published()
    finally:
        running.stop()
        with psycopg.connect(pg.dsn(), autocommit=True) as again:
            again.execute("ROLLBACK PREPARED 'survivor'")


def test_the_broker_away_and_back_loses_no_change(pg: LocalPostgres, tmp_path: Path) -> None:
    """The broker stops while holds change (a session ends, another begins): the agent goes on reading
    the instance, and once the broker is back what it published says exactly what the instance holds."""
    from safepoint.devtools.broker import EmbeddedBroker, free_port

    port = free_port()
    broker = EmbeddedBroker(port=port, data_dir=str(tmp_path / "broker")).start()
    settings = make_settings(broker.bootstrap, "pg-broker", 1)
    c = psycopg.connect(pg.dsn(), autocommit=True)
    c.execute("CREATE TABLE t (id int)")
    first = pg.snapshot("first-report")
    running = Running(agent_of(pg, broker, settings, "pg1"))

    def published() -> set[str]:
        return set(holds_published(broker.bootstrap, settings.events_topic, "pg1"))

    def backends() -> set[str]:
        return {f"backend-{pid}@{xmin}" for pid, xmin in c.execute(
            "SELECT pid, backend_xmin::text::bigint FROM pg_stat_activity WHERE backend_xmin IS NOT NULL "
            "AND application_name LIKE '%-report'").fetchall()}

    try:
        wait_for(lambda: backends() and backends() <= published(), 30, "the first report's hold")
        broker.stop()
        first.rollback()  # while the broker is away: one hold goes, another comes
        second = pg.snapshot("second-report")
        polls = running.agent.stats.polls
        wait_for(lambda: running.agent.stats.polls >= polls + 10, 30, "the agent to go on reading the instance")
        broker = EmbeddedBroker(port=port, data_dir=str(tmp_path / "broker")).start()
        want = backends()
        wait_for(lambda: {h for h in published() if h.startswith("backend-")} == want, 60,
                 f"the published holds to be the instance's again ({want})")
        assert running.thread.is_alive(), "the agent's loop ended"
        second.rollback()
        wait_for(lambda: not {h for h in published() if h.startswith("backend-")}, 30, "the second report's close")
    finally:
        running.stop()
        broker.stop()
