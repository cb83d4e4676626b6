"""One node's holds: readers, transactions, groups, retention, restarts, dedupe, snapshots.

Each test cites the CONTRACT section (or seed) it checks. Most run the whole ``Engine`` with a
one- or two-node topology and read the node's minimum off the directives it produces.
"""

from __future__ import annotations

import json

from safepoint.core import NodeState, NodeUpdate, Policy

from core_helpers import INT64_MIN, NodeClient, Run, topology

WALL = 1_700_000_000_000


def single(run: Run, groups: list[str] | None = None) -> NodeClient:
    run.feed(topology(1, WALL, {"n1": groups or []}))
    return NodeClient("n1")


def test_no_heartbeat_means_unknown_minimum() -> None:
    """CONTRACT Semantics: Node minimum: until its first heartbeat the node's minimum is unknown."""
    run = Run()
    n1 = single(run)
    outs = run.feed(n1.open("r1", 500, WALL))
    assert run.directives() == []
    [a] = run.alerts("unknown_node_min", "raised")
    assert a["node"] == "n1" and "no heartbeat" in a["detail"]
    assert [o.channel for o in outs] == ["alerts"]
    run.feed(n1.hb(WALL + 1, 1_000))
    assert run.alerts("unknown_node_min", "cleared")
    [d] = run.directives()
    assert d["safe_ts"] == 500


def test_reader_holds_and_release() -> None:
    """CONTRACT Events reader_open/reader_close; Semantics: a hold is an open reader (read_ts)."""
    run = Run()
    n1 = single(run)
    run.feed(n1.open("r1", 500, WALL, label="report-job"), n1.hb(WALL + 10, 1_000))
    [d] = run.directives()
    assert d["safe_ts"] == 500
    assert d["blocker"] == {"node": "n1", "kind": "reader", "id": "r1", "ts": 500, "age_ms": 10, "label": "report-job"}
    assert d["basis"] == {"n1": {"incarnation": 0, "seq": 1, "local_min": 500}}
    run.feed(n1.close("r1", WALL + 20))
    d = run.directives()[-1]
    assert d["safe_ts"] == 1_000
    assert d["blocker"] == {"node": "n1", "kind": "retention", "id": None, "ts": 1_000, "age_ms": None, "label": None}


def test_smallest_of_several_readers_wins() -> None:
    """CONTRACT Semantics: local_min(node) = the smallest hold on the node."""
    run = Run()
    n1 = single(run)
    run.feed(n1.open("a", 700, WALL), n1.open("b", 400, WALL), n1.open("c", 900, WALL), n1.hb(WALL, 1_000))
    assert run.last_safe_ts() == 400
    run.feed(n1.close("b", WALL + 1))
    assert run.last_safe_ts() == 700
    assert run.directives()[-1]["blocker"]["id"] == "a"


def test_close_of_unknown_reader_or_tx_is_harmless() -> None:
    """CONTRACT Dead letters: applied or ignored, never an error; closing what is not open changes nothing."""
    run = Run()
    n1 = single(run)
    run.feed(n1.open("r1", 500, WALL), n1.hb(WALL, 1_000))
    outs = run.feed(n1.close("nope", WALL), n1.end("nope", WALL))
    assert outs == []
    assert run.counts["applied"] == 5
    assert run.last_safe_ts() == 500


def test_reader_id_reopened_replaces_its_timestamp() -> None:
    """CONTRACT Events reader_open: one reader id is one reader; a re-open moves its read_ts."""
    run = Run()
    n1 = single(run)
    run.feed(n1.open("r1", 500, WALL), n1.hb(WALL, 1_000), n1.open("r1", 800, WALL))
    assert [d["safe_ts"] for d in run.directives()] == [500, 800]


