"""The PostgreSQL agent's rules without a server: xids as 64-bit ids across the 32-bit wrap, each
kind of hold with its id and label, the dead-tuple figures, the history curve, and which forced
expiries the agent acts on (the real server's tests: tests/integration/test_postgres_agent.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from safepoint.connectors.postgres_agent import PostgresAgent
from safepoint.connectors.postgres_holds import (
    WRAP_LIMIT,
    Backend,
    DeadTuples,
    History,
    Instance,
    PgHold,
    Superseded,
    dead_tuples,
    holds_of,
    to_xid8,
)

NOW_MS = 1_790_000_000_000


def instance(next_xid8: int, **kw: object) -> Instance:
    base: dict[str, object] = {"in_recovery": False, "now_ms": NOW_MS, "backends": [], "prepared": [], "slots": [],
                               "standbys": [], "frozen_age": 1000, "dead": DeadTuples(0)}
    base.update(kw)
    return Instance(next_xid8, **base)  # type: ignore[arg-type]


def backend(pid: int, xmin: int | None, xid: int | None = None, state: str = "idle in transaction",
            query: str = "SELECT * FROM orders") -> Backend:
    return Backend(pid, xmin, xid, state, "report", "alice", "shop", NOW_MS - 60_000, NOW_MS - 120_000, query)


@given(st.integers(min_value=3, max_value=(1 << 40)), st.integers(min_value=-(1 << 31) + 1, max_value=(1 << 31) - 1))
def test_a_32_bit_xid_is_the_64_bit_one_nearest_the_reading(next_xid8: int, delta: int) -> None:
    """Behind the reading by up to 2^31 (or ahead of it: assigned since), across any epoch's wrap."""
    xid8 = next_xid8 - delta
    if xid8 < 0:
        return
    assert to_xid8(xid8 & 0xFFFFFFFF, next_xid8) == xid8


def test_right_across_the_wrap() -> None:
    epoch1 = 1 << 32
    assert to_xid8(0xFFFFFFF0, epoch1 + 5) == epoch1 - 16  # the last epoch's xid, read just after the wrap
    assert to_xid8(3, epoch1 - 10) == epoch1 + 3  # assigned after a reading just before the wrap


def test_each_hold_kind_with_its_xid8_id_and_label() -> None:
    epoch = 7 << 32
    inst = instance(
        epoch + 1000,
        backends=[backend(41, 900, 950), backend(42, None, 990, state="active", query="UPDATE t\n  SET x = 1"),
                  backend(99, 10)],
        prepared=[("pay-17", 960, "alice", "shop", NOW_MS - 5_000)],
        slots=[("cdc", "logical", False, None, 800, "shop", "pgoutput"), ("phys", "physical", True, 850, None, None, None)],
        standbys=[("replica-1", "127.0.0.1", "streaming", 870, NOW_MS - 9_000)],
    )
    holds = holds_of(inst, own_pid=99)
    by_id = {h.id: h for h in holds.values()}
    assert set(by_id) == {f"backend-41@{epoch + 900}", f"xact-{epoch + 950}", f"xact-{epoch + 990}",
                          "prepared-pay-17", f"slot-cdc.catalog@{epoch + 800}", f"slot-phys@{epoch + 850}",
                          f"standby-replica-1@{epoch + 870}"}
    snap = by_id[f"backend-41@{epoch + 900}"]
    assert (snap.kind, snap.ts, snap.pid, snap.idle_in_transaction) == ("reader", epoch + 900, 41, True)
    assert snap.label == "report pid 41 (alice@shop, IDLE IN TRANSACTION): SELECT * FROM orders"
    assert snap.opened_wall_ms == NOW_MS - 60_000  # xact_start
    running = by_id[f"xact-{epoch + 990}"]
    assert running.kind == "tx" and not running.idle_in_transaction and running.label.endswith("active): UPDATE t SET x = 1")
    prepared = by_id["prepared-pay-17"]
    assert (prepared.kind, prepared.ts, prepared.pid, prepared.opened_wall_ms) == ("prepared", epoch + 960, None,
                                                                                 NOW_MS - 5_000)
    slot = by_id[f"slot-cdc.catalog@{epoch + 800}"]
    assert "INACTIVE" in slot.label and "catalog_xmin" in slot.label and slot.pid is None and slot.marked
    assert "INACTIVE" not in by_id[f"slot-phys@{epoch + 850}"].label and not by_id[f"slot-phys@{epoch + 850}"].marked
    assert snap.marked and not running.marked  # what each label says in capitals: the agent relabels when it changes
    assert by_id[f"standby-replica-1@{epoch + 870}"].label.startswith("standby replica-1 (127.0.0.1, streaming)")
    assert all(h.id not in ("backend-99@" + str(epoch + 10)) for h in holds.values())  # the agent's own backend


