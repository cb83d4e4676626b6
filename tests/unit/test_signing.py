"""Signed control events (``core/signing.py``): with control keys, only their holders steer a
cluster; a forged release or pause is refused and alerted, a key rotation loses nothing, each
cluster may have its own keys, and the job's batches give replay's outputs."""

from __future__ import annotations

import json
from typing import Any

from safepoint.core.policy import Policy
from safepoint.core.signing import canonical, sign, verify
from safepoint.replay import final_status

from core_helpers import NodeClient, Run, topology

T0 = 1_700_000_000_000
KEY, NEW = "k-old-5e1f", "k-new-77a2"


def control(kind: str, wall: int, key: str | None = None, cluster: str = "c1", **fields: Any) -> dict[str, Any]:
    ev = {"v": 1, "type": kind, "cluster": cluster, "wall_ms": wall, "action_id": f"{kind}-{wall}", **fields}
    if key is not None:
        ev["sig"] = sign(ev, key)
    return ev


def start(**policy: Any) -> tuple[Run, NodeClient]:
    run = Run(node_lease_ms=10_000, **policy)
    n1 = NodeClient("n1", "c1")
    run.feed(topology(1, T0, {"n1": []}, cluster="c1"), n1.hb(T0, 1_000))
    return run, n1


def test_sign_and_verify() -> None:
    ev = control("service_hold", T0, holder="backup", ts=5, ttl_ms=60_000, label="nightly")
    sig = sign(ev, KEY)
    assert sig.startswith("hmac-sha256:") and canonical(ev) == canonical({**ev, "sig": sig, "v": 1, "extra": 1})
    signed = {**ev, "sig": sig}
    assert verify(signed, [KEY], T0, 1_000) is None
    assert verify(signed, [NEW, KEY], T0, 1_000) is None, "either key of a rotation"
    assert verify(ev, [KEY], T0, 1_000) == "unsigned"
    assert verify({**signed, "ts": 6}, [KEY], T0, 1_000) == "bad_signature", "a signed field changed"
    assert verify({**signed, "holder": "cdc"}, [KEY], T0, 1_000) == "bad_signature"
    assert verify(signed, [NEW], T0, 1_000) == "bad_signature"
    assert verify(signed, [KEY], T0 + 1_001, 1_000) == "stale_signature", "sent again later"
    assert verify(signed, [KEY], T0 + 10**9, 0) is None, "no window"


def test_a_forged_release_and_pause_are_refused_and_alerted_the_signed_ones_apply() -> None:
    run, n1 = start(control_keys=KEY)
    run.feed(control("service_hold", T0 + 1, KEY, holder="backup", ts=1_500, ttl_ms=3_600_000, label="nightly"))
    run.feed(n1.hb(T0 + 1_000, 5_000))
    assert run.last_safe_ts() == 1_500
    out = run.feed(control("service_release", T0 + 1_001, holder="backup"),  # a node's forgery: unsigned
                   control("pause", T0 + 1_002, NEW, reason="forged"))  # signed with a key the job does not have
    [raised] = [o.value for o in out if o.value.get("kind") == "control_refused" and o.value["state"] == "raised"][:1]
    assert raised["severity"] == "critical" and "service_release of backup refused" in raised["detail"]
    run.feed(n1.hb(T0 + 2_000, 9_000))
    assert run.last_safe_ts() == 1_500, "the hold keeps protecting its ts"
    st = final_status(run.engine)["clusters"][0]
    assert not st["paused"] and st["control_ignored"] == {"unsigned": 1, "bad_signature": 1}
    assert [(a["type"], a["outcome"], a["reason"]) for a in st["actions"]][-2:] == [
        ("service_release", "refused", "unsigned"), ("pause", "refused", "bad_signature")]
    run.feed(control("service_release", T0 + 2_001, KEY, holder="backup"))
    run.feed(n1.hb(T0 + 3_000, 9_000))
    assert run.last_safe_ts() == 9_000, "the operator's signed release applies"
    assert run.alerts("control_refused", "cleared"), "and clears the alert"


def test_a_forged_copy_of_a_known_action_does_not_change_its_outcome() -> None:
    run, n1 = start(control_keys=KEY)
    hold = control("service_hold", T0 + 1, KEY, holder="backup", ts=1_500, ttl_ms=60_000)
    run.feed(hold, {**hold, "ts": 1, "sig": "hmac-sha256:00"})
    st = final_status(run.engine)["clusters"][0]
    assert [(a["id"], a["outcome"]) for a in st["actions"]] == [(hold["action_id"], "applied")]