def test_transaction_holds_until_end() -> None:
    """CONTRACT Events tx_begin/tx_end; Semantics: an undecided transaction holds at begin_ts."""
    run = Run()
    n1 = single(run)
    run.feed(n1.begin("t1", 300, WALL, label="etl"), n1.hb(WALL + 5, 1_000))
    [d] = run.directives()
    assert d["safe_ts"] == 300
    assert d["blocker"] == {"node": "n1", "kind": "tx", "id": "t1", "ts": 300, "age_ms": 5, "label": "etl"}
    run.feed(n1.end("t1", WALL + 6, outcome="abort"))
    assert run.last_safe_ts() == 1_000


def test_tx_end_commit_with_commit_ts_releases() -> None:
    """CONTRACT Events tx_end: `outcome` commit, opt. `commit_ts`: decided and applied on this node."""
    run = Run()
    n1 = single(run)
    run.feed(n1.begin("t1", 300, WALL), n1.hb(WALL, 1_000), n1.end("t1", WALL, outcome="commit", commit_ts=950))
    assert run.last_safe_ts() == 1_000


def test_prepared_transaction_is_a_hold_and_named_so() -> None:
    """CONTRACT Events tx_prepare: prepared, decision unknown (in doubt); seed 002: prepared txs pin history."""
    run = Run()
    n1 = single(run)
    run.feed(n1.begin("t1", 300, WALL), n1.prepare("t1", WALL, "n2", ["n1", "n2"]), n1.hb(WALL, 1_000))
    [d] = run.directives()
    assert d["safe_ts"] == 300
    assert d["blocker"]["kind"] == "prepared_tx" and d["blocker"]["id"] == "t1"
    state = run.engine.nodes[("default", "n1")]
    tx = state.holds.of("tx")["t1"]
    assert [tx.prepared, tx.coordinator, tx.participants] == [True, "n2", ["n1", "n2"]]
    run.feed(n1.end("t1", WALL + 1))
    assert run.last_safe_ts() == 1_000


def test_prepare_of_unknown_tx_is_applied_without_a_hold() -> None:
    """CONTRACT Events tx_prepare has no begin_ts: a prepare for a transaction never begun cannot hold anything."""
    run = Run()
    n1 = single(run)
    outs = run.feed(n1.hb(WALL, 1_000), n1.prepare("ghost", WALL))
    assert run.counts["applied"] == 3
    assert [d["safe_ts"] for d in run.directives()] == [1_000]
    assert all(o.channel == "directives" for o in outs)


def test_retention_bound() -> None:
    """CONTRACT Semantics: a node with no reader and no transaction holds at mvcc_now - retention."""
    run = Run(retention=250)
    n1 = single(run)
    run.feed(n1.hb(WALL, 1_000))
    [d] = run.directives()
    assert d["safe_ts"] == 750
    assert d["blocker"] == {"node": "n1", "kind": "retention", "id": None, "ts": 750, "age_ms": None, "label": None}
    run.feed(n1.open("r", 600, WALL), n1.hb(WALL, 2_000))
    assert run.last_safe_ts() == 750, "a reader below the retention bound holds"
    run.feed(n1.close("r", WALL))
    assert run.last_safe_ts() == 1_750


def test_retention_bound_is_the_hold_when_readers_are_newer() -> None:
    """CONTRACT Semantics: holds = readers, txs, groups and mvcc_now - retention; the smallest wins."""
    run = Run(retention=500)
    n1 = single(run)
    run.feed(n1.open("r", 900, WALL), n1.begin("t", 950, WALL), n1.hb(WALL, 1_000))
    assert run.directives()[-1]["blocker"]["kind"] == "retention"
    assert run.last_safe_ts() == 500


def test_retention_zero_disables_the_bound() -> None:
    """CONTRACT Semantics: retention 0 disables the bound (a quiet node holds at mvcc_now)."""
    run = Run(retention=0)
    n1 = single(run)
    run.feed(n1.hb(WALL, 12_345))
    assert run.last_safe_ts() == 12_345


