"""Lazy registration (``Reporter(..., retention=R)``): a node publishes a reader or transaction only
once it can hold history back, and the safe point is the same as with every hold published.

The real ``Reporter`` runs here; only its producer's ``produce`` is replaced by a list, so the events
it would send are fed to ``Engine`` (what ``replay`` and the job run) in the order they were sent.
The same path through a broker and the Spark job is tested in tests/integration/test_lazy_job.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from safepoint.checknode import NodeCheck
from safepoint.connectors.handles import Handle
from safepoint.connectors.reporter import Reporter
from safepoint.core import DIRECTIVES, Engine, Policy, Position

R = 2_000
"""The reporters' and the job's retention, in MVCC units (here: one unit per ms of wall time)."""
T0 = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.wall = T0

    def mvcc(self) -> int:
        return self.wall  # MVCC time in ms: the bound mvcc_now - R is R ms ago


@contextmanager
def reporters(n: int, clock: Clock, sent: list[bytes], retention: int | None) -> Iterator[list[Reporter]]:
    """``n`` reporters (nodes n0..) whose events go to ``sent`` in the order they are handed over."""
    made = []
    try:
        for i in range(n):
            rep = Reporter("127.0.0.1:1", f"n{i}", cluster="c1", incarnation=0, heartbeat_interval_s=None,
                           mvcc_clock=clock.mvcc, wall_clock=lambda: clock.wall, retention=retention,
                           kafka_conf={"log_level": 0})
            rep._sender.produce = sent.append  # type: ignore[method-assign]  # the only stand-in: no broker here
            made.append(rep)
        yield made
    finally:
        for rep in made:
            rep.close(0.1)


def topology(n: int) -> bytes:
    return json.dumps({"v": 1, "type": "topology", "cluster": "c1", "wall_ms": T0, "version": 1,
                       "nodes": {f"n{i}": [] for i in range(n)}}).encode()


# an action: (node, kind, a number: a ts offset below the clock, or which open hold, or ms to advance)
ACTIONS = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(["open", "begin", "close", "prepare", "end", "hb", "tick", "snapshot"]),
              st.integers(0, 3 * R)),
    min_size=1, max_size=60)


def run(actions: list[tuple[int, str, int]], nodes: int, retention: int | None,
        sent_out: list[bytes] | None = None) -> tuple[list[int], list[str], int]:
    """Drive the reporters with ``actions``; returns (the directives' safe_ts in order, the
    safety violations seen, the number of events sent); ``sent_out`` gets the events."""
    clock, sent = Clock(), [topology(nodes)]
    policy = Policy(retention=R, node_lease_ms=10**9, directive_interval_ms=0, stall_ms=0)
    engine = Engine(policy)
    safe: list[int] = []
    violations: list[str] = []
    fed = 0
    open_holds: list[tuple[int, Handle, bool]] = []  # (node, handle, counts: opened at or above the safe point then)
    with reporters(nodes, clock, sent, retention) as reps:
        for rep in reps:
            rep.heartbeat()
        fed = feed(engine, sent, fed, safe, violations, open_holds)
        for node, kind, k in actions:
            node %= nodes
            rep = reps[node]
            current = safe[-1] if safe else None
            if kind in ("open", "begin"):
                ts = clock.mvcc() - k
                h: Handle = rep.reader(ts) if kind == "open" else rep.transaction(ts)
                h.open() if kind == "open" else h.begin()  # type: ignore[union-attr]
                open_holds.append((node, h, current is None or ts >= current))
            elif kind in ("close", "prepare", "end"):
                mine = [x for x in open_holds if x[0] == node]
                if mine:
                    entry = mine[-1 - k % len(mine)]  # k = 0: the newest
                    h = entry[1]
                    if kind == "prepare" and hasattr(h, "prepare") and not h.prepared:  # type: ignore[union-attr]
                        h.prepare("n0", ["n0"])  # type: ignore[union-attr]
                    elif kind != "prepare":
                        h.close() if hasattr(h, "read_ts") else h.end("abort")  # type: ignore[union-attr]
                        open_holds.remove(entry)
            elif kind == "hb":
                clock.wall += k % 700
                rep.heartbeat()
            elif kind == "tick":
                clock.wall += k % 300
            else:
                rep.snapshot()
            fed = feed(engine, sent, fed, safe, violations, open_holds)
    if sent_out is not None:
        sent_out.extend(sent)
    return safe, violations, len(sent)


def feed(engine: Engine, sent: list[bytes], fed: int, safe: list[int], violations: list[str],
         open_holds: list[tuple[int, Handle, bool]]) -> int:
    """Apply what was sent since ``fed``; check each new directive against every hold open now that
    was opened at or above the safe point of its time (one below it is a late arrival, alerted)."""
    for i, value in enumerate(sent[fed:], start=fed):
        for out in engine.process(value, Position("events", 0, i)):
            if out.channel == DIRECTIVES and out.value["type"] == "compaction":
                s = out.value["safe_ts"]
                safe.append(s)
                for n, hold, counts in open_holds:
                    ts = hold._ts
                    if counts and ts is not None and ts < s:
                        violations.append(f"safe_ts {s} passed {hold!r} of n{n}")
    return len(sent)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS, st.integers(1, 3))
@example([(1, "hb", 100), (0, "hb", 600), (0, "open", R + 300), (1, "hb", 600)], 2)
def test_lazy_publishing_gives_the_same_safe_points_as_publishing_everything(actions: list[tuple[int, str, int]],
                                                                             nodes: int) -> None:
    eager, eager_bad, eager_sent = run(actions, nodes, None)
    lazy, lazy_bad, lazy_sent = run(actions, nodes, R)
    assert lazy == eager
    assert not eager_bad and not lazy_bad, (eager_bad, lazy_bad)
    assert lazy_sent <= eager_sent


def test_a_historical_read_is_published_at_once() -> None:
    """Node n0 reads below its last heartbeat's bound while n1's heartbeats raise the global
    minimum: unpublished, the read would be passed before n0's next heartbeat."""
    actions = [(1, "hb", 100), (0, "hb", 600), (0, "open", R + 300), (1, "hb", 600)]
    eager, eager_bad, _ = run(actions, 2, None)
    lazy, lazy_bad, _ = run(actions, 2, R)
    assert lazy == eager and not eager_bad and not lazy_bad


