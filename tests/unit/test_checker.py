"""The soak's independent checker (safepoint.devtools.checker) on small hand-made logs: it must pass a
correct run and catch each kind of wrong one (a directive past a live hold, a late hold with no
alert, a prepared transaction forgotten across a restart, seq gaps, safe_ts going back, a lost
message, a lagging safe point)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from safepoint.core import Engine, Policy, Position, parse
from safepoint.core.events import Rejected
from safepoint.devtools.checker import CheckResult, check_logs, validate_event
from safepoint.devtools.simulate import BAD_KINDS, SimConfig, bad_message, generate_log

T0 = 1_700_000_000_000


class Node:
    def __init__(self, name: str, cluster: str = "c1") -> None:
        self.name, self.cluster, self.inc, self.seq = name, cluster, 0, -1

    def ev(self, type_: str, wall: int, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"v": 1, "type": type_, "cluster": self.cluster, "node": self.name, "incarnation": self.inc,
                "seq": self.seq, "wall_ms": wall, **fields}

    def restart(self) -> None:
        self.inc += 1
        self.seq = -1

    @property
    def pos(self) -> dict[str, int]:
        return {"incarnation": self.inc, "seq": self.seq}


def topology(*nodes: str, version: int = 1, wall: int = 0) -> dict[str, Any]:
    return {"v": 1, "type": "topology", "cluster": "c1", "version": version, "wall_ms": wall, "nodes": {n: [] for n in nodes}}


def directive(seq: int, safe_ts: int, wall: int, basis: dict[str, dict[str, int]], mins: dict[str, int] | None = None) -> dict[str, Any]:
    return {"v": 1, "type": "compaction", "cluster": "c1", "seq": seq, "safe_ts": safe_ts, "catalog_floor": None,
            "cluster_wall_ms": wall, "blocker": None,
            "basis": {n: {**b, "local_min": (mins or {}).get(n)} for n, b in basis.items()}}


def violation_alert(node: str, kind: str, hid: str, ts: int, safe: int) -> dict[str, Any]:
    return {"v": 1, "type": "alert", "kind": "horizon_violation", "state": "raised", "severity": "critical",
            "cluster": "c1", "node": node, "value": ts, "threshold": safe, "since_wall_ms": 0, "cluster_wall_ms": 0,
            "detail": "", "id": f"c1/horizon_violation/{node}/{kind}/{hid}"}


def check(events: list[Any], directives: list[dict[str, Any]], alerts: list[dict[str, Any]] | None = None,
          dead: list[dict[str, Any]] | None = None, **kw: Any) -> CheckResult:
    msgs = [(0, i, e if isinstance(e, bytes | None) else json.dumps(e).encode()) for i, e in enumerate(events)]
    return check_logs(msgs, directives, alerts or [], dead or [], **kw)


def base() -> tuple[Node, Node, list[Any]]:
    """Topology {n1, n2}; both heartbeat at mvcc 1000; n1 opens r1 at 950."""
    n1, n2 = Node("n1"), Node("n2")
    log: list[Any] = [topology("n1", "n2"), n1.ev("heartbeat", 1000, mvcc_now=1000), n2.ev("heartbeat", 1001, mvcc_now=1000),
                      n1.ev("reader_open", 1002, reader_id="r1", read_ts=950)]
    return n1, n2, log


def test_a_correct_log_passes() -> None:
    n1, n2, log = base()
    d1 = directive(1, 950, 1002, {"n1": n1.pos, "n2": n2.pos}, {"n1": 950, "n2": 1000})
    log += [n1.ev("reader_close", 2000, reader_id="r1"), n1.ev("heartbeat", 2001, mvcc_now=2000)]
    d2 = directive(2, 1000, 2001, {"n1": n1.pos, "n2": n2.pos}, {"n1": 2000, "n2": 1000})
    r = check(log, [d1, d2, d1])  # d1 twice: the sink is at-least-once
    assert r.safety_ok and r.accounting_ok, r.violation_examples
    assert (r.directives, r.directive_duplicates, r.basis_checked, r.basis_min_mismatches) == (2, 1, 4, 0)
    assert (r.messages, r.applied, r.ignored, r.bad) == (6, 6, 0, 0)


def test_a_directive_past_a_live_reader_is_a_violation() -> None:
    n1, n2, log = base()
    d1 = directive(1, 960, 1002, {"n1": n1.pos, "n2": n2.pos})
    r = check(log, [d1])
    assert not r.safety_ok
    assert r.violations == 1 and "passed live reader r1 at 950" in r.violation_examples[0]


def test_the_basis_position_decides_what_is_live() -> None:
    """The same directive is fine when its basis for n1 predates r1's open, and wrong after it."""
    n1, n2, log = base()
    before = {"incarnation": 0, "seq": 0}
    d_before = directive(1, 1000, 1002, {"n1": before, "n2": n2.pos})
    assert check(log, [d_before]).safety_ok
    d_after = directive(1, 1000, 1002, {"n1": n1.pos, "n2": n2.pos})
    assert not check(log, [d_after]).safety_ok


