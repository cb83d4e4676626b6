"""The MariaDB agent's rules without a server: the status text of MariaDB 10.11 (printed by a real
server, copied verbatim), each kind of hold with its id, number and label, and the history curve
(the real server's tests: tests/integration/test_mariadb_agent.py)."""

from __future__ import annotations

import pytest

from safepoint.connectors.mariadb_holds import Server, Session, UndoHistory, holds_of, parse_innodb_status

# Sessions 32..38 of one server: 32 REPEATABLE READ after a SELECT, idle; 33 READ COMMITTED after
# a SELECT, idle; 34 after an UPDATE; 35 START TRANSACTION READ ONLY + SELECT; 38 WITH CONSISTENT
# SNAPSHOT; one session's idle transaction object ("not started").
SESSIONS = """
=====================================
2026-11-29 08:23:16 0x7f0b04226640 INNODB MONITOR OUTPUT
=====================================
------------
TRANSACTIONS
------------
Trx id counter 26
Purge done for trx's n:o < 23 undo n:o < 0 state: running but idle
History list length 0
LIST OF TRANSACTIONS FOR EACH SESSION:
---TRANSACTION (0x7f0b042ee280), ACTIVE 0 sec
0 lock struct(s), heap size 1128, 0 row lock(s)
MariaDB thread id 38, OS thread handle 139684954420928, query id 151 127.0.0.1 app 
Trx read view will not see trx with id >= 25, sees < 25
---TRANSACTION (0x7f0b042ed780), not started
0 lock struct(s), heap size 1128, 0 row lock(s)
---TRANSACTION (0x7f0b042ecc80), ACTIVE 0 sec
0 lock struct(s), heap size 1128, 0 row lock(s)
MariaDB thread id 35, OS thread handle 139685289170624, query id 148 127.0.0.1 app 
Trx read view will not see trx with id >= 25, sees < 25
---TRANSACTION 25, ACTIVE 0 sec
2 lock struct(s), heap size 1128, 4 row lock(s), undo log entries 3
MariaDB thread id 34, OS thread handle 139685289477824, query id 146 127.0.0.1 app 
---TRANSACTION (0x7f0b042eb680), ACTIVE 0 sec
0 lock struct(s), heap size 1128, 0 row lock(s)
MariaDB thread id 33, OS thread handle 139685290092224, query id 144 127.0.0.1 app 
---TRANSACTION (0x7f0b042eab80), ACTIVE 2 sec
0 lock struct(s), heap size 1128, 0 row lock(s)
MariaDB thread id 32, OS thread handle 139685289785024, query id 136 127.0.0.1 app 
Trx read view will not see trx with id >= 25, sees < 25
--------
FILE I/O
--------
"""

# Two prepared XA transactions whose sessions went, after the server's restart.
RECOVERED = """
------------
TRANSACTIONS
------------
Trx id counter 439
Purge done for trx's n:o < 435 undo n:o < 0 state: running
History list length 1
LIST OF TRANSACTIONS FOR EACH SESSION:
---TRANSACTION 435, ACTIVE (PREPARED) 3 sec recovered trx
1 lock struct(s), heap size 1128, 0 row lock(s), undo log entries 1
---TRANSACTION 432, ACTIVE (PREPARED) 3 sec recovered trx
1 lock struct(s), heap size 1128, 0 row lock(s), undo log entries 1
--------
FILE I/O
"""

# A READ COMMITTED statement running (its read view lives while it runs).
RUNNING = """
Trx id counter 4282
Purge done for trx's n:o < 4280 undo n:o < 0 state: running but idle
History list length 3
LIST OF TRANSACTIONS FOR EACH SESSION:
---TRANSACTION (0x7fa5a3aec680), ACTIVE 0 sec
mysql tables in use 1, locked 0
0 lock struct(s), heap size 1128, 0 row lock(s)
MariaDB thread id 34, OS thread handle 140350539081408, query id 2446 127.0.0.1 app User sleep
SELECT SLEEP(0.5), v FROM t WHERE id<=4
Trx read view will not see trx with id >= 4280, sees < 4280
"""

NOW_MS = 1_795_900_000_000


def session(thread: int, command: str = "Sleep", query: str | None = None,
            isolation: str = "REPEATABLE READ") -> Session:
    return Session(thread, NOW_MS - 60_000, isolation, "app", "127.0.0.1:49270", "lab", command, query)


def server(text: str, sessions: list[Session] | None = None, xa: list[str] | None = None, own: int = 99) -> Server:
    st = parse_innodb_status(text)
    return Server(own, st, sessions or [], xa or [], 1_000_000, None)