def check_node(sent: list[bytes], retention: int) -> list[str]:
    """``safepoint check-node``'s findings on node n0's events, judged with ``retention``."""
    check = NodeCheck("c1", "n0", Policy(retention=retention, node_lease_ms=10**9), from_first_event=True)
    for offset, value in enumerate(sent):
        check.feed(b"n0", value, 0, offset)
    return [f.check for f in check.findings()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
@example([(0, "hb", 100), (0, "open", 10), (0, "hb", 600), (0, "snapshot", 0)])
def test_check_node_judges_a_lazy_reporter_by_its_retention(actions: list[tuple[int, str, int]]) -> None:
    """A lazy reporter conforms when check-node is told its retention (``--retention``, or the
    job's as its directives announce it); judged as an eager one, the example's snapshot names a
    reader it never had to publish."""
    sent: list[bytes] = []
    run(actions, 1, R, sent)
    assert check_node(sent, R) == []


def test_judged_as_eager_a_lazy_reporter_is_flagged() -> None:
    sent: list[bytes] = []
    run([(0, "hb", 100), (0, "open", 10), (0, "hb", 600), (0, "snapshot", 0)], 1, R, sent)
    assert check_node(sent, 0) == ["unpublished_hold"]


def test_check_node_takes_a_restarted_node_from_its_own_bound() -> None:
    """A new incarnation whose clock is behind the old one's: its bound starts again from its own
    heartbeats, so a hold between its bound and the old, higher one is not judged unpublished."""
    old, new = Clock(), Clock()
    new.wall = old.wall - 5 * R
    sent: list[bytes] = []
    for clock, incarnation in ((old, 1), (new, 2)):
        rep = Reporter("127.0.0.1:1", "n0", cluster="c1", incarnation=incarnation, heartbeat_interval_s=None,
                       mvcc_clock=clock.mvcc, wall_clock=lambda c=clock: c.wall, retention=R, kafka_conf={"log_level": 0})
        rep._sender.produce = sent.append  # type: ignore[method-assign]
        rep.heartbeat()
        if incarnation == 2:
            rep.reader(new.wall - R // 2).open()  # above its own bound: deferred by design
            rep.snapshot()
        rep.close(0.1)
    assert check_node(sent, R) == []


def test_lazy_publishing_sends_fewer_events_and_the_same_safe_points_on_a_busy_node() -> None:
    """Many short readers, a few long ones: the short ones are never published."""
    actions: list[tuple[int, str, int]] = []
    for second in range(20):
        for _ in range(30):
            actions += [(0, "open", 0), (0, "tick", 20), (0, "close", 0)]
        if second % 5 == 0:
            actions.append((0, "open", 0))  # a long reader, never closed: it must be published
        actions.append((0, "hb", 400))
    eager, _bad, eager_sent = run(actions, 1, None)
    lazy, _bad, lazy_sent = run(actions, 1, R)
    assert lazy == eager and len(eager) > 3
    assert lazy_sent < eager_sent / 10, (lazy_sent, eager_sent)


def events_of(sent: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(v) for v in sent]


def test_what_a_lazy_reporter_publishes_and_when() -> None:
    clock, sent = Clock(), []
    with reporters(1, clock, sent, R) as (rep,):
        early = rep.reader(clock.mvcc() - 10).open()  # before the first heartbeat: published at once
        assert [e["type"] for e in events_of(sent)] == ["reader_open"]
        early.close()
        sent.clear()
        rep.heartbeat()
        r = rep.reader(clock.mvcc() - 10).open()  # above the heartbeat's bound mvcc - R: it waits
        rep.heartbeat()
        assert [e["type"] for e in events_of(sent)] == ["heartbeat", "heartbeat"] and events_of(sent)[1]["active_readers"] == 1
        opened_at = clock.wall
        clock.wall += R + 1
        rep.heartbeat()  # this bound passes the reader's ts: published first, with when it opened
        first, hb = events_of(sent)[2:]
        assert (first["type"], first["reader_id"], first["opened_wall_ms"], hb["type"]) == ("reader_open", r.reader_id,
                                                                                             opened_at, "heartbeat")
        r.close()
        assert events_of(sent)[-1]["type"] == "reader_close"
        sent.clear()
        short = rep.reader().open()
        short.close()
        assert sent == [], "a reader closed before it could matter publishes nothing"
        rep.reader(clock.mvcc() - R - 5).open()  # a historical read: below the bound already
        assert events_of(sent)[-1]["type"] == "reader_open" and "opened_wall_ms" not in events_of(sent)[-1]
        tx = rep.transaction().begin()
        assert events_of(sent)[-1]["type"] == "reader_open"
        tx.prepare("n0", ["n0"])  # a prepared transaction always counts: its begin goes first
        assert [e["type"] for e in events_of(sent)[-2:]] == ["tx_begin", "tx_prepare"]
        tx.end("commit")
        assert events_of(sent)[-1]["type"] == "tx_end"
        waiting = rep.reader().open()
        rep.snapshot()
        snap = events_of(sent)[-1]
        assert snap["type"] == "snapshot" and waiting.reader_id in [x["reader_id"] for x in snap["readers"]]
        waiting.close()
        assert events_of(sent)[-1] == {**events_of(sent)[-1], "type": "reader_close", "reader_id": waiting.reader_id}


def test_a_reporter_retention_above_the_jobs_publishes_everything_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    clock, sent = Clock(), []
    with reporters(1, clock, sent, R) as (rep,):
        rep.heartbeat()
        waiting = rep.reader().open()
        assert len(sent) == 1
        with caplog.at_level(logging.WARNING, logger="safepoint.reporter"):
            rep.observe_safe_ts(0, retention=R // 2)  # the job keeps less history than this reporter assumes
            rep.observe_safe_ts(1, retention=R // 2)
        assert [e.get("reader_id") for e in events_of(sent)[1:]] == [waiting.reader_id], "what waited is sent at once"
        warnings = [r for r in caplog.records if "larger than the job's retention" in r.getMessage()]
        assert len(warnings) == 1
        rep.reader().open()
        assert events_of(sent)[-1]["type"] == "reader_open", "from then on every hold is published"


def test_after_a_restart_a_hold_opened_before_the_first_heartbeat_is_published() -> None:
    """The job still holds the previous process's bound for the node; the new process does not
    know it, so until its first heartbeat nothing waits."""
    clock, sent = Clock(), [topology(2)]
    engine = Engine(Policy(retention=R, node_lease_ms=10**9, directive_interval_ms=0, stall_ms=0))
    with reporters(2, clock, sent, R) as (n0, n1):
        n1.heartbeat()
        clock.wall += 5_000
        n0.heartbeat()  # the safe point is n1's bound, T0 - R; n0's is 5 s higher
        n0.close(0.1)
        restarted = Reporter("127.0.0.1:1", "n0", cluster="c1", incarnation=1, heartbeat_interval_s=None,
                             mvcc_clock=clock.mvcc, wall_clock=lambda: clock.wall, retention=R, kafka_conf={"log_level": 0})
        restarted._sender.produce = sent.append  # type: ignore[method-assign]
        try:
            reader = restarted.reader(T0 - R + 1_000).open()  # above the safe point, below n0's last bound
            clock.wall += 5_000
            n1.heartbeat()  # n1's bound passes the reader: only the reader itself can hold the safe point now
            safe = [o.value["safe_ts"] for i, v in enumerate(sent) for o in engine.process(v, Position("events", 0, i))
                    if o.channel == DIRECTIVES and o.value["type"] == "compaction"]
            assert safe and max(safe) <= reader.read_ts, (safe, reader.read_ts)
        finally:
            restarted.close(0.1)


def test_the_bound_a_hold_waits_above_never_goes_down() -> None:
    """A clock that steps back lowers the heartbeat's bound, but the job may still hold the higher
    one: a hold between the two is published at once."""
    clock, sent = Clock(), []
    with reporters(1, clock, sent, R) as (rep,):
        rep.heartbeat()
        clock.wall -= 1_000  # the node's clock steps back
        rep.heartbeat()
        sent.clear()
        rep.reader(clock.mvcc() - R + 500).open()  # above the new bound, below the one the job may hold
        assert [e["type"] for e in events_of(sent)] == ["reader_open"]


def test_a_reporter_retention_at_or_below_the_jobs_stays_lazy() -> None:
    clock, sent = Clock(), []
    with reporters(1, clock, sent, R) as (rep,):
        rep.heartbeat()
        rep.observe_safe_ts(0, retention=R)
        rep.reader().open()
        assert len(sent) == 1


def test_retention_must_be_a_non_negative_int() -> None:
    with pytest.raises(ValueError, match="retention must be an int >= 0"):
        Reporter("127.0.0.1:1", "n1", mvcc_clock=lambda: 0, heartbeat_interval_s=None, retention=-1)


def test_a_reader_without_a_namespace_is_refused_below_any_namespaces_bound() -> None:
    """A hold without a namespace pins every namespace: the reporter refuses it below the highest
    bound it knows of (core/tenants.py alerts it as a horizon_violation otherwise)."""
    from safepoint.errors import ReaderRefused

    clock, sent = Clock(), []
    with reporters(1, clock, sent, None) as (rep,):
        rep.observe_safe_ts(100, namespace_safe_ts=300, namespaces={"a": 150})
        with pytest.raises(ReaderRefused, match=r"at 200 refused.*>= 300"):
            rep.reader(200).open()
        rep.reader(160, namespace="a").open()  # a's own bound is 150
        with pytest.raises(ReaderRefused, match="namespace 'b'"):
            rep.reader(200, namespace="b").open()  # b has no hold of its own: namespace_safe_ts
        rep.reader(300).open()
        assert [e["read_ts"] for e in events_of(sent) if e["type"] == "reader_open"] == [160, 300]