def test_a_moved_xmin_is_another_hold() -> None:
    a = holds_of(instance(1000, backends=[backend(41, 900)]))
    b = holds_of(instance(1001, backends=[backend(41, 905)]))
    assert set(a) == {"backend-41@900"} and set(b) == {"backend-41@905"}


def test_wraparound_left() -> None:
    assert instance(5, frozen_age=200_000_000).wraparound_left == WRAP_LIMIT - 200_000_000
    assert instance(5, frozen_age=WRAP_LIMIT + 5).wraparound_left == 0


def test_dead_tuples_by_each_tables_bytes_per_tuple() -> None:
    d = dead_tuples([("public.a", 100, 900, 500, 81_920), ("public.b", 0, 0, 0, 0), ("public.c", 5000, 0, 10, 0)])
    assert d.dead_bytes == 8_192 + 5000 * 82  # 81,920 bytes over 1,000 tuples: 81.92 a tuple; none: 82 a tuple
    assert d.changed == {"public.a": (500, 81.92), "public.b": (0, 82), "public.c": (10, 82)}
    assert d.tables == [("public.c", 5000), ("public.a", 100)]


def test_superseded_bytes_never_fall_as_a_tables_bytes_per_tuple_moves() -> None:
    """A table's bytes per tuple drops as dead tuples pile up in its pages (or after a vacuum): the
    counter adds each reading's new changes at the current size and never goes back, so the history
    curve is not cut; a table whose statistics were reset counts on from its new figure."""
    counter = Superseded()
    assert counter.add(dead_tuples([("public.t", 0, 1000, 100, 100_000)])) == 0  # the first reading: a base
    assert counter.add(dead_tuples([("public.t", 500, 1000, 600, 100_000)])) == 33_333  # 500 at 100,000 B / 1,500
    assert counter.add(dead_tuples([("public.t", 0, 1000, 700, 100_000)])) == 43_333  # vacuumed: 100 at 100 B
    assert counter.add(dead_tuples([("public.t", 0, 1000, 5, 100_000)])) == 43_333  # reset: nothing lost, no gain
    assert counter.add(dead_tuples([("public.t", 0, 1000, 15, 100_000)])) == 44_333


def test_the_history_curve_falls_with_ts_and_restarts_after_a_reset() -> None:
    h = History(points=4)
    assert h.curve() == []
    for xid, superseded in ((100, 0), (110, 1000), (120, 1500), (130, 4000), (140, 4100), (150, 5000)):
        h.add(xid, superseded)
    curve = h.curve()
    assert len(curve) == 4 and curve[0] == {"ts": 100, "bytes": 5000} and curve[-1] == {"ts": 150, "bytes": 0}
    assert [p["bytes"] for p in curve] == sorted((p["bytes"] for p in curve), reverse=True)
    h.add(160, 10)  # pg_stat_reset: the counter fell
    h.add(170, 30)
    assert h.curve() == [{"ts": 160, "bytes": 20}, {"ts": 170, "bytes": 0}]


def test_which_expiries_the_agent_acts_on() -> None:
    def agent(terminate: str) -> PostgresAgent:
        return PostgresAgent("postgresql://x@127.0.0.1:1/x", "127.0.0.1:1", "pg", node="pg1", terminate=terminate)

    idle = PgHold("reader", "backend-1@5", 5, "l", 0, 1, 0, idle_in_transaction=True)
    busy = PgHold("tx", "xact-6", 6, "l", 0, 2, 0, idle_in_transaction=False)
    slot = PgHold("reader", "slot-s@4", 4, "l", None)
    prepared = PgHold("prepared", "prepared-g", 3, "l", 0)
    off, idle_only, any_ = agent("off"), agent("idle-in-transaction"), agent("any")
    assert "off" in (off._why_not(idle, "hard") or "")
    assert idle_only._why_not(idle, "graceful") is None and idle_only._why_not(idle, "hard") is None
    assert "running a statement" in (idle_only._why_not(busy, "hard") or "")
    assert "running a statement" in (any_._why_not(busy, "graceful") or "")
    assert any_._why_not(busy, "hard") is None
    for never in (slot, prepared):
        assert "never touched" in (any_._why_not(never, "hard") or "")
    assert "not a hold" in (any_._why_not(None, "hard") or "")


