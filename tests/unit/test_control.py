"""The operator's levers (core/control.py): service holds with a TTL, pause and resume, through the
event log: each rule, bad input counted, the job's batches equal replay, and properties."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_pressure import CRIT_AT, EXPIRE_AT, GIB, critical, expired, pressure_run

from safepoint.core import Engine
from safepoint.core.origin import control_partition
from safepoint.core.policy import Policy
from safepoint.replay import final_status

from core_helpers import NodeClient, Run, check_output, topology
from local_job import ORIGINS, position

T0 = 1_700_000_000_000
CTL = control_partition(0)
"""The control topic's partition 0, as a routed partition of the tests' logs."""


def hold(holder: str, ts: int, ttl_ms: int, wall: int, label: str | None = None, cluster: str = "c1") -> dict[str, Any]:
    ev = {"v": 1, "type": "service_hold", "cluster": cluster, "wall_ms": wall, "holder": holder, "ts": ts, "ttl_ms": ttl_ms}
    return ev if label is None else {**ev, "label": label}


def release(holder: str, wall: int) -> dict[str, Any]:
    return {"v": 1, "type": "service_release", "cluster": "c1", "wall_ms": wall, "holder": holder}


def pause(wall: int, reason: str = "restore") -> dict[str, Any]:
    return {"v": 1, "type": "pause", "cluster": "c1", "wall_ms": wall, "reason": reason}


def resume(wall: int) -> dict[str, Any]:
    return {"v": 1, "type": "resume", "cluster": "c1", "wall_ms": wall}


def cluster_of_two(**policy: Any) -> tuple[Run, NodeClient, NodeClient]:
    run = Run(node_lease_ms=10_000, **policy)
    n1, n2 = NodeClient("n1", "c1"), NodeClient("n2", "c1")
    run.feed(n1.hb(T0, 1_000), n2.hb(T0, 1_000), topology(1, T0, {"n1": [], "n2": []}, cluster="c1"))
    return run, n1, n2


def beat(run: Run, n1: NodeClient, n2: NodeClient, wall: int, mvcc: int) -> None:
    run.feed(n1.hb(wall, mvcc), n2.hb(wall, mvcc))


def ignored(run: Run) -> dict[str, int]:
    return dict(run.engine.clusters["c1"].control.ignored)


def test_a_service_hold_keeps_the_safe_point_below_its_ts_until_released() -> None:
    run, n1, n2 = cluster_of_two()
    run.feed(hold("backup", 1_500, 3_600_000, T0 + 1, label="nightly backup"))
    beat(run, n1, n2, T0 + 1_000, 5_000)
    d = run.directives()[-1]
    assert d["safe_ts"] == 1_500
    assert d["blocker"] == {"node": None, "kind": "service", "id": "backup", "ts": 1_500, "age_ms": 1_000,
                            "label": "nightly backup"}, "its age runs on cluster time from when the job applied it"
    beat(run, n1, n2, T0 + 2_000, 9_000)
    assert run.last_safe_ts() == 1_500, "nodes advance, the hold does not let the safe point pass"
    run.feed(release("backup", T0 + 2_001))
    assert run.last_safe_ts() == 9_000, "released: the next round advances"
    [st] = final_status(run.engine)["clusters"]
    assert st["service_holds"] == [] and st["hold_counts"]["service"] == 0


def test_ttl_expiry_at_the_millisecond_with_an_alert() -> None:
    run, n1, n2 = cluster_of_two()
    run.feed(hold("cdc", 1_500, 10_000, T0 + 5, label="changefeed 7"))  # applied at cluster time T0
    beat(run, n1, n2, T0 + 10_000, 4_000)  # cluster time == applied + ttl: still held
    assert run.last_safe_ts() == 1_500 and run.alerts("service_hold_expired") == []
    beat(run, n1, n2, T0 + 10_001, 4_000)  # one ms past: expired, and the same round advances
    [a] = run.alerts("service_hold_expired", "raised")
    assert "cdc (changefeed 7)" in a["detail"] and a["value"] == 1 and a["threshold"] == 10_000
    assert run.last_safe_ts() == 4_000
    run.feed(hold("cdc", 1_800, 10_000, T0 + 10_004))  # a renewal that came too late: the hold is gone
    assert ignored(run) == {"below_safe_ts": 1}, "and its ts now lies below the safe point: refused"
    run.feed(hold("cdc", 4_100, 10_000, T0 + 10_007))  # set again, at or above the safe point
    assert run.alerts("service_hold_expired", "cleared")
    beat(run, n1, n2, T0 + 11_000, 8_000)
    assert run.last_safe_ts() == 4_100


def test_renewals_push_the_expiry_out() -> None:
    run, n1, n2 = cluster_of_two()
    for i in range(5):
        run.feed(hold("backup", 1_500, 10_000, T0 + i * 8_000))
        beat(run, n1, n2, T0 + i * 8_000 + 7_000, 5_000 + i)
    assert run.last_safe_ts() == 1_500 and run.alerts("service_hold_expired") == []
    [st] = final_status(run.engine)["clusters"]
    # the last renewal was applied when cluster time was the beat before it, T0 + 31_000
    assert st["service_holds"][0]["expires_after_ms"] == T0 + 31_000 + 10_000
    assert st["service_holds"][0]["since_wall_ms"] == T0, "since the first set, not the last renewal"


def test_a_hold_below_the_safe_point_is_refused_with_an_alert() -> None:
    run, n1, n2 = cluster_of_two()
    beat(run, n1, n2, T0 + 1_000, 5_000)
    assert run.last_safe_ts() == 5_000
    run.feed(hold("late-backup", 4_999, 60_000, T0 + 1_001))
    [a] = run.alerts("service_hold_refused", "raised")
    assert a["value"] == 4_999 and a["threshold"] == 5_000 and "refused" in a["detail"]
    assert ignored(run) == {"below_safe_ts": 1}
    beat(run, n1, n2, T0 + 2_000, 9_000)
    assert run.last_safe_ts() == 9_000, "a refused hold holds nothing"
    run.feed(hold("late-backup", 9_000, 60_000, T0 + 2_001))  # at the safe point: protected (inclusive)
    assert run.alerts("service_hold_refused", "cleared")
    beat(run, n1, n2, T0 + 3_000, 12_000)
    assert run.last_safe_ts() == 9_000


def test_pause_holds_the_safe_point_and_resume_releases_it() -> None:
    run, n1, n2 = cluster_of_two()
    beat(run, n1, n2, T0 + 1_000, 5_000)
    run.feed(pause(T0 + 1_001, reason="restore of orders"))
    [a] = run.alerts("paused", "raised")
    assert "restore of orders" in a["detail"]
    announced = run.directives()[-1]
    assert announced["safe_ts"] == 5_000 and announced["paused"] == {"reason": "restore of orders",
                                                                     "since_wall_ms": T0 + 1_000}
    before = len(run.directives())
    beat(run, n1, n2, T0 + 2_000, 9_000)
    assert len(run.directives()) == before, "paused: no directive advances"
    [st] = final_status(run.engine)["clusters"]
    assert st["paused"] is True and st["pause"] == {"reason": "restore of orders", "since_wall_ms": T0 + 1_000}
    outs = run.feed(resume(T0 + 2_001))
    assert [o.value["safe_ts"] for o in outs if o.value.get("type") == "compaction"] == [9_000], "released at resume"
    assert run.alerts("paused", "cleared")


def test_pause_suspends_forced_expiry() -> None:
    run, n1 = pressure_run(max_reader_lifetime_ms=0)
    run.feed(n1.open("r1", 9_000, T0))
    critical(run, n1, T0 + 10_000, CRIT_AT)
    run.feed({k: v for k, v in pause(CRIT_AT + 1).items() if k != "cluster"})  # the default cluster, as n1's
    run.feed(n1.hb(EXPIRE_AT, 10_000, pinned_bytes=25 * GIB), n1.hb(EXPIRE_AT + 50_000, 10_000, pinned_bytes=25 * GIB))
    assert expired(run) == [], "no forced expiry while paused"
    state = run.engine.clusters["default"]
    assert state.control.ignored["expiry_while_paused"] >= 1


def test_bad_control_input_is_counted_or_dead_lettered() -> None:
    run, n1, n2 = cluster_of_two()
    run.feed(release("nobody", T0 + 1), resume(T0 + 2))
    again = {**hold("backup", 1_500, 60_000, T0 + 3), "action_id": "a-1"}
    run.feed(again, again)  # a repeated delivery of one action
    assert ignored(run) == {"unknown_holder": 1, "not_paused": 1, "repeated": 1}
    outs = run.feed({"v": 1, "type": "service_hold", "cluster": "c1", "wall_ms": T0, "holder": "x", "ttl_ms": 5})
    assert [o.channel for o in outs] == ["deadletter"] and "ts" in outs[0].value["error"]
    outs = run.feed({"v": 1, "type": "pause", "cluster": "c1", "wall_ms": T0})
    assert [o.channel for o in outs] == ["deadletter"]
    outs = run.feed(hold("y", 1, 0, T0 + 9))
    assert [o.channel for o in outs] == ["deadletter"], "ttl_ms must be at least 1"


def control_log(seed: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Two nodes advancing with service holds set, renewed, released and expiring, a pause and a
    resume, spread over three events partitions (cluster events on their own) and the control topic."""
    rng = random.Random(seed)
    n1, n2 = NodeClient("n1", "c1"), NodeClient("n2", "c1")
    events: list[tuple[int, dict[str, Any]]] = [(0, topology(1, T0, {"n1": [], "n2": []}, cluster="c1"))]
    mvcc = 1_000
    for i in range(120):
        wall = T0 + i * 500
        mvcc += rng.randint(0, 300)
        events += [(1, n1.hb(wall, mvcc)), (2, n2.hb(wall + 1, mvcc))]
        r = rng.random()
        if i in (40, 80):
            events.append((CTL, pause(wall + 2)))
        elif i in (60, 81, 100):
            events.append((CTL, resume(wall + 2)))
        elif r < 0.15:  # mostly at the nodes' time (accepted), some below the safe point (refused)
            ts = mvcc - rng.choice([0, 0, 0, 400])
            events.append((CTL, hold(rng.choice(["backup", "cdc"]), ts, rng.choice([2_000, 8_000]), wall + 2)))
        elif r < 0.2:
            events.append((CTL, release(rng.choice(["backup", "cdc"]), wall + 2)))
    offsets: dict[int, int] = {}
    msgs = []
    for part, ev in events:
        msgs.append((part, offsets.setdefault(part, 0), (ev.get("node") or "c1").encode(), json.dumps(ev).encode()))
        offsets[part] += 1
    return msgs