def test_leader_group_without_published_time_makes_minimum_unknown() -> None:
    """CONTRACT Semantics: while a group the node leads has no published time yet, the minimum is unknown.

    Seed 000 (Ignite): the minimum is published only after a checkpoint; if it is not published yet
    the current iteration of compaction is aborted.
    """
    run = Run()
    n1 = single(run)
    run.feed(n1.hb(WALL, 1_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": None}]))
    assert run.directives() == []
    [a] = run.alerts("unknown_node_min", "raised")
    assert "g1" in a["detail"] and a["node"] == "n1" and a["severity"] == "warning"
    run.feed(n1.hb(WALL + 1, 1_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": 400}]))
    assert run.alerts("unknown_node_min", "cleared")
    [d] = run.directives()
    assert d["safe_ts"] == 400
    assert d["blocker"] == {"node": "n1", "kind": "group", "id": "g1", "ts": 400, "age_ms": None, "label": None}


def test_follower_group_without_published_time_does_not_block() -> None:
    """CONTRACT Semantics: only a group the node *leads* without a published time makes it unknown
    (the group itself needs a leader: n2 leads it here, see test_groups.py)."""
    run = Run()
    run.feed(topology(1, WALL, {"n1": [], "n2": []}))
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(n2.hb(WALL, 1_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": 1_000},
                                        {"group": "g2", "leader": True, "published_min_tx_time": 1_000}]))
    run.feed(n1.hb(WALL, 1_000, groups=[{"group": "g1", "leader": False, "published_min_tx_time": None}, {"group": "g2"}]))
    assert run.last_safe_ts() == 1_000
    assert run.alerts("unknown_node_min") == [] and run.alerts("leaderless_group") == []


def test_published_group_time_is_a_hold_even_on_a_follower() -> None:
    """CONTRACT Semantics: a group's published_min_tx_time is a hold."""
    run = Run()
    run.feed(topology(1, WALL, {"n1": [], "n2": []}))
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    run.feed(n2.hb(WALL, 5_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": 4_000}]))
    run.feed(n1.hb(WALL, 1_000, groups=[{"group": "g1", "leader": False, "published_min_tx_time": 600}]))
    assert run.last_safe_ts() == 600
    run.feed(n1.hb(WALL, 2_000, groups=[{"group": "g1", "leader": False, "published_min_tx_time": 1_500}]))
    assert run.last_safe_ts() == 1_500


def test_heartbeat_without_groups_keeps_the_last_reported_groups() -> None:
    """CONTRACT Events heartbeat: `groups` is optional; an omitted list is not an empty one."""
    run = Run()
    n1 = single(run, groups=["g1"])
    run.feed(n1.hb(WALL, 1_000, groups=[{"group": "g1", "leader": True, "published_min_tx_time": 900}]))
    run.feed(n1.hb(WALL + 1, 2_000))
    assert run.alerts("missing_group") == []
    assert run.last_safe_ts() == 900


GRACE = Policy().incarnation_grace_ms


def test_restart_drops_readers_and_unprepared_txs_after_the_grace_but_keeps_prepared() -> None:
    """Node restart: the older incarnation's readers and unprepared transactions stay held until it
    has been silent for incarnation_grace_ms after the newer one appeared (a newer incarnation does
    not prove the older process dead), then go; prepared transactions stay until a tx_end arrives."""
    run = Run()
    n1 = single(run)
    run.feed(
        n1.open("r", 100, WALL),
        n1.begin("t-open", 200, WALL),
        n1.begin("t-prep", 300, WALL),
        n1.prepare("t-prep", WALL),
        n1.hb(WALL, 1_000),
    )
    assert run.last_safe_ts() == 100
    n1.restart()
    run.feed(n1.hb(WALL + 1, 1_100))
    state = run.engine.nodes[("default", "n1")]
    assert set(state.holds.of("reader")) == {"r@0"} and set(state.holds.of("tx")) == {"t-open@0", "t-prep"}, "held under id@incarnation"
    assert run.last_safe_ts() == 100
    run.feed(n1.hb(WALL + GRACE - 1, 1_100))
    assert run.last_safe_ts() == 100, "not silent for the grace yet"
    run.feed(n1.hb(WALL + 1 + GRACE, 1_100))
    d = run.directives()[-1]
    assert d["safe_ts"] == 300
    assert d["blocker"]["kind"] == "prepared_tx" and d["blocker"]["id"] == "t-prep"
    assert d["basis"]["n1"] == {"incarnation": 1, "seq": 2, "local_min": 300}
    assert set(state.holds.of("reader")) == set() and set(state.holds.of("tx")) == {"t-prep"}
    assert run.alerts("duplicate_node") == [], "a restart is no second process"
    # a second restart keeps the prepared tx still
    n1.restart()
    run.feed(n1.hb(WALL + 2 + GRACE, 1_200), n1.hb(WALL + 2 + 2 * GRACE, 1_200))
    assert set(state.holds.of("tx")) == {"t-prep"}
    run.feed(n1.end("t-prep", WALL + 3 + 2 * GRACE, outcome="abort"))
    assert run.last_safe_ts() == 1_200


def test_an_older_process_that_still_speaks_is_a_second_live_process() -> None:
    """Two live processes under one node id: the older one's reader counts while it speaks, a critical
    duplicate_node names both incarnations, and its holds go once it is silent for node_lease_ms."""
    run = Run(node_lease_ms=10_000)
    a = single(run)
    b = NodeClient("n1", incarnation=5)
    run.feed(a.open("long", 100, WALL), a.hb(WALL, 1_000))
    run.feed(b.hb(WALL + 1, 1_000), b.open("r", 900, WALL + 2))
    assert run.last_safe_ts() == 100
    for k in range(1, 4):  # both speak, past the grace
        run.feed(a.hb(WALL + k * GRACE, 1_000 + k), b.hb(WALL + k * GRACE + 1, 1_000 + k))
    assert run.last_safe_ts() == 100, "the older process's reader is never passed while it speaks"
    (raised,) = run.alerts("duplicate_node", "raised")
    assert raised["severity"] == "critical" and raised["node"] == "n1" and (raised["value"], raised["threshold"]) == (0, 5)
    state = run.engine.nodes[("default", "n1")]
    assert set(state.holds.of("reader")) == {"long@0", "r"}
    run.feed(a.open("second", 150, WALL + 3 * GRACE + 2))
    assert set(state.holds.of("reader")) == {"long@0", "second@0", "r"}
    run.feed(a.close("long", WALL + 3 * GRACE + 3))  # the older process closes its own reader
    assert set(state.holds.of("reader")) == {"second@0", "r"} and run.last_safe_ts() == 150
    # a falls silent: after a lease of b's messages its holds go and the alert clears
    for k in range(1, 12):
        run.feed(b.hb(WALL + 3 * GRACE + 3 + k * 1_000, 2_000))
    assert set(state.holds.of("reader")) == {"r"}, "the silent process's reader went after node_lease_ms"
    assert [x["state"] for x in run.alerts("duplicate_node")] == ["raised", "cleared"]
    assert run.last_safe_ts() == 900


def test_an_older_process_speaking_after_its_holds_went_is_asked_to_restate() -> None:
    run = Run()
    a = single(run)
    b = NodeClient("n1", incarnation=1)
    run.feed(a.open("long", 100, WALL), a.hb(WALL, 1_000), b.hb(WALL + 1, 1_000), b.hb(WALL + 2 + GRACE, 1_000))
    state = run.engine.nodes[("default", "n1")]
    assert set(state.holds.of("reader")) == set(), "a silent older process's holds went after the grace"
    out = run.feed(a.hb(WALL + 3 + GRACE, 1_000))  # it was not dead: a pause longer than the grace
    kinds = [(o.value["type"], o.value.get("kind"), o.value.get("reason")) for o in out]
    assert ("alert", "duplicate_node", None) in kinds and ("snapshot_request", None, "duplicate_node") in kinds
    run.feed(a.snapshot(WALL + 4 + GRACE, readers=[{"reader_id": "long", "read_ts": 100}], txs=[]))
    assert set(state.holds.of("reader")) == {"long@0"}, "its snapshot restates its own holds only"


def test_repeated_messages_of_an_older_incarnation_are_ignored() -> None:
    run = Run()
    a = single(run)
    e = a.hb(WALL, 1_000)
    run.feed(e)
    a.restart()
    run.feed(a.hb(WALL + 1, 1_000))
    assert run.feed(e) == [] and run.counts["ignored:duplicate"] == 1, "the old process's own last message again"
    assert run.alerts("duplicate_node") == []


def test_restart_can_skip_incarnations() -> None:
    """CONTRACT Events: incarnation grows by one *at least* each time the process restarts."""
    run = Run()
    n1 = single(run)
    run.feed(n1.open("r", 100, WALL), n1.hb(WALL, 1_000))
    n1.incarnation, n1.seq = 7, -1
    run.feed(n1.hb(WALL, 1_000), n1.hb(WALL + GRACE, 1_000))
    assert run.last_safe_ts() == 1_000
    assert run.directives()[-1]["basis"]["n1"]["incarnation"] == 7


def test_event_of_new_incarnation_that_opens_a_reader_keeps_it() -> None:
    """CONTRACT Semantics: Node restart drops the *older* incarnation's holds, not the event's own."""
    run = Run()
    n1 = single(run)
    run.feed(n1.open("old", 100, WALL), n1.hb(WALL, 1_000))
    n1.restart()
    run.feed(n1.open("new", 900, WALL + 1), n1.hb(WALL + 1 + GRACE, 1_000))
    assert run.last_safe_ts() == 900
    assert set(run.engine.nodes[("default", "n1")].holds.of("reader")) == {"new"}


def test_duplicate_older_seq_and_stale_incarnation_are_ignored_and_counted() -> None:
    """CONTRACT Events: a lower incarnation or a seq not above the last applied is a duplicate or
    stale and is ignored (counted, not an error)."""
    run = Run()
    n1 = single(run)
    e0 = n1.open("r", 500, WALL)
    e1 = n1.hb(WALL, 1_000)
    e2 = n1.hb(WALL, 1_000)
    run.feed(e0, e1, e2)
    state = run.engine.nodes[("default", "n1")]
    before = json.loads(json.dumps(state.to_json()))
    assert run.feed(e2) == []  # the same seq again
    assert run.feed(e0 | {"read_ts": 1}) == []  # an older seq, even with other content
    assert json.loads(json.dumps(state.to_json())) == before, "ignored events leave the state alone"
    assert before["readers"] == {"r": [500, WALL, None, 0]}
    n1.restart()
    run.feed(n1.hb(WALL + 1, 1_000), n1.hb(WALL + 1 + GRACE, 1_000))
    assert run.feed(e2 | {"seq": 1}) == []  # the older incarnation, its holds gone: a repeat of its own
    n2 = NodeClient("n2", incarnation=3)
    run.feed(n2.hb(WALL + 2 + GRACE, 1_000))
    n2.incarnation = 2
    assert run.feed(n2.hb(WALL + 3 + GRACE, 1_000)) == []  # an incarnation the node never had, below its newest
    assert run.counts == {"applied": 7, "ignored:duplicate": 1, "ignored:older_seq": 2, "ignored:stale_incarnation": 1}
    assert run.alerts("horizon_violation") == [], "an ignored reader_open below safe_ts raises nothing"


def test_seq_gaps_are_fine() -> None:
    """CONTRACT Events: seq is strictly increasing within an incarnation (not necessarily by one)."""
    run = Run()
    n1 = single(run)
    run.feed(n1.hb(WALL, 1_000))
    n1.seq = 41
    run.feed(n1.open("r", 1_000, WALL))
    assert run.counts["applied"] == 3
    assert run.engine.nodes[("default", "n1")].seq == 42


def test_snapshot_replaces_the_active_set() -> None:
    """CONTRACT Events snapshot: the node's complete active set at this seq replaces what the job held."""
    run = Run()
    n1 = single(run)
    run.feed(n1.open("gone", 100, WALL), n1.begin("t-gone", 150, WALL), n1.open("kept", 600, WALL), n1.hb(WALL, 1_000))
    assert run.last_safe_ts() == 100
    run.feed(
        n1.snapshot(
            WALL + 100,
            readers=[{"reader_id": "kept", "read_ts": 600}, {"reader_id": "new", "read_ts": 700, "label": "bi"}],
            txs=[{"tx_id": "t-new", "begin_ts": 650, "prepared": True, "coordinator": "n1", "participants": ["n1"]}],
        )
    )
    state = run.engine.nodes[("default", "n1")]
    assert set(state.holds.of("reader")) == {"kept", "new"}
    assert set(state.holds.of("tx")) == {"t-new"} and state.holds.of("tx")["t-new"].prepared is True
    assert state.holds.of("reader")["kept"].opened_wall == WALL, "a listed reader keeps its opening time"
    assert state.holds.of("reader")["new"].opened_wall == WALL + 100
    assert run.last_safe_ts() == 600
    run.feed(n1.snapshot(WALL + 200, readers=[], txs=[]))
    assert run.last_safe_ts() == 1_000


def test_snapshot_opened_wall_ms_sets_blocker_age() -> None:
    """CONTRACT Directives: blocker.age_ms is the hold's age in cluster time (snapshot may carry opened_wall_ms)."""
    run = Run()
    n1 = single(run)
    run.feed(n1.snapshot(WALL, readers=[{"reader_id": "r", "read_ts": 10, "opened_wall_ms": WALL - 5_400_000}], txs=[]))
    run.feed(n1.hb(WALL + 600, 1_000))
    blocker = run.directives()[-1]["blocker"]
    assert blocker["age_ms"] == 5_400_600 and blocker["id"] == "r"


def test_snapshot_drops_prepared_tx_it_does_not_list() -> None:
    """CONTRACT Events snapshot: the *complete* active set: a prepared tx left out is no longer held."""
    run = Run()
    n1 = single(run)
    run.feed(n1.begin("t", 100, WALL), n1.prepare("t", WALL), n1.hb(WALL, 1_000))
    n1.restart()
    run.feed(n1.snapshot(WALL, readers=[], txs=[]), n1.hb(WALL, 1_000))
    assert run.last_safe_ts() == 1_000


def test_node_state_local_min_directly() -> None:
    """CONTRACT Semantics: Node minimum, checked on NodeState alone (the node stage)."""
    policy = Policy(retention=10)
    state = NodeState("c", "n")
    assert state.local_min(policy) == (None, "no heartbeat yet", None)
    base = {"v": 1, "cluster": "c", "node": "n", "incarnation": 0, "wall_ms": 5}
    u = state.apply(base | {"type": "heartbeat", "seq": 0, "mvcc_now": 100}, policy)
    assert isinstance(u, NodeUpdate) and u.local_min == 90 and u.unknown is None and u.changed
    u = state.apply(base | {"type": "heartbeat", "seq": 1, "mvcc_now": 100}, policy)
    assert isinstance(u, NodeUpdate) and not u.changed, "nothing changed: the cluster stage need not re-evaluate"
    u = state.apply(base | {"type": "reader_open", "seq": 2, "reader_id": "r", "read_ts": 40}, policy)
    assert isinstance(u, NodeUpdate) and u.local_min == 40 and u.opened == [("reader", "r", 40, None)] and u.changed
    assert state.apply(base | {"type": "reader_close", "seq": 2, "reader_id": "r"}, policy) == "duplicate"
    assert state.apply(base | {"type": "reader_close", "seq": 1, "reader_id": "r"}, policy) == "older_seq"
    u = state.apply(base | {"type": "reader_close", "seq": 3, "reader_id": "r"}, policy)
    assert isinstance(u, NodeUpdate) and u.closed == [("reader", "r")] and u.local_min == 90
    restarted = base | {"incarnation": 1}
    u = state.apply(restarted | {"type": "heartbeat", "seq": 0, "mvcc_now": 50}, policy)
    assert isinstance(u, NodeUpdate) and u.local_min == 40 and u.incarnation == 1 and u.seq == 0
    assert state.apply(base | {"type": "heartbeat", "seq": 3, "mvcc_now": 50}, policy) == "duplicate"
    assert state.apply(base | {"type": "heartbeat", "seq": 9, "incarnation": -5, "mvcc_now": 50}, policy) == "stale_incarnation"


def test_retention_bound_stays_a_signed_64_bit_timestamp() -> None:
    """CONTRACT Time: MVCC timestamps are signed 64-bit integers; compaction.json bounds safe_ts so.
    A node at the bottom of the range with a retention larger than the room below holds at the
    smallest timestamp (keep everything) instead of sending an out-of-range safe_ts."""
    run = Run(retention=1_000)
    n1 = single(run)
    run.feed(n1.hb(WALL, INT64_MIN + 5))
    d = run.directives()[-1]
    assert d["safe_ts"] == INT64_MIN
    assert d["blocker"]["kind"] == "retention" and d["blocker"]["ts"] == INT64_MIN
    run.feed(n1.hb(WALL, INT64_MIN + 5_000))
    assert run.last_safe_ts() == INT64_MIN + 4_000


def test_the_compact_stored_form_names_every_field_and_restores_the_same_state() -> None:
    """``to_stored`` keeps every field ``to_json`` writes, by position (``STORED_FIELDS``)."""
    from safepoint.core.node import STORED_FIELDS, NodeState

    run = Run(pinned_warning_enter_bytes=100, pinned_warning_exit_bytes=50, band_enter_window_ms=0)
    n1 = single(run)
    run.feed(n1.open("r", 500, WALL, namespace="a"), n1.begin("t", 400, WALL + 1),
             n1.prepare("t", WALL + 2, "n2", ["n1", "n2"]), n1.hb(WALL + 3, 1_000, pinned_bytes=200))
    state = run.engine.nodes[("default", "n1")]
    full = state.to_json()
    assert set(full) - {"cluster"} <= set(STORED_FIELDS), "every stored field has a place"
    stored = json.loads(json.dumps(state.to_stored()))
    assert NodeState.from_stored("default", stored).to_json() == full


def test_a_close_that_restarts_the_node_walks_its_holds_again() -> None:
    """An event of a new incarnation may be a close: once the grace dropped the old process's lowest
    reader, the node's minimum is its floor again, though the closed id was never held (no shortcut)."""
    policy = Policy(retention=100)
    ns = NodeState("c1", "n1")

    def ev(kind: str, inc: int, seq: int, **fields: object) -> dict[str, object]:
        return {"v": 1, "type": kind, "cluster": "c1", "node": "n1", "incarnation": inc, "seq": seq, "wall_ms": 1_000 + seq,
                **fields}

    ns.apply(ev("heartbeat", 1, 1, mvcc_now=1_000), policy)
    ns.apply(ev("reader_open", 1, 2, reader_id="low", read_ts=500), policy)
    u = ns.apply(ev("reader_open", 1, 3, reader_id="high", read_ts=800), policy)
    assert isinstance(u, NodeUpdate) and u.local_min == 500
    u = ns.apply(ev("reader_close", 2, 1, reader_id="never-held"), policy)
    assert isinstance(u, NodeUpdate) and u.local_min == 500, "the old process's readers stay for the grace"
    u = ns.apply(ev("reader_close", 2, 2 + policy.incarnation_grace_ms, reader_id="never-held-either"), policy)
    assert isinstance(u, NodeUpdate) and u.local_min == 900 and u.blocker is not None and u.blocker.kind == "retention"
    assert u.changed


# -- a snapshot or heartbeat that names a hold or a group twice -----------------------------------


def test_a_hold_listed_twice_keeps_the_lower_entry() -> None:
    for readers in ([{"reader_id": "r1", "read_ts": 500}, {"reader_id": "r1", "read_ts": 900}],
                    [{"reader_id": "r1", "read_ts": 900}, {"reader_id": "r1", "read_ts": 500}]):
        run = Run()
        n1 = NodeClient("n1")
        run.feed(topology(1, WALL, {"n1": []}), n1.snapshot(WALL, readers=readers, txs=[
            {"tx_id": "t1", "begin_ts": 800}, {"tx_id": "t1", "begin_ts": 700}]), n1.hb(WALL, 2_000))
        assert run.last_safe_ts() == 500
    groups = [{"group": "g", "leader": True, "published_min_tx_time": 300},
              {"group": "g", "leader": False, "published_min_tx_time": 100}]
    run = Run()
    n1 = NodeClient("n1")
    run.feed(topology(1, WALL, {"n1": []}), n1.hb(WALL, 2_000, groups=groups))
    assert run.last_safe_ts() == 100
    groups[0]["published_min_tx_time"] = None  # one entry says the leader has not published: unknown
    run.feed(n1.hb(WALL + 1, 3_000, groups=groups))
    assert run.last_safe_ts() == 100
    assert [a["kind"] for a in run.alerts(state="raised")] == ["unknown_node_min"]


# -- a snapshot too big for one message --------------------------------------------------------------


def parts_of(n1: NodeClient, wall: int, readers: list[dict[str, object]], size: int, cut: int = 0
             ) -> list[dict[str, object]]:
    chunks = [readers[i:i + size] for i in range(0, len(readers), size)]
    return [{**n1.snapshot(wall, readers=chunk, txs=[], cut=cut), "part": k, "parts": len(chunks)}
            for k, chunk in enumerate(chunks)]


def test_a_snapshot_in_parts_is_applied_as_one_when_its_last_part_arrives() -> None:
    run = Run()
    n1 = single(run)
    run.feed(n1.open("old", 100, WALL), n1.hb(WALL, 1_000))
    readers = [{"reader_id": f"r{i}", "read_ts": 500 + i} for i in range(10)]
    parts = parts_of(n1, WALL + 1, readers, 4)
    assert len(parts) == 3
    run.feed(*parts[:2])
    state = run.engine.nodes[("default", "n1")]
    assert set(state.holds.of("reader")) == {"old"}, "nothing applied before the last part"
    run.restore()  # a micro-batch ends between two parts: the parts received are in the node's stored state
    run.feed(parts[2])
    state = run.engine.nodes[("default", "n1")]
    assert set(state.holds.of("reader")) == {f"r{i}" for i in range(10)} and state.parts is None
    run.feed(n1.hb(WALL + 2, 1_000))
    assert run.last_safe_ts() == 500


def test_a_snapshot_whose_parts_are_broken_is_not_applied() -> None:
    readers = [{"reader_id": f"r{i}", "read_ts": 500 + i} for i in range(6)]
    for broken in ("interleaved", "skipped", "other cut"):
        run = Run()
        n1 = single(run)
        run.feed(n1.open("old", 100, WALL), n1.hb(WALL, 1_000))
        parts = parts_of(n1, WALL + 1, readers, 2)
        if broken == "interleaved":  # a heartbeat sent between the first part and the others
            beat = n1.hb(WALL + 1, 1_000)
            parts = [parts[0], beat, *({**p, "seq": beat["seq"] + k} for k, p in enumerate(parts[1:], 1))]
        elif broken == "skipped":
            del parts[1]
        else:
            parts[2] = {**parts[2], "cut": 7}
        run.feed(*parts)
        assert set(run.engine.nodes[("default", "n1")].holds.of("reader")) == {"old"}, broken