def positioned(seq: int, safe_ts: int, wall: int, positions: dict[str, int]) -> dict[str, Any]:
    """A bounded directive: no basis to speak of, every node's position from the partitions'."""
    return {**directive(seq, safe_ts, wall, {}), "members": 2, "positions": positions}


def test_a_directives_positions_decide_what_is_live() -> None:
    """Partition 0 read up to offset 3 (before n1 opens r1) or 4 (after): the same directive is fine
    at the first and passes the live reader at the second, for every node of the partition."""
    _n1, _n2, log = base()
    ok = check(log, [positioned(1, 1000, 1002, {"0": 3})])
    assert ok.safety_ok and ok.basis_checked == 2, ok.violation_examples
    wrong = check(log, [positioned(1, 1000, 1002, {"0": 4})])
    assert not wrong.safety_ok and "passed live reader r1 at 950" in wrong.violation_examples[0]


def test_a_position_past_the_log_cannot_be_verified() -> None:
    _n1, _n2, log = base()
    r = check(log, [positioned(1, 900, 1002, {"0": 99})])
    assert r.basis_unverified == 1 and not r.safety_ok


def test_a_hold_that_arrives_below_safe_ts_needs_an_alert() -> None:
    n1, n2 = Node("n1"), Node("n2")
    log: list[Any] = [topology("n1", "n2"), n1.ev("heartbeat", 1000, mvcc_now=1000), n2.ev("heartbeat", 1001, mvcc_now=1000)]
    d1 = directive(1, 1000, 1001, {"n1": n1.pos, "n2": n2.pos})
    log += [n1.ev("reader_open", 1500, reader_id="late", read_ts=900), n2.ev("heartbeat", 2000, mvcc_now=2000),
            n1.ev("heartbeat", 2001, mvcc_now=2000)]
    d2 = directive(2, 1000, 2001, {"n1": n1.pos, "n2": n2.pos})  # the floor moved (say): safe_ts stays
    d3 = directive(3, 1100, 2002, {"n1": n1.pos, "n2": n2.pos})  # but this one goes on past "late"
    ok = check(log, [d1, d2, d3], [violation_alert("n1", "reader", "late", 900, 1000)])
    assert ok.safety_ok, ok.violation_examples
    assert ok.excused_late_holds == 2
    missing = check(log, [d1, d2, d3])
    assert missing.violations == 2 and "no horizon_violation alert" in missing.violation_examples[0]


def test_a_late_hold_is_excused_only_below_the_previous_safe_ts() -> None:
    """A hold live at directive k-1 and at or above its safe_ts must bound directive k: no alert excuses that."""
    n1, n2, log = base()
    d1 = directive(1, 950, 1002, {"n1": n1.pos, "n2": n2.pos})
    log.append(n1.ev("heartbeat", 2000, mvcc_now=2000))
    d2 = directive(2, 990, 2000, {"n1": n1.pos, "n2": n2.pos})
    r = check(log, [d1, d2], [violation_alert("n1", "reader", "r1", 950, 990)])
    assert r.violations == 1 and "passed live reader r1" in r.violation_examples[0]


def test_prepared_transactions_survive_a_restart_and_others_do_not() -> None:
    n1, n2 = Node("n1"), Node("n2")
    log: list[Any] = [topology("n1", "n2"), n1.ev("heartbeat", 1000, mvcc_now=1000), n2.ev("heartbeat", 1001, mvcc_now=3000),
                      n1.ev("tx_begin", 1002, tx_id="p", begin_ts=950),
                      n1.ev("tx_prepare", 1003, tx_id="p", coordinator="n2", participants=["n1", "n2"]),
                      n1.ev("tx_begin", 1004, tx_id="u", begin_ts=940)]
    n1.restart()
    log.append(n1.ev("heartbeat", 1100, mvcc_now=3000))
    within_grace = directive(1, 945, 1100, {"n1": n1.pos, "n2": n2.pos})
    r = check(log, [within_grace])
    assert r.violations == 1 and "passed live tx u@0 at 940" in r.violation_examples[0], \
        "the old process's transaction stays held for the grace"
    log.append(n1.ev("heartbeat", 1100 + 5_000, mvcc_now=3000))  # silent for the grace: its holds went
    past_prepared = directive(1, 960, 6100, {"n1": n1.pos, "n2": n2.pos})
    r = check(log, [past_prepared])
    assert r.violations == 1 and "passed live tx p at 950 (prepared)" in r.violation_examples[0]
    assert check(log, [directive(1, 950, 1100, {"n1": n1.pos, "n2": n2.pos})]).safety_ok  # u died with the process
    log.append(n1.ev("tx_end", 1200, tx_id="p", outcome="commit"))
    assert check(log, [directive(1, 2000, 1200, {"n1": n1.pos, "n2": n2.pos})]).safety_ok


