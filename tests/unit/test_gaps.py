"""Events lost from the log before the job read them (``core/gaps.py``): nothing lost is trusted."""

from __future__ import annotations

import json
from typing import Any

from safepoint.core import Engine, Output, Policy, Position
from safepoint.core.gaps import Gap
from safepoint.streaming.kafka_source import find_gaps

from core_helpers import NodeClient, alerts, check_output, cluster_event, directives

T0 = 1_767_225_600_000
LEASE = 10_000
PARTITION = {"c1": 0, "n1": 1, "n2": 2, "c2": 0, "m1": 1, "c3": 0, "k1": 1}


class Log:
    """An engine fed messages as the job reads them: each key on its own partition."""

    def __init__(self, **policy: Any) -> None:
        self.engine = Engine(Policy(node_lease_ms=LEASE, **policy))
        self.outputs: list[Output] = []
        self.offsets: dict[int, int] = {}

    def feed(self, *events: dict[str, Any]) -> list[Output]:
        outs: list[Output] = []
        for ev in events:
            key = ev.get("node") or ev.get("cluster", "default")
            p = PARTITION[key]
            off = self.offsets[p] = self.offsets.get(p, -1) + 1
            outs += self.engine.process(json.dumps(ev), Position("ev", p, off, key))
        return self._took(outs)

    def lose(self, *events: dict[str, Any]) -> None:
        """Events the broker appended and lost before the job read them: their offsets go by."""
        for ev in events:
            p = PARTITION[ev.get("node") or ev.get("cluster", "default")]
            self.offsets[p] = self.offsets.get(p, -1) + 1

    def gap(self, gid: int, partition: int, ms: int, kind: str = "lost", control: bool = False) -> list[Output]:
        """A gap of the events topic's ``partition`` (``control``: of the control topic's)."""
        return self._took(self.engine.gap(Gap(gid, "ctl" if control else "ev", partition, 0,
                                              self.offsets.get(partition, 0) + 1, kind, ms, control)))

    def _took(self, outs: list[Output]) -> list[Output]:
        for o in outs:
            check_output(o)
        self.outputs += outs
        return outs

    def safe(self) -> int | None:
        ds = directives(self.outputs)
        return ds[-1]["safe_ts"] if ds else None

    def alerts(self, kind: str, state: str | None = None) -> list[dict[str, Any]]:
        return alerts(self.outputs, kind, state)


def start(log: Log) -> tuple[NodeClient, NodeClient]:
    n1, n2 = NodeClient("n1", "c1"), NodeClient("n2", "c1")
    log.feed(cluster_event("topology", 1, T0, "c1", nodes={"n1": [], "n2": []}), n1.hb(T0, 1_000), n2.hb(T0, 1_000))
    assert log.safe() == 1_000
    return n1, n2


def test_a_reader_whose_open_was_lost_is_never_passed_while_open() -> None:
    log = Log()
    n1, n2 = start(log)
    log.lose(n1.open("r", 1_500, T0 + 1_000))  # the reader's open is gone with the records deleted
    out = log.gap(1, PARTITION["n1"], T0 + 2_000)
    (raised,) = [o.value for o in out if o.value["kind"] == "events_lost"]
    assert "events of it were lost" in [o.value for o in out if o.value["kind"] == "awaiting_snapshot"][0]["detail"]
    assert (raised["kind"], raised["state"], raised["severity"]) == ("events_lost", "raised", "critical")
    assert "n1" in raised["detail"] and "n2" not in raised["detail"] and "own events" not in raised["detail"]
    log.feed(n2.hb(T0 + 3_000, 5_000))
    out = log.feed(n1.hb(T0 + 3_001, 5_000))
    assert log.safe() == 1_000, "n1 owes a snapshot: the round holds"
    assert [o.value["reason"] for o in out if o.value.get("type") == "snapshot_request"] == ["events_lost"]
    log.feed(n1.snapshot(T0 + 3_500, readers=[{"reader_id": "r", "read_ts": 1_500}], txs=[]))
    assert log.safe() == 1_500, "restated: its reader holds the safe point"
    assert log.alerts("events_lost", "cleared"), "every node of the gap restated"
    log.feed(n1.close("r", T0 + 4_000))
    assert log.safe() == 5_000
    log.feed(n2.hb(T0 + 3_000 + 2 * LEASE, 6_000), n1.hb(T0 + 3_001 + 2 * LEASE, 6_000))
    assert log.engine.clusters["c1"].recovery is None, "the gap's recovery ended: the shortcut runs again"