def test_the_jobs_batches_give_replays_outputs_with_control_events() -> None:
    from test_batch import job_equals_replay

    msgs = control_log(7)
    got = job_equals_replay(msgs, list(range(40, len(msgs), 53)), Policy(node_lease_ms=5_000), buckets=4)
    kinds = {a["kind"] for _, a in got["al"]}
    assert {"service_hold_expired", "paused"} <= kinds, kinds


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_the_safe_point_never_passes_a_live_service_hold(seed: int) -> None:
    msgs = control_log(seed)
    engine = Engine(Policy(node_lease_ms=5_000), origins=ORIGINS)
    last = None
    for p, o, k, v in sorted(msgs, key=lambda m: json.loads(m[3] or b"{}")["wall_ms"]):
        outs = engine.process(v, position(p, o, k))
        state = engine.clusters.get("c1")
        for out in outs:
            if out.value.get("type") == "compaction":
                # >=: a change of the holds or the pause is announced at the same safe point
                assert last is None or out.value["safe_ts"] >= last
                last = out.value["safe_ts"]
        if state is not None and state.safe_ts is not None:
            for holder, h in state.control.holds.items():
                assert h["ts"] >= state.safe_ts, f"{holder} at {h['ts']} passed by safe_ts {state.safe_ts}"