def test_the_status_texts_figures_and_transactions() -> None:
    st = parse_innodb_status(SESSIONS)
    assert (st.trx_counter, st.purge_done, st.history_length) == (26, 23, 0)
    by_thread = {b.thread_id: b for b in st.transactions}
    assert len(st.transactions) == 6 and not st.transactions[1].active  # "not started": no thread line
    assert (by_thread[32].view_low, by_thread[32].view_up, by_thread[32].trx_id) == (25, 25, None)
    assert by_thread[33].view_up is None, "READ COMMITTED between statements: no read view"
    assert (by_thread[34].trx_id, by_thread[34].view_up, by_thread[34].undo_entries) == (25, None, 3)
    rec = parse_innodb_status(RECOVERED)
    assert [(b.trx_id, b.prepared, b.recovered, b.thread_id) for b in rec.transactions] == [
        (435, True, True, None), (432, True, True, None)]
    run = parse_innodb_status(RUNNING).transactions[0]
    assert (run.thread_id, run.view_low, run.view_up) == (34, 4280, 4280)


def test_a_status_text_without_its_figures_is_refused() -> None:
    with pytest.raises(ValueError, match="TRANSACTIONS"):
        parse_innodb_status("INNODB MONITOR OUTPUT\nBACKGROUND THREAD\n")


def test_each_hold_with_its_number_and_label() -> None:
    sessions = [session(32, query=None), session(33, isolation="READ COMMITTED"), session(34),
                session(35), session(38, command="Query", query="SELECT   count(*)\n FROM orders")]
    holds = holds_of(server(SESSIONS, sessions))
    assert sorted(holds) == ["trx-25", "view-32@25", "view-35@25", "view-38@25"]
    view = holds["view-32@25"]
    assert (view.kind, view.ts, view.thread_id, view.opened_wall_ms) == ("reader", 25, 32, NOW_MS - 60_000)
    assert view.idle and view.marked
    assert view.label == "thread 32 (app@127.0.0.1/lab, IDLE IN TRANSACTION, REPEATABLE READ)"
    assert holds["view-38@25"].label == "thread 38 (app@127.0.0.1/lab, query, REPEATABLE READ): SELECT count(*) FROM orders"
    assert not holds["view-38@25"].marked
    trx = holds["trx-25"]
    assert (trx.kind, trx.ts, trx.thread_id) == ("tx", 25, 34)


def test_the_agents_own_session_is_left_out() -> None:
    assert "view-32@25" not in holds_of(server(SESSIONS, own=32))


def test_prepared_xa_transactions_are_held_without_a_session() -> None:
    holds = holds_of(server(RECOVERED, xa=["'x1'", "'gtr-2','bq-2',77"]))
    assert sorted(holds) == ["xa-432", "xa-435"]
    xa = holds["xa-432"]
    assert (xa.kind, xa.ts, xa.thread_id) == ("prepared", 432, None)
    assert xa.label == "prepared XA transaction 432 (no session; XA RECOVER: 'x1', 'gtr-2','bq-2',77)"


def test_a_moved_read_view_is_another_hold() -> None:
    before = holds_of(server(SESSIONS, [session(32)]))
    after = holds_of(server(SESSIONS.replace("id >= 25, sees < 25\n---TRANSACTION (0x7f0b042ed780)",
                                             "id >= 30, sees < 29\n---TRANSACTION (0x7f0b042ed780)"), [session(32)]))
    assert "view-38@25" in before and "view-38@29" in after and "view-38@25" not in after


def test_the_history_curve() -> None:
    h = UndoHistory()
    assert h.curve() == []
    for trx, lsn in ((100, 10_000), (150, 60_000), (200, 110_000), (200, 130_000)):
        h.add(trx, lsn)
    # redo written since each reading: no undo size known, the curve is the redo
    assert h.curve() == [{"ts": 100, "bytes": 120_000}, {"ts": 150, "bytes": 70_000}, {"ts": 200, "bytes": 0}]
    # 30,000 bytes of undo kept since the purge point at 150 (70,000 of redo since): scaled by 3/7
    assert h.curve(purge_done=150, undo_bytes=30_000) == [
        {"ts": 100, "bytes": 51_428}, {"ts": 150, "bytes": 30_000}, {"ts": 200, "bytes": 0}]
    h.add(50, 5_000)  # a server replaced: its counter went back
    assert h.curve() == []