def test_a_gap_where_control_events_live_holds_the_safe_point_until_its_ttl_or_an_acknowledgement() -> None:
    log = Log(max_service_hold_ttl_ms=60_000)
    n1, n2 = start(log)
    log.feed({"v": 1, "type": "service_hold", "cluster": "c1", "holder": "cdc", "ts": 1_200, "ttl_ms": 5_000,
              "wall_ms": T0 + 10})
    log.lose({"v": 1, "type": "service_hold", "cluster": "c1", "holder": "backup", "ts": 1_100, "ttl_ms": 50_000,
              "wall_ms": T0 + 20})
    (raised,) = [o.value for o in log.gap(1, PARTITION["c1"], T0 + 1_000) if o.value["kind"] == "events_lost"]
    assert "the cluster's own events" in raised["detail"] and "ack-gap" in raised["detail"]
    for k in range(1, 6):  # nodes move on for 50 s: the cdc hold (5 s TTL) does not expire, nothing advances
        log.feed(n1.hb(T0 + k * 10_000, 1_000 + k * 1_000), n2.hb(T0 + k * 10_000 + 1, 1_000 + k * 1_000))
    assert log.safe() == 1_000 and log.alerts("service_hold_expired") == []
    status_round = log.engine.clusters["c1"]
    assert status_round.gaps.frozen(status_round.cluster_time)
    # the backup's holder renews: its hold is known again; an operator acknowledges the gap
    log.feed({"v": 1, "type": "service_hold", "cluster": "c1", "holder": "backup", "ts": 1_100, "ttl_ms": 50_000,
              "wall_ms": T0 + 50_500})
    log.feed({"v": 1, "type": "gap_ack", "cluster": "c1", "gap": 1, "wall_ms": T0 + 50_600, "action_id": "a1"})
    log.feed(n1.hb(T0 + 51_000, 7_000), n2.hb(T0 + 51_001, 7_000))
    assert log.safe() == 1_100, "acknowledged: it moves to the renewed hold, not past it"
    assert log.alerts("events_lost", "cleared") and log.alerts("service_hold_expired"), "the cdc hold ran out after"
    actions = log.engine.clusters["c1"].control.actions
    assert actions[-1]["outcome"] == "applied" and "gap" in actions[-1]["detail"]


def test_a_node_outside_the_topology_whose_events_were_lost_restates_before_it_joins() -> None:
    """The node's reader was lost while the topology left it out: its recovery outlives the gap's
    window, so the topology that makes it a member later does not count it before its snapshot."""
    log = Log()
    n1, n2 = start(log)
    log.feed(cluster_event("topology", 2, T0 + 10, "c1", nodes={"n2": []}), n1.hb(T0 + 20, 1_000))
    log.lose(n1.open("r", 2_500, T0 + 30))
    log.gap(1, PARTITION["n1"], T0 + 40)
    for i in range(1, 4):  # past the gap's window: a lease of cluster time goes by
        log.feed(n1.hb(T0 + i * LEASE, 2_000), n2.hb(T0 + i * LEASE, 2_000))
    assert log.safe() == 2_000, "n1 is no member: the round does not wait for it"
    log.feed(cluster_event("topology", 3, T0 + 3 * LEASE + 1, "c1", nodes={"n1": [], "n2": []}))
    log.feed(n1.hb(T0 + 4 * LEASE, 3_000), n2.hb(T0 + 4 * LEASE, 3_000))
    assert log.safe() == 2_000, "a member now, but it owes its snapshot: the lost reader at 2_500 may be open"
    log.feed(n1.snapshot(T0 + 4 * LEASE + 1, readers=[{"reader_id": "r", "read_ts": 2_500}], txs=[]))
    log.feed(n1.hb(T0 + 4 * LEASE + 2, 3_000), n2.hb(T0 + 4 * LEASE + 2, 3_000))
    assert log.safe() == 2_500 and log.engine.clusters["c1"].recovery is None, "restated: its reader holds"