def test_a_service_hold_outlives_a_lost_checkpoint() -> None:
    """Directives carry the service holds; a job that lost its checkpoint seeds them from the
    directives topic (core/recovery.py), so the recovered safe point does not pass a backup."""
    from safepoint.core.recovery import StartPlan, seeds_from_directives

    run, n1, n2 = cluster_of_two()
    run.feed(hold("backup", 1_500, 3_600_000, T0 + 1, label="nightly"))
    beat(run, n1, n2, T0 + 1_000, 5_000)
    assert run.directives()[-1]["service_holds"]["backup"]["ts"] == 1_500
    seeds = seeds_from_directives(o.value for o in run.outputs if o.channel == "directives")
    again = Run(node_lease_ms=10_000, start=StartPlan(seeds))
    again.feed(topology(2, T0 + 2_000, {"n1": [], "n2": []}, cluster="c1"),
               n1.snapshot(T0 + 2_000, [], []), n2.snapshot(T0 + 2_000, [], []))
    beat(again, n1, n2, T0 + 3_000, 9_000)
    assert again.engine.clusters["c1"].safe_ts == 1_500 and again.directives() == [], "still held after the loss"
    again.feed(release("backup", T0 + 3_001))
    beat(again, n1, n2, T0 + 4_000, 9_500)
    assert again.last_safe_ts() == 9_500


# -- a publisher's clock orders nothing: log order, TTLs on cluster time ------------------------

TEN_YEARS_MS = 10 * 365 * 86_400_000