def test_the_job_keeps_and_shows_a_nodes_purge_point_and_history() -> None:
    """A heartbeat's ``purged_ts`` and ``history_length`` are kept with the node (stored and
    restored; a value stored before them reads as before) and shown in its status, which stays
    valid against schemas/outputs/node_status.json; a heartbeat without them clears them."""
    from safepoint.core.node import NodeState
    from safepoint.core.policy import Policy
    from safepoint.core.status import node_status

    from core_helpers import validator

    policy = Policy(retention=100, mvcc_unit="trx")
    ns = NodeState("mdb-main", "db1")
    beat = {"v": 1, "type": "heartbeat", "cluster": "mdb-main", "node": "db1", "incarnation": 1, "seq": 0,
            "wall_ms": NOW_MS, "log_ms": NOW_MS, "mvcc_now": 5000, "purged_ts": 4058, "history_length": 202}
    assert not isinstance(ns.apply(beat, policy), str)
    stored = ns.to_stored()
    again = NodeState.from_stored("mdb-main", stored)
    status = node_status(again, policy)
    assert (status["purged_ts"], status["history_length"]) == (4058, 202)
    validator("node_status").validate(status)
    older = NodeState.from_stored("mdb-main", stored[:-1])  # the layout before these fields
    assert "history_length" not in node_status(older, policy) and older.engine is None
    plain = {k: v for k, v in beat.items() if k not in ("purged_ts", "history_length")}
    assert not isinstance(ns.apply({**plain, "seq": 2}, policy), str)
    assert "history_length" not in node_status(ns, policy)


def test_the_dsn_and_its_password() -> None:
    from safepoint.connectors.mariadb_agent import connect_args, public_dsn
    from safepoint.errors import ConfigError

    assert connect_args("mysql://agent:s%40cret@db1.example:3307/shop") == {
        "host": "db1.example", "port": 3307, "user": "agent", "password": "s@cret", "database": "shop"}
    assert connect_args("mariadb://agent@127.0.0.1", password="from-env")["password"] == "from-env"
    assert connect_args("mysql://agent@127.0.0.1")["port"] == 3306
    assert public_dsn("mysql://agent:s%40cret@db1.example:3307/shop") == "mysql://agent@db1.example:3307/shop"
    with pytest.raises(ConfigError) as err:
        connect_args("postgresql://agent:hunter2@db1/shop")
    assert "hunter2" not in str(err.value)


def test_which_expiries_the_agent_acts_on() -> None:
    from safepoint.connectors.mariadb_agent import MariaDBAgent
    from safepoint.connectors.mariadb_holds import MdbHold

    view = MdbHold("reader", "view-32@25", 25, "thread 32", NOW_MS, 32, True, True)
    xa = MdbHold("prepared", "xa-432", 432, "prepared XA transaction 432", None)
    off = MariaDBAgent("mysql://agent@127.0.0.1:1/", "127.0.0.1:1", "c")
    idle_only = MariaDBAgent("mysql://agent@127.0.0.1:1/", "127.0.0.1:1", "c", kill="idle-in-transaction")
    any_ = MariaDBAgent("mysql://agent@127.0.0.1:1/", "127.0.0.1:1", "c", kill="any")
    assert "off" in (off._why_not(view, "hard") or "")
    assert idle_only._why_not(view, "graceful") is None and any_._why_not(view, "hard") is None
    assert idle_only._needs_idle("hard") and any_._needs_idle("graceful") and not any_._needs_idle("hard")
    assert "never touched" in (any_._why_not(xa, "hard") or "")
    assert "not a hold" in (any_._why_not(None, "hard") or "")
    with pytest.raises(ValueError, match="kill must be one of"):
        MariaDBAgent("mysql://agent@127.0.0.1:1/", "127.0.0.1:1", "c", kill="everything")


def test_the_agent_says_plainly_when_the_server_cannot_be_read(capsys: pytest.CaptureFixture[str]) -> None:
    """``safepoint agent mariadb`` against a port nothing listens on: exit 2, the address without its
    password, and why."""
    from safepoint.cli import main

    rc = main(["agent", "mariadb", "--dsn", "mysql://bob:secret@127.0.0.1:1/shop", "--bootstrap", "127.0.0.1:1",
               "--cluster", "c", "--node", "n", "--timeout", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "mysql://bob@127.0.0.1:1/shop" in err and "secret" not in err, err


def test_every_mvcc_unit_is_one_the_status_schema_takes() -> None:
    """A unit the settings accept but the status schema does not would make every status record of
    its clusters invalid, and the status surfaces would drop them (as ``trx`` first did)."""
    import json
    from pathlib import Path

    from safepoint.core.policy import MVCC_UNITS

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas/outputs/cluster_status.json").read_text())
    assert list(schema["properties"]["mvcc_unit"]["enum"]) == list(MVCC_UNITS)