def test_without_an_acknowledgement_the_hold_ends_when_every_lost_hold_would_have_run_out() -> None:
    log = Log(max_service_hold_ttl_ms=30_000)
    n1, n2 = start(log)
    log.gap(1, 0, T0 + 1_000, control=True)  # the control topic's, taken at the cluster's time then, T0
    log.feed(n1.hb(T0 + 29_998, 3_000), n2.hb(T0 + 29_999, 3_000))
    assert log.safe() == 1_000
    log.feed(n1.hb(T0 + 30_000, 4_000), n2.hb(T0 + 30_001, 4_000))
    assert log.safe() == 4_000, "30 s of cluster time after the gap: every hold set in it would have expired"
    assert not log.alerts("events_lost", "cleared"), "a pause lost there cannot be known: it stays until acknowledged"
    log.feed({"v": 1, "type": "gap_ack", "cluster": "c1", "wall_ms": T0 + 32_000})
    assert log.alerts("events_lost", "cleared")


def test_a_cluster_met_within_a_lease_of_a_gap_takes_it_and_a_later_one_does_not() -> None:
    log = Log()
    start(log)
    log.gap(1, PARTITION["m1"], T0 + 1_000)
    m1, k1 = NodeClient("m1", "c2"), NodeClient("k1", "c3")
    out = log.feed(m1.hb(T0 + 1_000 + LEASE // 2, 2_000))
    assert [o.value["kind"] for o in out if o.value.get("type") == "alert"][:1] == ["events_lost"]
    assert any(o.value.get("type") == "snapshot_request" for o in out), "its first events may be what was lost"
    out = log.feed(k1.hb(T0 + 1_000 + 2 * LEASE, 2_000))
    assert not [o for o in out if o.value.get("kind") == "events_lost" or o.value.get("type") == "snapshot_request"]


def test_a_changed_partition_count_makes_every_node_restate() -> None:
    log = Log()
    n1, n2 = start(log)
    (raised,) = [o.value for o in log.gap(1, -1, T0 + 1_000, "partitions") if o.value["kind"] == "events_lost"]
    assert "n1, n2" in raised["detail"]
    log.feed(n1.snapshot(T0 + 2_000, readers=[], txs=[]), n1.hb(T0 + 2_001, 3_000), n2.hb(T0 + 2_002, 3_000))
    assert log.safe() == 1_000
    log.feed(n2.snapshot(T0 + 2_003, readers=[], txs=[]), {"v": 1, "type": "gap_ack", "cluster": "c1", "wall_ms": T0})
    log.feed(n1.hb(T0 + 2_004, 3_000))
    assert log.safe() == 3_000


def test_the_source_finds_each_kind_of_gap() -> None:
    marks = {"0": (0, 10), "1": (5, 9), "2": (0, 3)}
    begin, found = find_gaps({"0": 10, "1": 2, "2": 7}, marks, "ev", 0, 1_000)
    assert begin == {"0": 10, "1": 5, "2": 0}
    assert [(g["partition"], g["first"], g["end"], g["kind"]) for g in found] == [(1, 2, 5, "lost"), (2, 7, 0, "gone_back")]
    assert [g["id"] for g in found] == [1_000, 1_001], "ids follow the clock and only grow"
    begin, found = find_gaps({"0": 10, "1": 5}, marks, "ev", 5_000, 1_000)
    assert [(g["partition"], g["kind"], g["id"]) for g in found] == [(-1, "partitions", 5_001)] and begin["2"] == 0
    assert find_gaps({}, marks, "ev", 0, 1) == ({"0": 0, "1": 5, "2": 0}, []), "the first batch starts at each start"
    assert find_gaps({"0": 3, "1": 5, "2": 3}, marks, "ev", 0, 1)[1] == [], "nothing lost: no gap"
    begin, found = find_gaps({"0": 3, "1": 5, "2": 0}, marks, "ev", 0, 1, made_again=True)
    assert [(g["partition"], g["kind"]) for g in found] == [(0, "gone_back")] and begin == {"0": 0, "1": 5, "2": 0}, \
        "another topic id: read again from each start (a partition read from its start loses nothing)"


# -- the property: nothing lost is trusted --------------------------------------------------------

import zlib  # noqa: E402
from dataclasses import replace  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_properties import EVENTS_TOPIC, SETTINGS, HoldModel, LogBuilder, encode, scenarios  # noqa: E402

PARTS = 3


def key_of(msg: Any) -> str:
    return msg.get("node") or msg.get("cluster") or "default" if isinstance(msg, dict) else "junk"


@SETTINGS
@given(scenarios, st.floats(0.1, 0.9), st.integers(0, PARTS - 1), st.integers(1, 40))
def test_no_directive_passes_a_hold_whose_events_were_lost(sc: Any, cut: float, lost_partition: int, lost: int) -> None:
    """A generated log over three partitions; after a cut, the next ``lost`` messages of one partition
    are lost (the job never reads them) and the job takes the gap before anything else. The model of
    the holds takes every message, the lost ones too: no directive after the gap passes a hold that is
    live in truth (nor one opened below the safe point, which the job alerts when it learns of it)."""

    log = LogBuilder(sc).build()
    at = int(len(log) * cut)
    # the losses that matter most: from a reader or transaction opened by a node the job already knows
    seen: set[str] = set()
    for i, msg in enumerate(log):
        if i >= at and isinstance(msg, dict) and msg["type"] in ("reader_open", "tx_begin") and key_of(msg) in seen:
            at, lost_partition = i, zlib.crc32(key_of(msg).encode()) % PARTS
            break
        seen.add(key_of(msg))
    policy = replace(sc.policy, max_service_hold_ttl_ms=0)  # no freeze for lost control events: the nodes' part
    model = HoldModel(policy)
    engine = Engine(policy)
    offsets = [0] * PARTS
    dropped = 0
    gap_taken = False
    for i, msg in enumerate(log):
        p = zlib.crc32(key_of(msg).encode()) % PARTS
        offset = offsets[p]
        offsets[p] += 1
        if i >= at and not gap_taken:
            outs = engine.gap(Gap(1, EVENTS_TOPIC, lost_partition, offsets[lost_partition] - (p == lost_partition),
                                  offsets[lost_partition] - (p == lost_partition) + lost, "lost", 0))
            gap_taken = True
            first_lost = offsets[lost_partition] - (p == lost_partition)
        if gap_taken and p == lost_partition and offset < first_lost + lost:
            model.apply(msg)  # it happened, the job never sees it
            dropped += 1
            continue
        outs = engine.process(encode(msg), Position(EVENTS_TOPIC, p, offset, None))
        model.apply(msg)
        for d in [o.value for o in outs if o.channel == "directives" and o.value["type"] == "compaction"]:
            for node, kind, hid, ts in model.live_holds(d["cluster"]):
                assert d["safe_ts"] <= ts, f"directive {d['seq']} passes live {kind} {hid} at {ts} on {node} (lost: {dropped})"
            model.safe[d["cluster"]] = d["safe_ts"]


def test_the_jobs_batches_take_a_gap_as_replay_does() -> None:
    """The job's operators (the real Router and ClusterJob on an in-memory state store) over two batches
    with a gap handed to the second, against ``Engine.gap`` at the batch boundary: the same outputs."""
    from test_batch import TOPICS, by_topic, messages

    from local_job import LocalJob, replay_in_batches

    policy = Policy(retention=200_000, node_lease_ms=1_500, directive_interval_ms=100, stall_ms=3_000)
    msgs = messages(7, partitions=3, clusters=2)
    half = len(msgs) // 2
    lost_partition = 1
    kept = [m for m in msgs[half:] if not (m[0] == lost_partition and m[1] < min(x[1] for x in msgs[half:] if x[0] == 1) + 5)]
    first_kept = min(m[1] for m in kept if m[0] == lost_partition)
    gap = Gap(1, "ev", lost_partition, first_kept - 5, first_kept, "lost", int(json.loads(msgs[half][3])["wall_ms"]))
    job = LocalJob(policy.to_dict(), TOPICS)
    written = job.run_batch(msgs[:half])
    job.router.gaps = [gap.to_json()]
    written += job.run_batch(kept)
    got = by_topic(written)
    got.pop("st", None)

    expected = replay_in_batches(Engine(policy), [msgs[:half], kept], {1: [gap]})
    want = by_topic(expected)
    assert any(a[1]["kind"] == "events_lost" for a in want.get("al", [])), "the gap reached a cluster"
    assert got.get("dir") == want.get("dir") and got.get("al") == want.get("al")


# -- a node's processes the job could not see ------------------------------------------------------

T0 = 1_700_000_000_000
M0 = 1_000_000
GAP_POLICY = Policy(retention=0, node_lease_ms=1_000, incarnation_grace_ms=0, directive_interval_ms=0,
                    max_service_hold_ttl_ms=0)


def _through_gap(events: list[dict[str, Any] | None]) -> list[tuple[int, int]]:
    """``events`` of node n0 on partition 0 (the topology on partition 1 first), None where a
    message was lost: the gap is taken before the first message after the lost ones. (offset,
    safe_ts) of each compaction directive made after the gap."""
    engine = Engine(GAP_POLICY)
    engine.process(json.dumps({"v": 1, "type": "topology", "version": 1, "wall_ms": T0, "nodes": {"n0": []}}).encode(),
                   Position(EVENTS_TOPIC, 1, 0, None))
    made: list[tuple[int, int]] = []
    lost: list[int] = []
    for offset, ev in enumerate(events):
        if ev is None:
            lost.append(offset)
            continue
        if lost and offset == lost[-1] + 1:
            engine.gap(Gap(1, EVENTS_TOPIC, 0, lost[0], offset, "lost", 0))
        outs = engine.process(json.dumps({"v": 1, "node": "n0", **ev}).encode(), Position(EVENTS_TOPIC, 0, offset, None))
        if lost:
            made += [(offset, o.value["safe_ts"]) for o in outs
                     if o.channel == "directives" and o.value["type"] == "compaction"]
    return made


def _hb(inc: int, seq: int, wall: int, mvcc: int) -> dict[str, Any]:
    return {"type": "heartbeat", "incarnation": inc, "seq": seq, "wall_ms": T0 + wall, "mvcc_now": M0 + mvcc}


def _open(inc: int, seq: int, wall: int, rid: str, ts: int) -> dict[str, Any]:
    return {"type": "reader_open", "incarnation": inc, "seq": seq, "wall_ms": T0 + wall, "reader_id": rid, "read_ts": M0 + ts}


def _close(inc: int, seq: int, wall: int, rid: str) -> dict[str, Any]:
    return {"type": "reader_close", "incarnation": inc, "seq": seq, "wall_ms": T0 + wall, "reader_id": rid}


def _snapshot(inc: int, seq: int, wall: int, cut: int, *readers: tuple[str, int]) -> dict[str, Any]:
    return {"type": "snapshot", "incarnation": inc, "seq": seq, "wall_ms": T0 + wall, "cut": M0 + cut,
            "readers": [{"reader_id": rid, "read_ts": M0 + ts} for rid, ts in readers], "txs": []}


def test_an_incarnation_whose_every_event_was_lost_is_a_second_live_process_when_it_speaks() -> None:
    """Incarnation 2 started and spoke only in the lost messages; incarnation 3 restated after the
    gap. When 2 speaks again (a reader, after 3 started) the job has never heard of it: it may be a
    second live process, so its reader holds the safe point until it closes (it was ignored as
    stale, and the next directive passed it); the round goes on once 2 restated and 0 (superseded
    where its successor's start was lost) was silent for a lease."""
    made = _through_gap([_hb(0, 0, 0, 0), _open(0, 1, 0, "r1", 0), _close(0, 2, 0, "r1"),
                         None, None,  # incarnation 2's heartbeats
                         _hb(3, 0, 500, 225), _snapshot(3, 1, 500, 225), _open(2, 10_001, 501, "z1", 194),
                         _hb(3, 2, 501, 225), _snapshot(2, 10_002, 1_200, 194, ("z1", 194)), _hb(3, 3, 1_300, 225),
                         _hb(3, 4, 1_600, 225), _close(2, 10_003, 1_700, "z1"), _hb(3, 5, 1_800, 225)])
    z1_closed = 12
    assert made and all(ts <= M0 + 194 for offset, ts in made if offset < z1_closed), made
    assert made[-1] == (z1_closed, M0 + 225), made


def test_an_older_incarnation_that_speaks_after_a_start_that_was_lost_is_a_second_live_process() -> None:
    """Incarnation 1's first message was lost; incarnation 0 opened a reader after it (the job read
    that as 0's own next message), then 1 spoke: the job cannot tell that 0 outlived 1's start, so
    0's holds stay as a second live process's until it is silent for a lease (with no grace they went
    at once, and the next directive passed the reader)."""
    made = _through_gap([_hb(0, 0, 0, 0), _open(0, 1, 0, "r1", 0), _close(0, 2, 0, "r1"),
                         None,  # incarnation 1's first heartbeat
                         _open(0, 10_001, 332, "z2", -61), _hb(1, 1, 332, 10), _snapshot(1, 2, 332, 10),
                         _hb(1, 3, 333, 10), _hb(1, 4, 1_000, 10), _hb(1, 5, 1_400, 10)])
    silent = 9  # incarnation 0 silent for node_lease_ms since its reader opened
    assert all(ts <= M0 - 61 for offset, ts in made if offset < silent), made
    assert made and made[-1] == (9, M0 + 10), made
