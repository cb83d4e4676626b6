"""``safepoint check-node``'s checks, one by one, on hand-made message sequences."""

from __future__ import annotations

import json
from typing import Any

import pytest

from safepoint.checknode import CHECKS, NodeCheck
from safepoint.core import Policy

from core_helpers import NodeClient

LEASE = 10_000


def run(messages: list[tuple[Any, ...]], first: bool = True, retention: int = 100) -> NodeCheck:
    """Each message (key, value) or (key, value, the record's headers)."""
    check = NodeCheck("default", "n1", Policy(node_lease_ms=LEASE, retention=retention), from_first_event=first)
    for i, (key, value, *headers) in enumerate(messages):
        check.feed(key, value if isinstance(value, bytes) else json.dumps(value).encode(), 0, i, *headers)
    return check


def good() -> tuple[NodeClient, list[tuple[bytes | None, Any]]]:
    n = NodeClient("n1")
    msgs: list[tuple[bytes | None, Any]] = [(b"n1", e) for e in (
        n.hb(0, 1_000, groups=[{"group": "g", "leader": True, "published_min_tx_time": 900}]),
        n.open("r1", 950, 100), n.begin("t1", 960, 200), n.hb(1_000, 1_100), n.close("r1", 1_500),
        n.end("t1", 1_600), n.snapshot(1_700, readers=[], txs=[]), n.hb(2_000, 1_200))]
    return n, msgs


def names(check: NodeCheck) -> list[str]:
    return [f.check for f in check.findings()]


def test_a_conforming_node_has_no_findings_and_other_nodes_are_skipped() -> None:
    n, msgs = good()
    other = NodeClient("n2")
    msgs.append((b"n2", other.close("zz", 2_100)))
    msgs.append((b"n1", n.hb(2_100, 1_300), [("safepoint-cluster", b"default")]))  # the header a client sends
    check = run(msgs)
    assert check.findings() == [] and check.events == 9
    assert check.report()["conforms"] is True


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda n, m: m.append((b"n1", b"{not json")), "invalid"),
    (lambda n, m: m.append((b"other", n.hb(2_100, 1_300))), "key"),
    (lambda n, m: m.append((b"n1", n.hb(2_100, 1_300), [("safepoint-cluster", b"c9")])), "header"),
    (lambda n, m: m.append((b"n1", {**n.hb(2_100, 1_300), "seq": n.seq - 1})), "seq_repeat"),
    (lambda n, m: m.append((b"n1", {**n.hb(2_100, 1_300), "seq": 2})), "seq_back"),
    (lambda n, m: m.append((b"n1", {**n.hb(2_100, 1_300), "seq": n.seq + 5})), "seq_gap"),
    (lambda n, m: m.append((b"n1", {**n.hb(2_100, 1_300), "incarnation": -1 + n.incarnation})), "incarnation_back"),
    (lambda n, m: m.append((b"n1", {**n.hb(2_100, 1_300), "incarnation": -1 + n.incarnation, "seq": 100})),
     "two_processes"),
    (lambda n, m: m.append((b"n1", n.hb(2_000 + LEASE, 1_300))), "heartbeat_sparse"),
    (lambda n, m: m.append((b"n1", n.close("never", 2_100))), "close_unknown"),
    (lambda n, m: m.append((b"n1", n.snapshot(2_100, readers=[{"reader_id": "hidden", "read_ts": 10}], txs=[]))),
     "unpublished_hold"),
    (lambda n, m: m.append((b"n1", n.hb(2_100, 1_300, groups=[{"group": "g2", "leader": True,
                                                                "published_min_tx_time": None}]))),
     "leader_never_publishes"),
])
def test_each_departure_is_named_once(mutate: Any, expected: str) -> None:
    n, msgs = good()
    if expected in ("incarnation_back", "two_processes"):
        n.restart()
        msgs.append((b"n1", n.hb(2_050, 1_250)))
    mutate(n, msgs)
    check = run(msgs)
    assert names(check) == [expected]
    assert check.findings()[0].example.startswith("partition 0 offset") or expected in ("leader_never_publishes",)
    assert check.report()["conforms"] is False


def test_a_departure_seen_twice_is_named_once_and_counted() -> None:
    n, msgs = good()
    msgs += [(b"n1", b"{not json"), (b"n1", n.close("never", 2_100)), (b"n1", b"[]"), (b"n1", n.close("nor", 2_200))]
    check = run(msgs)
    assert [(f.check, f.count) for f in check.findings()] == [("invalid", 2), ("close_unknown", 2)]


def test_closes_are_judged_only_once_the_open_set_is_known() -> None:
    n = NodeClient("n1")
    mid_stream = [(b"n1", n.hb(0, 1_000)), (b"n1", n.close("opened-before", 10))]
    assert names(run(mid_stream, first=False)) == []
    after_snapshot = [*mid_stream, (b"n1", n.snapshot(20, readers=[], txs=[])), (b"n1", n.close("x", 30))]
    assert names(run(after_snapshot, first=False)) == ["close_unknown"]
    n.restart()  # a new process has no readers open: a close of an unknown reader is a departure at once
    assert names(run([*mid_stream, (b"n1", n.hb(40, 1_000)), (b"n1", n.close("y", 50))], first=False)) == ["close_unknown"]


def test_no_event_or_no_heartbeat() -> None:
    assert run([]).report()["conforms"] is False
    n = NodeClient("n1")
    assert names(run([(b"n1", n.open("r", 5, 0))])) == ["heartbeat_sparse"]
    assert set(CHECKS) >= {"invalid", "key"}


def test_a_snapshot_in_parts_is_judged_whole_and_broken_parts_are_named() -> None:
    n, msgs = good()
    readers = [{"reader_id": f"r{i}", "read_ts": 1_300 + i} for i in range(4)]
    whole = [(b"n1", {**n.snapshot(2_100, readers=readers[k:k + 2], txs=[]), "part": k // 2, "parts": 2})
             for k in (0, 2)]
    check = run([*msgs, *whole])
    assert check.findings() == []
    n, msgs = good()
    broken = [(b"n1", {**n.snapshot(2_100, readers=readers[:2], txs=[]), "part": 0, "parts": 2}),
              (b"n1", n.hb(2_150, 1_300))]
    assert names(run([*msgs, *broken])) == ["snapshot_parts"]


def test_records_deleted_before_they_were_read_are_not_the_nodes_seq_gap() -> None:
    n, msgs = good()
    check = NodeCheck("default", "n1", Policy(), from_first_event=True)
    events = [*msgs, (b"n1", n.hb(2_100, 1_300)), (b"n1", n.hb(2_200, 1_300)), (b"n1", n.hb(2_300, 1_300))]
    for offset, (key, value) in enumerate(events):
        if offset == len(events) - 2:
            continue  # deleted from the topic before check-node read it: offsets skip, and so does seq
        check.feed(key, json.dumps(value).encode(), 0, offset)
    assert names(check) == [] and check.report()["skipped_offsets"] == 1
