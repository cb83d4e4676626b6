"""``safepoint agent mariadb`` against the real MariaDB 10.11 (Debian's, as the ``mysql`` user, on
loopback) and the real broker: each kind of hold appears with InnoDB's own transaction number and
its session's label and goes when it ends; a moved read view is another hold; forced expiry ends
the right session and nothing else (never a prepared XA transaction); a prepared XA transaction
held across the agent's and the server's restarts; the server stopped under the agent.
(With the job: test_mariadb_e2e.py.)"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pymysql
import pytest
from confluent_kafka import Producer

from safepoint.connectors.mariadb_agent import MariaDBAgent
from safepoint.connectors.mariadb_holds import parse_innodb_status
from safepoint.devtools.mariadb import LocalMariaDB

from mariadb_util import _needs_mariadb  # noqa: F401 - the module's tests need MariaDB
from pg_util import Running, holds_published, last_heartbeat
from tests_support import make_settings, wait_for

pytestmark = pytest.mark.integration
CLUSTER = "mdb-main"
MONITOR = ("agent", "agent-secret")


def agent_of(server: LocalMariaDB, broker: Any, settings: Any, node: str, **kw: Any) -> MariaDBAgent:
    """An agent with the least it needs: PROCESS (the InnoDB status, every session) and CONNECTION
    ADMIN (ending another user's session), its password in the DSN."""
    user, password = MONITOR
    return MariaDBAgent(server.dsn(user, password), broker.bootstrap, CLUSTER, node=node, events_topic=settings.events_topic,
                        directives_topic=settings.directives_topic, poll_s=0.2, timeout_s=2, **kw)


def prepare(server: LocalMariaDB) -> None:
    user, password = MONITOR
    server.sql("CREATE DATABASE IF NOT EXISTS shop",
               "CREATE TABLE IF NOT EXISTS shop.t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB",
               "INSERT IGNORE INTO shop.t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
               "CREATE USER IF NOT EXISTS 'app'@'127.0.0.1' IDENTIFIED BY 'app-secret'",
               "GRANT ALL ON shop.* TO 'app'@'127.0.0.1'",
               f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'",
               f"GRANT PROCESS, CONNECTION ADMIN ON *.* TO '{user}'@'127.0.0.1'")


def app(server: LocalMariaDB) -> Any:
    return server.connect("app", "app-secret", "shop")


def status(server: LocalMariaDB) -> Any:
    return parse_innodb_status(server.sql("SHOW ENGINE INNODB STATUS")[0][2])


def thread_of(conn: Any) -> int:
    return int(conn.thread_id())


def read_view_of(server: LocalMariaDB, thread: int) -> int:
    [b] = [b for b in status(server).transactions if b.thread_id == thread]
    assert b.view_up is not None, b
    return b.view_up


def test_every_hold_kind_with_its_number_and_label_and_gone_when_it_ends(broker: Any, mariadb: LocalMariaDB) -> None:
    settings = make_settings(broker.bootstrap, "mdb-holds", 1)
    prepare(mariadb)
    running = Running(agent_of(mariadb, broker, settings, "db1"))  # type: ignore[arg-type]
    try:
        report = mariadb.snapshot("SELECT count(*) FROM shop.t", user="app", password="app-secret")
        writer = app(mariadb)
        with writer.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute("UPDATE t SET v = 'z' WHERE id = 1")
        xa = app(mariadb)
        with xa.cursor() as cur:
            for st in ("XA START 'pay-17'", "INSERT INTO t VALUES (10, 'xa')", "XA END 'pay-17'", "XA PREPARE 'pay-17'"):
                cur.execute(st)
        view = read_view_of(mariadb, thread_of(report))
        trx = next(b.trx_id for b in status(mariadb).transactions if b.thread_id == thread_of(writer))
        prepared = next(b.trx_id for b in status(mariadb).transactions if b.prepared)
        ids = {f"view-{thread_of(report)}@{view}", f"trx-{trx}", f"xa-{prepared}"}

        def held() -> dict[str, dict[str, Any]]:
            return holds_published(broker.bootstrap, settings.events_topic, "db1")

        wait_for(lambda: ids <= set(held()), 30, f"the server's holds {sorted(ids)}")
        h = held()
        snap = h[f"view-{thread_of(report)}@{view}"]
        assert snap["type"] == "reader_open" and snap["read_ts"] == view
        assert snap["label"].startswith(f"thread {thread_of(report)} (app@127.0.0.1/-, IDLE IN TRANSACTION"), snap["label"]
        assert "REPEATABLE READ" in snap["label"]
        assert h[f"trx-{trx}"]["begin_ts"] == trx and h[f"trx-{trx}"]["label"].startswith(f"thread {thread_of(writer)} (app@")
        assert h[f"xa-{prepared}"]["begin_ts"] == prepared and h[f"xa-{prepared}"].get("prepared")
        assert "'pay-17'" in h[f"xa-{prepared}"]["label"]
        beat = last_heartbeat(broker.bootstrap, settings.events_topic, "db1")
        st = status(mariadb)
        assert view <= beat["mvcc_now"] <= st.trx_counter and beat["purged_ts"] <= view + 3
        assert beat["history_length"] >= 0 and beat["pinned_bytes"] >= 0
        assert all(p["ts"] <= beat["mvcc_now"] for p in beat.get("history_above", []))
        assert running.agent.stats.failures == 0

        # the reader's next transaction makes a new read view: one hold closes, another opens
        with writer.cursor() as cur:
            cur.execute("COMMIT")
        with report.cursor() as cur:
            cur.execute("COMMIT")
            cur.execute("START TRANSACTION")
            cur.execute("SELECT count(*) FROM shop.t")
        moved = read_view_of(mariadb, thread_of(report))
        assert moved > view
        wait_for(lambda: f"view-{thread_of(report)}@{moved}" in held() and f"view-{thread_of(report)}@{view}" not in held()
                 and f"trx-{trx}" not in held(), 30, "the moved view's hold and the writer's close")
        # each goes when it ends
        with report.cursor() as cur:
            cur.execute("ROLLBACK")
        with xa.cursor() as cur:  # its own session decides it (another may only once that session is gone)
            cur.execute("XA ROLLBACK 'pay-17'")
        wait_for(lambda: not {k for k in held() if k.startswith(("view-", "trx-", "xa-"))}, 30, "every hold to close")
    finally:
        running.stop()


def test_forced_expiry_ends_the_right_session_and_nothing_else(broker: Any, mariadb: LocalMariaDB) -> None:
    """Expire directives as the job sends them: ``idle-in-transaction`` ends an idle session, leaves
    a running one (and says why), never touches a prepared XA transaction; ``any`` ends the running
    one on a hard expiry. Every other session lives on."""
    settings = make_settings(broker.bootstrap, "mdb-expiry", 1)
    prepare(mariadb)
    forgotten = mariadb.snapshot("SELECT count(*) FROM shop.t", user="app", password="app-secret")
    bystander = mariadb.snapshot("SELECT count(*) FROM shop.t", user="app", password="app-secret")
    busy = app(mariadb)
    xa = app(mariadb)
    with xa.cursor() as cur:
        for st in ("XA START 'keep-me'", "INSERT INTO t VALUES (20, 'xa')", "XA END 'keep-me'", "XA PREPARE 'keep-me'"):
            cur.execute(st)

    def long_statement() -> None:
        try:
            with busy.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("START TRANSACTION")
                cur.execute("SELECT SLEEP(60), count(*) FROM t")
        except pymysql.Error:
            pass  # ended by the agent: what the test wants

    sleeper = threading.Thread(target=long_statement, daemon=True)
    sleeper.start()
    threads = {"forgotten": thread_of(forgotten), "bystander": thread_of(bystander), "busy": thread_of(busy)}
    running = Running(agent_of(mariadb, broker, settings, "db1", kill="idle-in-transaction"))  # type: ignore[arg-type]
    seq = 0

    def expire(hold_id: str, mode: str, tx: bool = False) -> None:
        nonlocal seq
        seq += 1
        body = {"v": 1, "type": "expire", "cluster": CLUSTER, "node": "db1", "seq": seq, "reason": "test",
                "mode": mode, "cluster_wall_ms": int(time.time() * 1000), ("tx_id" if tx else "reader_id"): hold_id}
        p = Producer({"bootstrap.servers": broker.bootstrap})
        p.produce(settings.directives_topic, key=f"{CLUSTER}/db1/{hold_id}", value=json.dumps(body))
        assert p.flush(10) == 0

    def hold_of(thread: int) -> str:
        return next(k for k in holds_published(broker.bootstrap, settings.events_topic, "db1")
                    if k.startswith(f"view-{thread}@"))

    def alive(thread: int) -> bool:
        return bool(mariadb.sql(f"SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = {thread}"))

    try:
        wait_for(lambda: all(any(k.startswith(f"view-{t}@") for k in holds_published(
            broker.bootstrap, settings.events_topic, "db1")) for t in threads.values()), 30, "the sessions' read views")
        prepared = next(k for k in holds_published(broker.bootstrap, settings.events_topic, "db1") if k.startswith("xa-"))
        stats = running.agent.stats
        expire(hold_of(threads["busy"]), "hard")  # running a statement: not under idle-in-transaction
        expire(prepared, "hard", tx=True)  # never touched (the reporter itself refuses a prepared one)
        expire(hold_of(threads["forgotten"]), "graceful")  # idle in its transaction: ended
        wait_for(lambda: not alive(threads["forgotten"]), 30, "the forgotten session to end")
        wait_for(lambda: stats.expiries >= 2 and stats.expiries_not_acted >= 1 and stats.killed == 1, 30, "the expiries taken")
        assert alive(threads["busy"]) and alive(threads["bystander"])
        assert [r[3] for r in mariadb.sql("XA RECOVER FORMAT='SQL'")] == ["'keep-me'"]
        with pytest.raises(pymysql.err.OperationalError):  # the forgotten session's client learns it
            with forgotten.cursor() as cur:
                cur.execute("SELECT 1")
        wait_for(lambda: not any(k.startswith(f"view-{threads['forgotten']}@") for k in holds_published(
            broker.bootstrap, settings.events_topic, "db1")), 30, "the ended session's hold to close")
        running.stop()
        # restarted with --kill any: the hard expiry still names that very read view, and the
        # directives' backlog hands it over: the running session ends, also when the listener has read
        # the backlog before the agent's first poll (the order a loaded host once gave: the expiry was
        # skipped as naming no hold the agent had open, and the session ran on)
        restarted = agent_of(mariadb, broker, settings, "db1", kill="any").start()
        assert restarted.listener is not None
        wait_for(lambda: restarted.listener is not None and restarted.listener.caught_up, 30, "the backlog read")
        running = Running(restarted, started=True)  # type: ignore[arg-type]
        wait_for(lambda: not alive(threads["busy"]), 30, "the busy session to end")
        assert alive(threads["bystander"]) and running.agent.stats.killed == 1
    finally:
        running.stop()
        xa.close()  # the prepared transaction outlives its session, then another session ends it
        mariadb.sql("XA ROLLBACK 'keep-me'")


def test_a_prepared_xa_transaction_held_across_restarts(broker: Any, mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """The agent restarted (a new incarnation states the prepared transaction again), then the
    server stopped under it (said, nothing published), started again: the prepared transaction,
    which InnoDB recovers, is still held; the sessions the restart ended are not."""
    settings = make_settings(broker.bootstrap, "mdb-faults", 1)
    prepare(mariadb)
    xa = app(mariadb)
    with xa.cursor() as cur:
        for st in ("XA START 'survivor'", "INSERT INTO t VALUES (30, 'xa')", "XA END 'survivor'", "XA PREPARE 'survivor'"):
            cur.execute(st)
    xa.close()  # its session goes: the transaction stays prepared
    _reader = mariadb.snapshot("SELECT count(*) FROM shop.t")
    running = Running(agent_of(mariadb, broker, settings, "db1", state_dir=str(tmp_path / "agent")))  # type: ignore[arg-type]
    first = running.agent.reporter.incarnation if running.agent.reporter else None

    def published() -> dict[str, dict[str, Any]]:
        return holds_published(broker.bootstrap, settings.events_topic, "db1")

    def has(prefix: str) -> bool:
        return any(k.startswith(prefix) for k in published())

    try:
        wait_for(lambda: has("xa-") and has("view-"), 30, "the holds")
        [prepared] = [k for k in published() if k.startswith("xa-")]
        assert "no session" in published()[prepared]["label"]
        running.stop()
        running = Running(agent_of(mariadb, broker, settings, "db1", state_dir=str(tmp_path / "agent")))  # type: ignore[arg-type]
        assert running.agent.reporter is not None and running.agent.reporter.incarnation != first
        wait_for(lambda: prepared in published() and has("view-"), 30, "the restarted agent's holds")

        stats = running.agent.stats
        mariadb.stop()
        wait_for(lambda: stats.failures >= 1, 30, "the agent to see the server away")
        beats, before = stats.heartbeats, dict(published())
        time.sleep(1.5)
        assert stats.heartbeats == beats, "heartbeats while the server cannot be read"
        assert published() == before, "holds closed while the server could not be read"
        mariadb.start()
        wait_for(lambda: stats.heartbeats > beats + 2, 60, "heartbeats again")
        wait_for(lambda: not has("view-"), 30, "the ended sessions' holds to close")
        assert prepared in published(), "the recovered prepared transaction is still held"
        assert [r[3] for r in mariadb.sql("XA RECOVER FORMAT='SQL'")] == ["'survivor'"]
    finally:
        running.stop()
        mariadb.sql("XA ROLLBACK 'survivor'")


def test_a_user_without_process_is_told_why(broker: Any, mariadb: LocalMariaDB) -> None:
    """The agent's start fails plainly when its user may not read the InnoDB status."""
    prepare(mariadb)
    mariadb.sql("CREATE USER IF NOT EXISTS 'weak'@'127.0.0.1' IDENTIFIED BY 'weak-secret'")
    settings = make_settings(broker.bootstrap, "mdb-weak", 1)
    agent = MariaDBAgent(mariadb.dsn("weak", "weak-secret"), broker.bootstrap, CLUSTER, node="db1",
                         events_topic=settings.events_topic, directives_topic=settings.directives_topic, timeout_s=2)
    with pytest.raises(pymysql.err.OperationalError, match="PROCESS"):
        agent.start()