def test_a_hold_stamped_ten_years_ahead_still_expires_one_ttl_of_cluster_time_after_it_was_applied() -> None:
    run, n1, n2 = cluster_of_two()
    run.feed(hold("backup", 1_500, 10_000, T0 + TEN_YEARS_MS))
    assert run.engine.clusters["c1"].cluster_time == T0, "a control event does not move cluster time"
    beat(run, n1, n2, T0 + 10_000, 4_000)
    assert run.last_safe_ts() == 1_500
    beat(run, n1, n2, T0 + 10_001, 4_000)
    assert run.alerts("service_hold_expired", "raised") and run.last_safe_ts() == 4_000
    assert run.alerts("missing_node") == [], "no node went stale by a jump of cluster time"


def test_a_resume_from_a_clock_behind_the_pauses_resumes() -> None:
    run, n1, n2 = cluster_of_two()
    beat(run, n1, n2, T0 + 1_000, 5_000)
    run.feed(pause(T0 + 60_000, reason="restore"))  # the operator's laptop runs a minute ahead
    beat(run, n1, n2, T0 + 2_000, 9_000)
    outs = run.feed(resume(T0 + 1_500))  # another machine, behind both
    assert [o.value["safe_ts"] for o in outs if o.value.get("type") == "compaction"] == [9_000]
    assert run.alerts("paused", "cleared") and ignored(run) == {}


def test_two_actions_in_the_same_millisecond_both_apply_in_log_order() -> None:
    run, n1, n2 = cluster_of_two()
    run.feed(hold("backup", 1_500, 60_000, T0 + 7), hold("cdc", 1_200, 60_000, T0 + 7))
    run.feed(release("backup", T0 + 7))
    beat(run, n1, n2, T0 + 1_000, 5_000)
    assert sorted(run.engine.clusters["c1"].control.holds) == ["cdc"] and run.last_safe_ts() == 1_200


# -- a holder learns what happened to its action ----------------------------------------------

def acted(ev: dict[str, Any], action_id: str) -> dict[str, Any]:
    return {**ev, "action_id": action_id}


def outcomes(run: Run) -> dict[str, tuple[str, str | None]]:
    [st] = final_status(run.engine)["clusters"]
    return {a["id"]: (a["outcome"], a["reason"]) for a in st["actions"]}


def test_every_action_has_its_outcome_in_the_status() -> None:
    run, n1, n2 = cluster_of_two()
    beat(run, n1, n2, T0 + 1_000, 5_000)
    run.feed(acted(hold("backup", 6_000, 10_000, T0 + 1_001), "a1"),
             acted(hold("late", 4_000, 10_000, T0 + 1_002), "a2"),
             acted(resume(T0 + 1_003), "a3"),
             acted(release("nobody", T0 + 1_004), "a4"),
             acted(pause(T0 + 1_005), "a5"),
             acted(resume(T0 + 1_006), "a6"))
    assert outcomes(run) == {"a1": ("applied", None), "a2": ("refused", "below_safe_ts"),
                             "a3": ("ignored", "not_paused"), "a4": ("ignored", "unknown_holder"),
                             "a5": ("applied", None), "a6": ("applied", None)}
    [st] = final_status(run.engine)["clusters"]
    assert st["service_holds"][0]["action_id"] == "a1"
    beat(run, n1, n2, T0 + 11_001, 7_000)  # a1's hold, applied at T0 + 1_000, runs out
    assert outcomes(run)["a1"] == ("expired", "ttl")
    run.feed(acted(hold("backup", 7_000, 10_000, T0 + 11_002), "a1"))  # the same action again: nothing
    assert outcomes(run)["a1"] == ("expired", "ttl") and ignored(run)["repeated"] == 1
    for out in run.outputs:  # every directive and alert still matches its schema
        check_output(out)


def test_the_status_keeps_the_last_actions_only() -> None:
    from safepoint.core.control import ACTIONS_KEPT

    run, n1, n2 = cluster_of_two()
    run.feed(*(acted(hold("cdc", 1_000 + i, 60_000, T0 + i), f"a{i}") for i in range(ACTIONS_KEPT + 10)))
    kept = list(outcomes(run))
    assert len(kept) == ACTIONS_KEPT and kept[0] == "a10" and kept[-1] == f"a{ACTIONS_KEPT + 9}"


# -- a pause outlives a lost checkpoint ----------------------------------------------------------