def test_a_key_rotation_loses_nothing_and_each_cluster_has_its_own_keys() -> None:
    run, n1 = start(control_keys=f"{NEW},{KEY}")
    run.feed(control("service_hold", T0 + 1, KEY, holder="a", ts=1_200, ttl_ms=60_000),  # a publisher not yet rotated
             control("service_hold", T0 + 2, NEW, holder="b", ts=1_300, ttl_ms=60_000))
    run.feed(n1.hb(T0 + 1_000, 5_000))
    assert run.last_safe_ts() == 1_200 and not final_status(run.engine)["clusters"][0]["control_ignored"]

    from safepoint.core.policy import Policies

    policies = Policies(Policy(node_lease_ms=10_000), {"secure": Policy(node_lease_ms=10_000, control_keys=KEY)})
    other = Run(policies)
    s1, o1 = NodeClient("s1", "secure"), NodeClient("o1", "open")
    other.feed(topology(1, T0, {"s1": []}, cluster="secure"), topology(1, T0, {"o1": []}, cluster="open"),
               s1.hb(T0, 1_000), o1.hb(T0, 1_000))
    other.feed(control("pause", T0 + 1, cluster="secure", reason="x"), control("pause", T0 + 1, cluster="open", reason="y"))
    paused = {st["cluster"]: st["paused"] for st in final_status(other.engine)["clusters"]}
    assert paused == {"secure": False, "open": True}


def test_the_jobs_batches_give_replays_outputs_with_signed_and_forged_control_events() -> None:
    from test_batch import job_equals_replay

    from safepoint.core.origin import control_partition

    msgs = []
    for i in range(90):
        wall = T0 + i * 400
        msgs.append((0, 2 * i, b"n1", json.dumps({"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1",
                                                  "incarnation": 1, "seq": i + 1, "wall_ms": wall,
                                                  "mvcc_now": 1_000 + 10 * i}).encode()))
        key = [KEY, None, NEW][i % 3]
        kind = "service_hold" if i % 4 else "service_release"
        fields = {"holder": "h"} | ({"ts": 1_000 + 10 * i - 30, "ttl_ms": 5_000} if kind == "service_hold" else {})
        if i % 5 == 0:  # owners too: a digest on sets, a token (right or wrong) on releases
            fields |= {"owner": "a" * 64} if kind == "service_hold" else {"owner_token": ["x", "y"][i % 2]}
        msgs.append((control_partition(0), i, b"c1", json.dumps(control(kind, wall + 1, key, **fields)).encode()))
    got = job_equals_replay(msgs, list(range(11, len(msgs), 37)), Policy(node_lease_ms=5_000, control_keys=KEY), buckets=4)
    assert any(a["kind"] == "control_refused" for _, a in got["al"])


def test_a_hold_with_an_owner_is_renewed_moved_and_released_only_by_its_owner_or_by_force() -> None:
    from safepoint.core.signing import owner_digest

    run, n1 = start()
    mine, theirs = owner_digest("tok-mine"), owner_digest("tok-theirs")
    run.feed(control("service_hold", T0 + 1, holder="backup", ts=1_500, ttl_ms=60_000, owner=mine))
    run.feed(control("service_hold", T0 + 2, holder="backup", ts=1_600, ttl_ms=60_000, owner=mine))  # its renewal
    run.feed(control("service_hold", T0 + 3, holder="backup", ts=9_000, ttl_ms=60_000, owner=theirs),  # another's
             control("service_hold", T0 + 4, holder="backup", ts=9_000, ttl_ms=60_000),  # no owner at all
             control("service_release", T0 + 5, holder="backup"),
             control("service_release", T0 + 6, holder="backup", owner_token="tok-theirs"))
    run.feed(n1.hb(T0 + 1_000, 20_000))
    assert run.last_safe_ts() == 1_600, "only its owner moved it"
    st = final_status(run.engine)["clusters"][0]
    assert st["control_ignored"] == {"not_owner": 4} and st["service_holds"][0]["owned"] is True
    assert [a["reason"] for a in st["actions"]] == [None, None, "not_owner", "not_owner", "not_owner", "not_owner"]
    run.feed(control("service_release", T0 + 7, holder="backup", owner_token="tok-mine"))
    run.feed(n1.hb(T0 + 2_000, 20_000))
    assert run.last_safe_ts() == 20_000, "its owner released it"

    run.feed(control("service_hold", T0 + 2_001, holder="cdc", ts=20_000, ttl_ms=60_000, owner=theirs))
    run.feed(control("service_release", T0 + 2_002, holder="cdc", force=True))
    [forced] = [a for a in final_status(run.engine)["clusters"][0]["actions"] if a["id"] == f"service_release-{T0 + 2_002}"]
    assert (forced["outcome"], forced["reason"]) == ("applied", "forced") and "by force" in forced["detail"]

    run.feed(control("service_hold", T0 + 2_003, holder="legacy", ts=20_000, ttl_ms=60_000),
             control("service_release", T0 + 2_004, holder="legacy"))
    assert not final_status(run.engine)["clusters"][0]["service_holds"], "a hold without an owner, as before"