def test_the_job_keeps_and_shows_a_nodes_wraparound_distance() -> None:
    """A heartbeat's ``wraparound_left`` is kept with the node (stored and restored) and shown in its
    status, which stays valid against schemas/outputs/node_status.json."""
    from safepoint.core.node import NodeState
    from safepoint.core.policy import Policy
    from safepoint.core.status import node_status

    from core_helpers import validator

    policy = Policy(retention=100, mvcc_unit="xid")
    ns = NodeState("pg-main", "pg1")
    beat = {"v": 1, "type": "heartbeat", "cluster": "pg-main", "node": "pg1", "incarnation": 1, "seq": 0,
            "wall_ms": NOW_MS, "log_ms": NOW_MS, "mvcc_now": 5000, "pinned_bytes": 10, "wraparound_left": 1_900_000_000}
    assert not isinstance(ns.apply(beat, policy), str)
    again = NodeState.from_stored("pg-main", ns.to_stored())
    status = node_status(again, policy)
    assert status["wraparound_left"] == 1_900_000_000
    validator("node_status").validate(status)
    assert "wraparound_left" not in node_status(NodeState("pg-main", "pg2"), policy)


def test_the_agent_says_plainly_when_the_instance_cannot_be_read(capsys: pytest.CaptureFixture[str]) -> None:
    """``safepoint agent postgres`` against a port nothing listens on: exit 2, the address without its
    password, and why."""
    from safepoint.cli import main

    rc = main(["agent", "postgres", "--dsn", "postgresql://bob:secret@127.0.0.1:1/shop", "--bootstrap", "127.0.0.1:1",
               "--cluster", "pg-main", "--node", "pg1", "--timeout", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot read the instance at postgresql://bob@127.0.0.1:1/shop" in err, err
    assert "secret" not in err and "Connection refused" in err


def test_an_observing_reporter_reports_what_exists_and_never_releases_it_itself() -> None:
    """``Reporter(observer=True)`` (an agent's): a hold below the known safe point is published, not
    refused (it exists already); a hard expiry calls ``on_expire`` and leaves the hold open and
    published until the agent closes it; a plain reporter refuses the first and releases on the second."""
    import json

    from safepoint.connectors.directive_models import ExpireDirective
    from safepoint.connectors.reporter import Reporter
    from safepoint.errors import ReaderRefused

    def reporter(observer: bool, sent: list[bytes], expired: list[str]) -> Reporter:
        rep = Reporter("127.0.0.1:1", "pg1", cluster="pg-main", incarnation=1, heartbeat_interval_s=None,
                       mvcc_clock=lambda: 1000, kafka_conf={"log_level": 0}, observer=observer,
                       on_expire=lambda h, d: expired.append(d.mode))
        rep._sender.produce = sent.append  # type: ignore[method-assign]  # the only stand-in: no broker here
        return rep

    def hard(seq: int) -> ExpireDirective:
        return ExpireDirective.from_json({"v": 1, "type": "expire", "cluster": "pg-main", "node": "pg1", "seq": seq,
                                          "reader_id": "backend-7@400", "reason": "test", "mode": "hard"})

    sent: list[bytes] = []
    expired: list[str] = []
    plain = reporter(False, sent, expired)
    try:
        plain.reader(400, reader_id="backend-7@400").open()
        plain.observe_safe_ts(500)
        with pytest.raises(ReaderRefused):
            plain.reader(400, reader_id="backend-8@400").open()
        plain.expire(hard(1))
        assert [json.loads(v)["type"] for v in sent][-1] == "reader_close"  # released by the reporter
    finally:
        plain.close(0.1)
    sent.clear()
    agent = reporter(True, sent, expired)
    try:
        agent.observe_safe_ts(500)
        reader = agent.reader(400, reader_id="backend-7@400").open()  # below the safe point: published
        assert agent.expire(hard(2)) is reader and expired == ["hard", "hard"]
        assert [json.loads(v)["type"] for v in sent] == ["reader_open"] and reader.is_open  # still held
        reader.close()  # the backend ended: the agent closes it
        assert [json.loads(v)["type"] for v in sent] == ["reader_open", "reader_close"]
    finally:
        agent.close(0.1)