def test_a_pause_outlives_a_lost_checkpoint() -> None:
    from safepoint.core.recovery import StartPlan, seeds_from_directives

    run, n1, n2 = cluster_of_two()
    beat(run, n1, n2, T0 + 1_000, 5_000)
    run.feed(pause(T0 + 1_001, reason="restore of orders"))
    assert run.directives()[-1]["paused"]["reason"] == "restore of orders", "the pause rides on a directive at once"
    seeds = seeds_from_directives(o.value for o in run.outputs if o.channel == "directives")
    again = Run(node_lease_ms=10_000, start=StartPlan(seeds))
    again.feed(topology(2, T0 + 2_000, {"n1": [], "n2": []}, cluster="c1"),
               n1.snapshot(T0 + 2_000, [], []), n2.snapshot(T0 + 2_000, [], []))
    beat(again, n1, n2, T0 + 3_000, 9_000)
    assert again.directives() == [], "still paused after the loss: nothing advances"
    [st] = final_status(again.engine)["clusters"]
    assert st["paused"] is True and st["pause"]["reason"] == "restore of orders"
    outs = again.feed(resume(T0 + 3_001))
    assert [o.value["safe_ts"] for o in outs if o.value.get("type") == "compaction"] == [9_000]
    assert again.alerts("paused", "cleared"), "the resume clears the pause alert the old job raised"
    assert "paused" not in again.directives()[-1]


def test_a_resume_is_carried_too_so_a_later_loss_does_not_pause_again() -> None:
    from safepoint.core.recovery import seeds_from_directives

    run, n1, n2 = cluster_of_two()
    beat(run, n1, n2, T0 + 1_000, 5_000)
    run.feed(pause(T0 + 1_001), resume(T0 + 1_002))  # nothing to advance at the resume
    assert "paused" not in run.directives()[-1], "the resume was announced at the same safe point"
    seeds = seeds_from_directives(o.value for o in run.outputs if o.channel == "directives")
    assert seeds["c1"].paused is None


def test_a_hold_below_what_the_store_compacted_is_refused_and_the_status_counts_compactions() -> None:
    """An etcd agent's heartbeat says its store's compacted revision (``compacted_ts``): a hold below
    it would protect history that is gone already, even above every bound the job sent."""
    run = Run(node_lease_ms=10_000, retention=100)
    agent = NodeClient("etcd-agent", "c1")
    run.feed(topology(1, T0, {"etcd-agent": []}, cluster="c1"), agent.hb(T0, 1_000, compacted_ts=0))
    assert run.last_safe_ts() == 900
    run.feed(agent.hb(T0 + 1_000, 1_200, compacted_ts=900))  # it compacted at the directive's safe_ts
    run.feed(agent.hb(T0 + 2_000, 1_300, compacted_ts=1_250))  # something else compacted past safe_ts 1_200
    run.feed({**hold("backup", 1_220, 60_000, T0 + 2_001), "action_id": "a-1"})
    assert ignored(run) == {"below_compacted_ts": 1}, "above the safe_ts sent, below what the store compacted"
    [refused] = run.alerts("service_hold_refused", "raised")
    assert "below compacted_ts 1250" in refused["detail"] and "compacted that history already" in refused["detail"]
    run.feed(hold("backup", 1_250, 60_000, T0 + 2_002))  # at it: that revision is still readable
    assert run.alerts("service_hold_refused", "cleared")
    run.feed(agent.hb(T0 + 3_000, 2_000, compacted_ts=1_250))  # the same figure again: no new compaction
    [st] = final_status(run.engine)["clusters"]
    assert (st["compacted_ts"], st["compactions"]) == (1_250, 2)
    assert [(a["id"], a["outcome"], a["reason"]) for a in st["actions"]] == [("a-1", "refused", "below_compacted_ts")]
    assert run.last_safe_ts() == 1_250
    assert (st["blocker"]["kind"], st["blocker"]["id"]) == ("service", "backup"), "the status names what the round did"


def test_the_jobs_batches_give_replays_outputs_with_compacted_revisions() -> None:
    from test_batch import job_equals_replay

    msgs = []
    rev = 1_000
    for i in range(120):
        wall = T0 + i * 500
        rev += 7
        ev: dict[str, Any] = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "agent", "incarnation": 1,
                              "seq": i + 1, "wall_ms": wall, "mvcc_now": rev, "compacted_ts": rev - 40 - (i % 5) * 3}
        msgs.append((0, 2 * i, b"agent", json.dumps(ev).encode()))
        below = i % 3 == 0
        held = hold("h", rev - 60 if below else rev - 10, 2_000, wall + 1)
        msgs.append((CTL, i, b"c1", json.dumps(held).encode()))
    got = job_equals_replay(msgs, list(range(17, len(msgs), 29)), Policy(node_lease_ms=5_000, retention=30), buckets=4)
    assert any(a["kind"] == "service_hold_refused" for _, a in got["al"])