SECRET = "node-secret-91c"


def signed(ev: dict[str, Any], as_node: str | None = None) -> dict[str, Any]:
    """``ev`` signed with the key of ``as_node`` (default: the node it names)."""
    from safepoint.core.signing import node_key, sign_node

    return {**ev, "sig": sign_node(ev, node_key(SECRET, ev["cluster"], as_node or ev["node"]))}


def test_a_node_speaks_only_for_itself() -> None:
    run = Run(node_lease_ms=10_000, node_key_secret=SECRET)
    n1, n2 = NodeClient("n1", "c1"), NodeClient("n2", "c1")
    run.feed(topology(1, T0, {"n1": [], "n2": []}, cluster="c1"), signed(n1.hb(T0, 1_000)), signed(n2.hb(T0, 1_000)))
    assert run.last_safe_ts() == 1_000
    run.feed(signed(n1.open("r1", 1_200, T0 + 1)))
    # n2 (or a bug in it) closes n1's reader, unsigned and then with its own key: both refused
    out = run.feed(n1.close("r1", T0 + 2), signed(n1.close("r1", T0 + 3), as_node="n2"))
    raised = [o.value for o in out if o.value.get("kind") == "node_event_refused"]
    assert [(a["node"], a["state"], a["severity"]) for a in raised] == [("n1", "raised", "critical")], "raised once"
    run.feed(signed(n1.hb(T0 + 1_000, 5_000)), signed(n2.hb(T0 + 1_000, 5_000)))
    assert run.last_safe_ts() == 1_200, "n1's reader still holds"
    assert run.alerts("node_event_refused", "cleared"), "n1 signed again"
    counts = run.engine.counts
    assert counts.get("ignored:unsigned_node_event") == 1 and counts.get("ignored:bad_node_signature") == 1, counts
    changed = signed(n1.hb(T0 + 2_000, 9_000))
    run.feed({**changed, "mvcc_now": 99_000})  # a field changed after signing
    assert run.engine.counts.get("ignored:bad_node_signature") == 2


def test_the_jobs_batches_give_replays_outputs_with_signed_and_unsigned_node_events() -> None:
    from test_batch import job_equals_replay

    msgs = []
    nodes = {n: NodeClient(n, "c1") for n in ("n1", "n2")}
    for i in range(120):
        n = ("n1", "n2")[i % 2]
        ev = nodes[n].hb(T0 + i * 300, 1_000 + i) if i % 3 else nodes[n].open(f"r{i}", 1_000 + i - 5, T0 + i * 300)
        ev = ev if i % 7 == 3 else signed(ev, as_node="n2" if i % 11 == 5 else None)
        msgs.append((i % 2, i // 2, n.encode(), json.dumps(ev).encode()))
    got = job_equals_replay(msgs, list(range(13, len(msgs), 41)), Policy(node_lease_ms=5_000, node_key_secret=SECRET),
                            buckets=4)
    assert any(a["kind"] == "node_event_refused" for _, a in got["al"])


def test_the_node_key_command_prints_a_nodes_key_and_the_reporter_signs_with_it(capsys: Any, monkeypatch: Any) -> None:
    from safepoint.cli import main
    from safepoint.connectors.sender import Sender
    from safepoint.core.signing import node_key, verify_node

    monkeypatch.setenv("SAFEPOINT_NODE_KEY_SECRET", SECRET)
    assert main(["node-key", "c1", "n1"]) == 0
    key = capsys.readouterr().out.strip()
    assert key == node_key(SECRET, "c1", "n1") and key != node_key(SECRET, "c1", "n2") and SECRET not in key
    monkeypatch.delenv("SAFEPOINT_NODE_KEY_SECRET")
    assert main(["node-key", "c1", "n1"]) == 2 and "no node_key_secret" in capsys.readouterr().err

    sent: list[bytes] = []
    sender = Sender("n1", "c1", 1, "ev", "127.0.0.1:1", "confluent", {"bootstrap.servers": "127.0.0.1:1"}, 1.0,
                    lambda: T0, node_key=key)
    monkeypatch.setattr(sender, "produce", sent.append)
    sender.send("heartbeat", {"mvcc_now": 5})
    event = json.loads(sent[0])
    assert verify_node({**event, "log_ms": T0 + 1}, SECRET) is None, "the log time the job adds is not covered"