def test_duplicates_and_stale_events_are_ignored() -> None:
    n1, n2, log = base()
    opened = log[-1]
    log.append(n1.ev("reader_close", 1500, reader_id="r1"))
    log += [opened, opened, topology("n1", "n2")]  # an older seq of n1 twice, a stale topology version
    d1 = directive(1, 1000, 1500, {"n1": n1.pos, "n2": n2.pos})
    r = check(log, [d1])
    assert r.safety_ok and r.ignored == 3 and r.applied == 5


def test_the_retention_bound_and_an_unknown_minimum() -> None:
    n1, n2 = Node("n1"), Node("n2")
    log: list[Any] = [topology("n1", "n2"), n1.ev("heartbeat", 1000, mvcc_now=1000), n2.ev("heartbeat", 1001, mvcc_now=1000)]
    basis = {"n1": n1.pos, "n2": n2.pos}
    assert check(log, [directive(1, 900, 1001, basis)], retention=100).safety_ok
    r = check(log, [directive(1, 901, 1001, basis)], retention=100)
    assert r.violations == 2 and "retention bound 900" in r.violation_examples[0]
    n3 = Node("n3")
    log.append(n3.ev("reader_open", 1002, reader_id="x", read_ts=5000))
    r = check(log, [directive(1, 900, 1002, {**basis, "n3": n3.pos})], retention=100)
    assert r.violations == 1 and "never sent a heartbeat" in r.violation_examples[0]


def test_order_seq_gaps_repeats_and_safe_ts_going_back() -> None:
    n1, n2, log = base()
    basis = {"n1": n1.pos, "n2": n2.pos}
    gap = check(log, [directive(1, 900, 1002, basis), directive(3, 900, 1002, basis)])
    assert gap.order_violations == 1 and "jumps from 1 to 3" in gap.violation_examples[0]
    back = check(log, [directive(1, 940, 1002, basis), directive(2, 930, 1002, basis)])
    assert back.order_violations == 1 and "went back" in back.violation_examples[0]
    clash = check(log, [directive(1, 940, 1002, basis), directive(1, 930, 1002, basis)])
    assert clash.order_violations == 1 and not clash.safety_ok
    late_start = check(log, [directive(2, 940, 1002, basis)])
    assert late_start.order_violations == 1


def test_a_basis_the_log_does_not_have_cannot_be_verified() -> None:
    n1, n2, log = base()
    r = check(log, [directive(1, 900, 1002, {"n1": {"incarnation": 0, "seq": 99}, "n2": n2.pos})])
    assert r.basis_unverified == 1 and not r.safety_ok


def test_accounting_of_dead_letters() -> None:
    n1, n2, log = base()
    log += [b"\xff not utf-8", None, b'{"v": 1, "type": "heartbeat"}']
    dls = [{"v": 1, "error": "x", "topic": "safepoint.events", "partition": 0, "offset": o, "key": None, "value": None}
           for o in (4, 5, 6)]
    r = check(log, [], dead=dls)
    assert r.accounting_ok and (r.bad, r.dead_letters) == (3, 3)
    lost = check(log, [], dead=dls[:2])
    assert lost.dead_letters_missing == 1 and not lost.accounting_ok
    wrong = check(log, [], dead=[*dls, {**dls[0], "offset": 1}])
    assert wrong.dead_letters_unexpected == 1 and not wrong.accounting_ok


def test_liveness_lag_and_its_bound() -> None:
    """Lag just before an advance: cluster_wall_ms of directive k (in MVCC units) minus safe_ts of k-1."""
    n1 = Node("n1")
    log: list[Any] = [topology("n1"), n1.ev("heartbeat", 1_000, mvcc_now=1_000_000),
                      n1.ev("reader_open", 1_000, reader_id="r", read_ts=1_000_000)]
    d1 = directive(1, 1_000_000, 1_000, {"n1": n1.pos})
    log += [n1.ev("reader_close", 9_000, reader_id="r"), n1.ev("heartbeat", 9_000, mvcc_now=9_000_000)]
    d2 = directive(2, 9_000_000, 9_000, {"n1": n1.pos})
    r = check(log, [d1, d2], node_lease_ms=1_000)
    assert r.safety_ok and r.longest_hold_ms == 8_000
    assert r.max_lag == 8_000_000 and r.lag_bound == 9_000_000 and r.liveness_ok
    stuck = check(log, [d1], node_lease_ms=1_000)  # no directive after the reader closed
    assert stuck.max_lag == 8_000_000 and stuck.liveness_ok
    log.append(n1.ev("heartbeat", 30_000, mvcc_now=30_000_000))
    stalled = check(log, [d1, d2], node_lease_ms=1_000)
    assert stalled.max_lag == 21_000_000 and not stalled.liveness_ok


