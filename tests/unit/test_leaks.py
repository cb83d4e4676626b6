"""Leaked holds (core/leaks.py): a lost reader_close is found from the heartbeat's counts, alerted,
and healed by the snapshot the node sends when asked; a live reader is never dropped."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000
WINDOW = 10_000


def setup() -> tuple[Run, NodeClient]:
    run = Run(node_lease_ms=60_000, leak_window_ms=WINDOW)
    n1 = NodeClient("n1", "c1")
    run.feed(n1.hb(T0, 1_000, active_readers=0, active_txs=0), topology(1, T0, {"n1": []}, cluster="c1"))
    return run, n1


def requests(run: Run) -> list[dict[str, Any]]:
    return [o.value for o in run.outputs if o.value.get("type") == "snapshot_request"]


def test_a_lost_close_is_alerted_after_the_window_and_healed_by_the_snapshot() -> None:
    run, n1 = setup()
    run.feed(n1.open("r-lost", 1_100, T0 + 1, label="report"), n1.open("r-live", 1_200, T0 + 2))
    run.feed(n1.hb(T0 + 1_000, 2_000, active_readers=2, active_txs=0))
    # the node closed r-lost, but its reader_close never reached the job
    run.feed(n1.hb(T0 + 2_000, 3_000, active_readers=1, active_txs=0))
    run.feed(n1.hb(T0 + 2_000 + WINDOW - 1, 4_000, active_readers=1, active_txs=0))
    assert run.alerts("leaked_hold") == [] and requests(run) == [], "not before the window"
    assert run.last_safe_ts() == 1_100, "the lost reader still pins history"
    run.feed(n1.hb(T0 + 2_000 + WINDOW, 4_000, active_readers=1, active_txs=0))
    [a] = run.alerts("leaked_hold", "raised")
    assert a["node"] == "n1" and "reader r-lost" in a["detail"] and "r-live" not in a["detail"]
    [req] = requests(run)
    assert req["node"] == "n1" and req["reason"] == "leaked_hold"
    [out] = [o for o in run.outputs if o.value.get("type") == "snapshot_request"]
    assert out.key == "c1/n1", "keyed <cluster>/<node> like every per-node directive"
    # the reporter answers with its complete set: r-live only
    run.feed(n1.snapshot(T0 + 2_000 + WINDOW + 5, [{"reader_id": "r-live", "read_ts": 1_200, "opened_wall_ms": T0 + 2}], []))
    assert run.alerts("leaked_hold", "cleared")
    run.feed(n1.hb(T0 + 2_000 + WINDOW + 10, 5_000, active_readers=1, active_txs=0))
    assert run.last_safe_ts() == 1_200, "healed: only the live reader holds"


def test_the_request_repeats_every_window_while_the_leak_lasts() -> None:
    run, n1 = setup()
    run.feed(n1.open("r1", 1_100, T0 + 1))
    for i in range(1, 40):
        run.feed(n1.hb(T0 + i * 1_000, 2_000, active_readers=0, active_txs=0))
    assert len(run.alerts("leaked_hold", "raised")) == 1
    assert len(requests(run)) == 3, "at the window, then every window (no answer came)"


def test_fewer_held_than_reported_is_normal_and_missing_counts_are_not_judged() -> None:
    run, n1 = setup()
    run.feed(n1.open("r1", 1_100, T0 + 1))
    for i in range(1, 30):  # lazy registration: the node has more open than it published
        run.feed(n1.hb(T0 + i * 1_000, 2_000, active_readers=50, active_txs=3))
    for i in range(30, 60):  # a node that does not send the counts
        run.feed(n1.hb(T0 + i * 1_000, 2_000))
    assert run.alerts("leaked_hold") == [] and requests(run) == []


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["open", "close", "lose", "beat"]), st.integers(0, 5)), min_size=5, max_size=60))
def test_lost_closes_heal_and_live_readers_are_never_dropped(steps: list[tuple[str, int]]) -> None:
    """A node (the truth: ``open_now``) whose closes are sometimes lost on the way; it answers
    every snapshot request with its complete set, as the Reporter does. The job never drops a
    reader that is open, and after enough beats it holds exactly the open ones."""
    run, n1 = setup()
    open_now: dict[str, int] = {}
    wall, n = T0, 0

    def beat() -> None:
        nonlocal wall
        wall += 3_000
        before = len(requests(run))
        run.feed(n1.hb(wall, 10_000, active_readers=len(open_now), active_txs=0))
        if len(requests(run)) > before:  # the Reporter answers at once with its complete set
            wall += 1
            run.feed(n1.snapshot(wall, [{"reader_id": r, "read_ts": ts, "opened_wall_ms": T0} for r, ts in open_now.items()], []))

    for action, x in steps:
        rid = f"r{x}"
        if action == "open" and rid not in open_now:
            n += 1
            wall += 1
            open_now[rid] = 1_000 + n
            run.feed(n1.open(rid, open_now[rid], wall))
        elif action in ("close", "lose") and rid in open_now:
            del open_now[rid]
            wall += 1
            if action == "close":
                run.feed(n1.close(rid, wall))
        elif action == "beat":
            beat()
        held = set(run.engine.nodes[("c1", "n1")].holds.of("reader"))
        assert set(open_now) <= held, f"a live reader was dropped: {set(open_now) - held}"
    for _ in range(2 + 2 * WINDOW // 3_000):
        beat()
    assert set(run.engine.nodes[("c1", "n1")].holds.of("reader")) == set(open_now), "every lost close was healed"
    assert run.alerts("leaked_hold", "raised") == [] or run.alerts("leaked_hold", "cleared")