def test_every_injected_bad_kind_is_bad_for_the_checker_and_the_core() -> None:
    ev = Node("n1").ev("reader_open", T0, reader_id="r1", read_ts=5)
    rng = random.Random(0)
    for kind in BAD_KINDS:
        _key, value, made = bad_message(rng, ev, kind)
        assert made == kind
        checked, why = validate_event(value)
        core = parse(value, 1 << 20)
        if kind == "duplicate":
            assert checked is not None and not isinstance(core, Rejected)
        else:
            assert checked is None and why, kind
            assert isinstance(core, Rejected), kind


def _engine_run(msgs: list[bytes | None], policy: Policy) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    engine = Engine(policy)
    outs = []
    for i, m in enumerate(msgs):
        outs += engine.process(m, Position("safepoint.events", 0, i, None))
    pick = lambda ch: [o.value for o in outs if o.channel == ch]  # noqa: E731
    return pick("directives"), pick("alerts"), pick("deadletter")


@pytest.fixture(scope="module")
def simulated() -> tuple[list[bytes | None], Policy]:
    cfg = SimConfig(nodes=4, rate=200, long_reader_share=0.002, restart_per_node_per_min=2.0)
    rng = random.Random(1)
    msgs: list[bytes | None] = []
    for ev in generate_log(cfg, 60_000, seed=3):
        msgs.append(json.dumps(ev).encode())
        if rng.random() < 0.01:
            msgs.append(bad_message(rng, ev)[1])
    return msgs, Policy(retention=1_000_000, node_lease_ms=10_000, directive_interval_ms=1_000)


def test_the_core_passes_the_checker_on_a_simulated_log(simulated: tuple[list[bytes | None], Policy]) -> None:
    msgs, policy = simulated
    directives, alerts, dead = _engine_run(msgs, policy)
    r = check_logs([(0, i, m) for i, m in enumerate(msgs)], directives, alerts, dead, retention=policy.retention,
                   node_lease_ms=policy.node_lease_ms, directive_interval_ms=policy.directive_interval_ms, warmup_ms=10_000)
    assert r.safety_ok and r.accounting_ok and r.liveness_ok, (r.violation_examples, r.notes)
    assert r.directives > 5 and r.bad > 0 and r.ignored > 0 and r.basis_min_mismatches == 0


def test_a_directive_nudged_past_its_blocker_is_caught(simulated: tuple[list[bytes | None], Policy]) -> None:
    msgs, policy = simulated
    directives, alerts, dead = _engine_run(msgs, policy)
    k = next(i for i, d in enumerate(directives) if d["type"] == "compaction" and (d["blocker"] or {}).get("kind") == "reader")
    nudged = [dict(d) for d in directives]
    nudged[k]["safe_ts"] += 1
    r = check_logs([(0, i, m) for i, m in enumerate(msgs)], nudged, alerts, dead, retention=policy.retention)
    assert not r.safety_ok
    assert any(f"directive seq {nudged[k]['seq']} " in v and "passed live reader" in v for v in r.violation_examples)


def test_the_soaks_flat_verdict_ignores_warm_up_and_smooths_the_saw_tooth() -> None:
    from safepoint.devtools.soak import Sample, growth

    def run(values: list[int], start_batch_at: int = 2) -> list[Sample]:
        return [Sample(t_s=10.0 * i, jvm_rss=v, workers_rss=v, driver_rss=v, state_bytes=v, checkpoint_bytes=v, workers=1,
                       batch=None if i < start_batch_at else i) for i, v in enumerate(values)]

    # start-up and warm-up climb, then a saw-tooth around a level: flat
    flat = growth(run([0, 10, 50, 90, 100, 120, 95, 118, 97, 121, 99, 119]), "state_bytes")
    assert flat is not None and abs(flat) < 0.2
    leak = growth(run([0, 10, 50, 90, 100, 110, 120, 130, 140, 150, 160, 170]), "state_bytes")
    assert leak is not None and leak > 0.2
    assert growth(run([5, 5]), "jvm_rss") is None
