"""The job's batch logic (core/batch.py through the real operators of streaming/processors.py)
gives exactly replay's outputs.

The processors run in one process (``local_job.LocalJob``) over micro-batches of a
multi-partition, multi-cluster log with restarts, duplicates and bad messages. The reference is
``Engine`` (what ``replay`` runs) fed each batch in the job's log order: per cluster, partitions
merged by the events' ``wall_ms``. The Spark job is compared with replay the same way in
tests/integration (test_parity, test_faults, test_router_placement).
"""

from __future__ import annotations

import json
import random
import zlib
from typing import Any

import pytest

from safepoint.core import Engine, Position
from safepoint.core.batch import (
    CLUSTER_HEADER,
    METRICS,
    BucketNodes,
    DeadLetterPayload,
    Group,
    Raw,
    Typed,
    accounting_row,
    admit,
    bucket_of,
    counts_of,
    header_cluster,
    merge_log_order,
    route,
    route_records,
    run_batch,
    untyped,
)
from safepoint.core.cluster import ClusterState
from safepoint.core.engine import Outcome, Result, Tally, step
from safepoint.core.holds import EVENTS as HOLD_EVENTS
from safepoint.core.origin import CONTROL, EVENTS, MISROUTED
from safepoint.core.policy import Policy
from safepoint.core.records import Hold
from safepoint.core.status import assemble
from safepoint.devtools.simulate import SimConfig, generate_log, key_of
from safepoint.errors import ConfigError
from safepoint.replay import final_status
from safepoint.streaming.stored import (
    KEPT,
    Kept,
    decode_cluster,
    encode_cluster,
    pack_group,
    stored_buckets,
    stored_nodes,
    unpack_group,
    unpack_groups,
)

from core_helpers import validator
from local_job import ORIGINS, LocalJob, Message, broker_time, header_of, position

TOPICS = {"events": "ev", "control": "ctl", "directives": "dir", "alerts": "al", "deadletter": "dl", "status": "st"}
JUNK: list[Any] = [b"\xff\xfe", b"{not json", b"[]", b"", json.dumps({"v": 2, "type": "heartbeat"}).encode(),
                   json.dumps({"v": 1, "type": "reader_open", "cluster": "c0"}).encode()]


def messages(seed: int, partitions: int = 3, clusters: int = 2, duration_ms: int = 8_000) -> list[Message]:
    """Generated clusters merged by wall time, with duplicates and junk, keyed to partitions; with a
    seed divisible by 3, each message stamped by the broker and some nodes' clocks off. The node
    events of cluster ``c0`` name it in their record's header, as the node clients do (and some of
    the junk after them); the other clusters' come without, as from an older client."""
    rng = random.Random(seed)
    evs: list[dict[str, Any]] = []
    for c in range(clusters):
        cfg = SimConfig(nodes=5 + c, rate=400, cluster=f"c{c}", long_reader_share=0.02, long_reader_ms=(500, 4_000),
                        restart_per_node_per_min=4.0, groups_per_node=1)
        evs += generate_log(cfg, duration_ms, seed=seed * 10 + c)
    evs.sort(key=lambda e: e["wall_ms"])
    offsets = [0] * partitions
    out: list[Message] = []

    def add(key: str, value: bytes, broker: int | None, header: str | None) -> None:
        p = zlib.crc32(key.encode()) % partitions
        out.append((p, offsets[p], key.encode(), value) if broker is None and header is None else
                   (p, offsets[p], key.encode(), value, broker) if header is None else
                   (p, offsets[p], key.encode(), value, broker, header))
        offsets[p] += 1

    skewed = seed % 3 == 0  # the broker stamps each message; some nodes' clocks are off by a minute or 20 s
    for ev in evs:
        broker = None
        if skewed:
            broker = ev["wall_ms"] + 3
            if "node" in ev:
                ev = {**ev, "wall_ms": ev["wall_ms"] + (0, -60_000, 20_000)[zlib.crc32(ev["node"].encode()) % 3]}
        header = ev["cluster"] if ev["cluster"] == "c0" and "node" in ev else None
        add(key_of(ev), json.dumps(ev).encode(), broker, header)
        if rng.random() < 0.02:
            add(key_of(ev), json.dumps(ev).encode(), broker, header)  # a duplicate delivery
        if rng.random() < 0.01:
            add(rng.choice(["junk", key_of(ev)]), rng.choice(JUNK), broker, header)
    return out


def run(msgs: list[Message], splits: list[int], policy: Policy, accounting: bool = False,
        buckets: int = 8, keep: str = "some") -> tuple[dict[str, list[Any]], LocalJob]:
    job = LocalJob(policy.to_dict(), TOPICS, buckets=buckets, accounting_topic="acct" if accounting else "", keep=keep)
    written: list[tuple[str, str | None, str]] = []
    start = 0
    for end in [*splits, len(msgs)]:
        written += job.run_batch(msgs[start:end])
        start = end
    return by_topic(written), job


def replay_in_job_order(msgs: list[Message], splits: list[int], policy: Policy
                        ) -> tuple[dict[str, list[Any]], list[dict[str, int]], Engine]:
    """``Engine`` over each batch in the job's log order (per cluster: partitions merged by the
    router's ``wall_ms``, -1 for a dead letter); the accounting row of every message and the
    counters of every batch, as the job writes them."""
    engine = Engine(policy, record=True, origins=ORIGINS)
    written: list[tuple[str, str | None, str]] = []
    accounting: list[dict[str, int]] = []
    start = 0
    channel_topic = {"directives": "dir", "alerts": "al", "deadletter": "dl"}
    for end in [*splits, len(msgs)]:
        groups: dict[str, list[Any]] = {}
        for m in msgs[start:end]:
            p, o, k, v = m[:4]
            pos = position(p, o, k)
            ((cluster, (routed,)),) = route([(pos.partition, o, k, v, broker_time(m))], pos.topic, policy,
                                            origin=ORIGINS[pos.topic]).items()
            groups.setdefault(cluster, []).append((p, o, routed.log_ms, k, v, broker_time(m)))
        tally = Tally()
        for cluster in groups:
            for p, o, _w, k, v, b in merge_log_order(groups[cluster]):
                outs = engine.process(v, position(p, o, k), b)
                assert engine.outcomes is not None
                label = engine.outcomes[-1][2]
                result, _, why = label.partition(":")
                tally.add(Outcome(Result(result), why or None, []))
                _ch, key, row = accounting_row(p, o, label)
                written.append(("acct", key, json.dumps(row)))
                written += [(channel_topic[out.channel], out.key, json.dumps(out.value)) for out in outs]
        accounting.append(counts_of(tally))
        start = end
    return by_topic(written), accounting, engine


def job_equals_replay(msgs: list[Message], splits: list[int], policy: Policy, buckets: int) -> dict[str, list[Any]]:
    """Run the job's operators and replay over the same batches; both give the same outputs and
    the same final status. Returns the job's outputs by topic (status records left out)."""
    expected, _acct, engine = replay_in_job_order(msgs, splits, policy)
    got, _job = run(msgs, splits, policy, buckets=buckets)
    assert final_status_of(got.pop("st")) == final_status(engine)
    expected.pop("acct")
    assert got == expected
    return got


def final_status_of(rows: list[Any]) -> dict[str, Any]:
    """The status a reader of the status topic ends with: the last part of every key, joined."""
    last = dict(rows)
    clusters = sorted(k for k in last if "/" not in k)
    return {"clusters": [assemble(last[c], [v for k, v in last.items() if k.startswith(c + "/")]) for c in clusters]}


def by_topic(written: list[tuple[str, str | None, str]]) -> dict[str, list[Any]]:
    by_topic: dict[str, list[Any]] = {}
    for topic, key, value in written:
        by_topic.setdefault(topic, []).append((key, json.loads(value)))
    # each cluster's outputs keep their order; the order between clusters is not defined
    for topic, rows in by_topic.items():
        if topic in ("dl", "acct"):
            rows.sort(key=lambda kv: (kv[1]["partition"], kv[1]["offset"]))
        else:
            rows.sort(key=lambda kv: kv[1]["cluster"])
    return by_topic


@pytest.mark.parametrize(("seed", "keep"), [(1, "some"), (2, "some"), (3, "some"), (1, "all"), (3, "none")])
def test_job_batches_give_replays_outputs(seed: int, keep: str) -> None:
    """The job over batches of a log gives replay's outputs, status and accounting, whichever of its
    kept states each batch finds (``keep``: every one, none, some)."""
    msgs = messages(seed)
    rng = random.Random(seed)
    splits = sorted(rng.sample(range(1, len(msgs)), 12))
    policy = Policy(retention=200_000, node_lease_ms=1_500, directive_interval_ms=100, stall_ms=3_000,
                    reader_age_warning_ms=1_500, reader_age_critical_ms=3_000, in_doubt_timeout_ms=1_000,
                    clock_skew_window_ms=1_000)
    expected, accounting, engine = replay_in_job_order(msgs, splits, policy)
    fast, fjob = run(msgs, splits, policy, accounting=True, keep=keep)
    status = fast.pop("st")
    assert len(status) > len({k for k, _ in status}), "parts are written again as they change"
    for _key, part in status:
        validator(part["type"]).validate(part)  # schemas/outputs/node_status.json, cluster_status.json
    assert final_status_of(status) == final_status(engine)
    assert len(expected["dir"]) >= 8 and expected.get("dl") and expected.get("al"), "the log exercises directives, alerts, dead letters"
    assert "reader_age" in {a[1]["kind"] for a in expected["al"]}
    if seed % 3 == 0:
        assert "clock_skew" in {a[1]["kind"] for a in expected["al"]}, "stamped by the broker, some clocks off"
    assert fast == expected
    assert fjob.accounting == accounting
    assert sum(b["consumed"] for b in fjob.accounting) == len(msgs)
    assert set(fjob.accounting[0]) == set(METRICS)


def test_job_batches_are_invariant_to_batch_splits_and_bucket_count() -> None:
    msgs = messages(4, partitions=1, clusters=1)
    policy = Policy(retention=100_000, node_lease_ms=2_000)
    whole, _ = run(msgs, [], policy)
    split, _ = run(msgs, list(range(97, len(msgs), 97)), policy, buckets=3)
    assert final_status_of(whole.pop("st")) == final_status_of(split.pop("st"))
    assert whole == split
    # one partition is the file order: replay of the same messages gives the same directives
    engine = Engine(policy)
    directives = []
    for p, o, k, v, *_ in msgs:
        directives += [json.loads(json.dumps(out.value)) for out in engine.process(v, Position("ev", p, o, k))
                       if out.channel == "directives"]
    assert [d for _, d in whole["dir"]] == directives


def test_bucket_of_is_stable_and_spreads() -> None:
    assert bucket_of("", 8) == zlib.crc32(b"") % 8 == 0
    assert bucket_of("n1", 8) == zlib.crc32(b"n1") % 8
    assert len({bucket_of(f"node-{i}", 8) for i in range(100)}) == 8


def test_router_groups_by_cluster_and_keeps_dead_letters_apart() -> None:
    policy = Policy()
    topo = json.dumps({"v": 1, "type": "topology", "cluster": "c1", "wall_ms": 1, "version": 1, "nodes": {"n1": []}})
    hb = json.dumps({"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1", "incarnation": 0, "seq": 1,
                     "wall_ms": 2, "mvcc_now": 5})
    groups = route([(0, 0, b"c1", topo.encode(), None), (0, 1, b"n1", hb.encode(), None), (0, 2, b"x", b"{bad", None)],
                   "ev", policy)
    assert set(groups) == {"c1", ""}
    assert [(r.offset, r.log_ms, r.payload["type"]) for r in groups["c1"]] == [(0, 1, "topology"), (1, 2, "heartbeat")]
    (partition, offset, wall, dead), = groups[""]
    assert (partition, offset, wall, dead.code) == (0, 2, -1, "not_json")


def test_a_record_named_by_its_header_is_parsed_by_its_operator_as_the_router_would() -> None:
    """``route_records`` hands a record whose header names its cluster through unread; ``admit`` (the
    operator's half) gives the very records and dead letters ``route`` gives (a hold event as a
    struct, ``Typed``, which parses into the router's record), and refuses an event whose header
    names another cluster than its own, a hold event too."""
    policy = Policy(max_message_bytes=400)
    hb = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1", "incarnation": 0, "seq": 1, "wall_ms": 2,
          "mvcc_now": 5}
    pause = {"v": 1, "type": "pause", "cluster": "c1", "wall_ms": 3, "action_id": "a1", "reason": "x"}
    reader = {"v": 1, "type": "reader_open", "cluster": "c1", "node": "n1", "incarnation": 0, "seq": 3, "wall_ms": 4,
              "reader_id": "r1", "read_ts": 5}
    values = [json.dumps(hb).encode(), json.dumps({**hb, "cluster": "default"} | {"seq": 2}).encode(),
              json.dumps(pause).encode(), json.dumps(reader).encode(),
              json.dumps({**reader, "cluster": "default"}).encode(), *JUNK, b"x" * 401]
    for origin, topic, kafka in ((EVENTS, "ev", 3), (CONTROL, "ctl", 0)):
        rows = [(kafka, offset, b"k", value, 10 + offset if offset % 2 else None) for offset, value in enumerate(values)]
        parsed = sorted((item for group in route(rows, topic, policy, origin=origin).values() for item in group),
                        key=lambda r: r.offset)
        named = route_records([(*r, "c1") for r in rows], topic, policy, origin=origin)
        assert list(named) == ["c1"] and named["c1"].routed == []
        assert [r.value for r in named["c1"].raw] == values
        admitted = admit("c1", unpack_group(pack_group(named["c1"])).raw, {EVENTS: "ev", CONTROL: "ctl"}, policy)
        structs = [i for i, r in enumerate(admitted) if isinstance(r.payload, Typed)]
        assert structs == ([3] if origin == EVENTS else []), "a hold event of its header's cluster, on the events topic"
        admitted = [untyped("c1", r.payload) if isinstance(r.payload, Typed) else r for r in admitted]
        mismatches = [i for i, v in enumerate(values) if b'"default"' in v]
        assert len(mismatches) == 2
        for dead in (admitted[i] for i in mismatches):
            assert isinstance(dead.payload, DeadLetterPayload) and dead.payload.code == "invalid_field"
            assert dead.payload.reason == ("invalid header safepoint-cluster: it names cluster 'c1', the event's "
                                           "cluster is 'default'")
            assert dead.payload.value["topic"] == topic and dead.payload.value["partition"] == kafka
        assert ([r for i, r in enumerate(admitted) if i not in mismatches]
                == [r for i, r in enumerate(parsed) if i not in mismatches])
        assert any(MISROUTED in r.payload for r in admitted if isinstance(r.payload, dict)), "misrouted marked as before"
    # no header, an empty one or one not UTF-8: the router parses the record itself
    assert header_cluster(None) is None and header_cluster([("other", b"c1")]) is None
    assert header_cluster([(CLUSTER_HEADER, b"")]) is None and header_cluster([(CLUSTER_HEADER, b"\xff")]) is None
    assert header_cluster([("x", None), (CLUSTER_HEADER, "c\u00e9".encode())]) == "c\u00e9"
    mixed = route_records([(0, 0, b"k", values[0], None, None), (0, 1, b"k", values[0], None, "c1"),
                           (0, 2, b"k", b"{bad", None, None)], "ev", policy)
    assert {c: (len(g.routed), len(g.raw)) for c, g in mixed.items()} == {"c1": (1, 1), "": (1, 0)}


@pytest.mark.parametrize("source", ["python", "arrow"])
def test_the_job_with_headers_gives_replays_outputs_from_either_source(source: str) -> None:
    """Cluster c0's node events name it in a header (c1's do not): the job's outputs are replay's,
    routed as the Python source routes or as the router after Spark's kafka source does."""
    msgs = messages(5)
    assert 0 < sum(1 for m in msgs if header_of(m) is not None) < len(msgs)
    splits = sorted(random.Random(5).sample(range(1, len(msgs)), 6))
    policy = Policy(retention=200_000, node_lease_ms=1_500, directive_interval_ms=100)
    expected, accounting, _engine = replay_in_job_order(msgs, splits, policy)
    job = LocalJob(policy.to_dict(), TOPICS, accounting_topic="acct", source=source)
    written: list[tuple[str, str | None, str]] = []
    start = 0
    for end in [*splits, len(msgs)]:
        written += job.run_batch(msgs[start:end])
        start = end
    got = by_topic(written)
    got.pop("st")
    assert got == expected
    assert job.accounting == accounting


def _types(payload: Any) -> dict[str, type]:
    fields = payload if isinstance(payload, dict) else payload._asdict()
    return {k: type(v) for k, v in fields.items()}


def _operator_over(msgs: list[Message], splits: list[int], policy: Policy, typed: bool
                   ) -> tuple[list[Any], int]:
    """The router and the operator's half over the batches of ``msgs``, each cluster's state kept
    in its stored form between batches, ``admit`` with or without ``typed``: every output, counter
    and stored value in order, and how many records came to the operator as structs."""
    topics = {EVENTS: "ev", CONTROL: "ctl"}
    clusters: dict[str, bytes] = {}
    buckets: dict[tuple[str, int], bytes] = {}
    seen: list[Any] = []
    structs = 0
    for start, end in zip([0, *splits], [*splits, len(msgs)], strict=True):
        packed: dict[str, list[bytes]] = {}
        for partition in sorted({m[0] for m in msgs[start:end]}):
            rows = [(*m[:4], broker_time(m), header_of(m)) for m in msgs[start:end] if m[0] == partition]
            for cluster, group in route_records(rows, "ev", policy).items():
                packed.setdefault(cluster, []).append(pack_group(group))
        for cluster, blobs in sorted(packed.items()):
            group = unpack_groups(blobs)
            items = group.routed + admit(cluster, group.raw, topics, policy, typed)
            structs += sum(isinstance(item.payload, Typed) for item in items)
            stored = clusters.get(cluster)
            result = run_batch(cluster, None if stored is None else decode_cluster(stored),
                               stored_nodes(cluster, 8, lambda b, c=cluster: buckets.get((c, b))), items, policy, True)
            if result.cluster is not None:
                clusters[cluster] = encode_cluster(result.cluster)
            written = stored_buckets(result.buckets, 8)
            buckets.update({(cluster, b): bytes(v) for b, v in written.items()})
            seen += [cluster, result.outputs, result.counts, clusters.get(cluster), sorted(written.items())]
    return seen, structs


@pytest.mark.parametrize("seed", [1, 3])
def test_the_operator_offers_hold_events_as_structs_with_the_maps_outcome(seed: int) -> None:
    """A hold's opening or closing that came unread is decoded as a struct by ``admit`` and offered
    to the quiet path as it is, parsed only if refused (``Typed``, ``untyped``): over batches of a
    log with restarts, duplicates, junk and (seed 3) broker times and clocks off, the same outputs
    in the same order, the same counters and the same stored state as with every record parsed."""
    msgs = messages(seed)
    splits = sorted(random.Random(seed).sample(range(1, len(msgs)), 9))
    policy = Policy(retention=200_000, node_lease_ms=1_500, directive_interval_ms=100, reader_age_warning_ms=1_500)
    as_maps, none = _operator_over(msgs, splits, policy, typed=False)
    as_structs, structs = _operator_over(msgs, splits, policy, typed=True)
    assert none == 0 and structs > sum(1 for m in msgs if header_of(m) is not None) // 2
    assert any(o[0] == "directives" for seen in as_maps[1::5] for o in seen), "the log makes directives"
    assert as_structs == as_maps


def test_packed_records_come_back_as_they_were_routed() -> None:
    """The hand-off from router to operator: MessagePack where it carries every value as it is,
    else a pickle (a number with a fraction keeps the parser's own type; an integer beyond 64 bits)."""
    def hb(extra: dict[str, Any]) -> bytes:
        event = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1", "incarnation": 0, "seq": 1,
                 "wall_ms": 2, "mvcc_now": 5, **extra}
        return json.dumps(event).encode()

    cases = {
        "plain, and a dead letter": [hb({}), b"{bad"],
        "not UTF-8": [b'{"v": 1, "x": "\xff"}'],
        "fraction": [hb({"x_ratio": 1.5})],
        "wide integer": [hb({"x_big": 2**70})],
    }
    formats = {}
    for name, values in cases.items():
        rows = [(0, offset, b"k", value, None) for offset, value in enumerate(values)]
        items = [item for group in route(rows, "ev", Policy()).values() for item in group]
        raw = [Raw(1, 0, None, b"k", b"\xff"), Raw(1, 1, 7, None, None)]
        blob = pack_group(Group(items, raw))
        formats[name] = "pickle" if blob[:1] == b"\x80" else "msgpack"
        back, back_raw = unpack_group(blob)
        assert back == items and back_raw == raw, name
        assert all(type(r) is Raw for r in back_raw)
        assert [(type(r.payload), _types(r.payload)) for r in back] == [(type(r.payload), _types(r.payload)) for r in items]
    assert formats == {"plain, and a dead letter": "msgpack", "not UTF-8": "msgpack", "fraction": "pickle",
                       "wide integer": "pickle"}


def _stored_bucket(policy: Policy, buckets: int) -> bytes:
    hb = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1", "incarnation": 0, "seq": 1, "wall_ms": 2, "mvcc_now": 5}
    nodes = stored_nodes("c1", buckets, lambda _b: None)
    assert not isinstance(nodes.node("c1", "n1").apply(hb, policy), str)
    (value,) = stored_buckets(nodes.dump(), nodes.buckets).values()
    return value


def test_changing_node_buckets_on_a_checkpoint_is_refused() -> None:
    stored = _stored_bucket(Policy(), 8)
    with pytest.raises(ConfigError, match="node_buckets is 4 but this checkpoint's state was written with 8"):
        stored_nodes("c1", 4, lambda _b: stored).node("c1", "n1")


def test_a_state_of_a_newer_version_is_refused() -> None:
    import msgspec

    stored = _stored_bucket(Policy(), 8)
    version, buckets, nodes = msgspec.msgpack.decode(stored)
    assert (version, buckets, len(nodes)) == (4, 8, 1)
    newer = msgspec.msgpack.encode([5, buckets, nodes])
    with pytest.raises(ConfigError, match="written by a newer safepoint \\(state version 5, this one reads up to 4\\)"):
        stored_nodes("c1", 8, lambda _b: newer).node("c1", "n1")


def test_a_bucket_of_state_version_3_is_still_read() -> None:
    """The first layout of one operator wrote a bucket as JSON text, each node by name."""
    stored = _stored_bucket(Policy(), 8)
    state = stored_nodes("c1", 8, lambda _b: stored).node("c1", "n1")
    version_3 = json.dumps({"v": 3, "b": 8, "nodes": [state.to_json()]}).encode()
    again = stored_nodes("c1", 8, lambda _b: version_3).node("c1", "n1")
    assert again.to_json() == state.to_json()


def test_a_batch_reads_and_writes_only_the_buckets_it_touches() -> None:
    """Each bucket is one state call to read when the batch first touches one of its nodes and one
    to write; buckets of nodes the batch did not touch are neither read nor written."""
    policy = Policy(retention=10)
    job = LocalJob(policy.to_dict(), TOPICS, buckets=8)

    def hb(node: str, seq: int) -> Message:
        ev = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": 0, "seq": seq,
              "wall_ms": seq, "mvcc_now": 100 + seq}
        return (0, seq, node.encode(), json.dumps(ev).encode())

    names = [f"n{i}" for i in range(40)]
    job.run_batch([hb(n, 1) for n in names])
    all_buckets = {bucket_of(n, 8) for n in names}
    assert len(all_buckets) == 8
    before = job.state_calls()
    job.run_batch([hb("n1", 2), hb("n1", 3)])
    # the cluster's value read and written, n1's bucket read and written
    assert job.state_calls() - before == 4


def test_a_batch_takes_the_states_its_process_wrote_only_while_the_store_holds_those_bytes() -> None:
    """The operator keeps what it stored (``stored.KEPT``) and the next batch takes it as it is
    (no decode) when the store gives back those very bytes; other bytes in the store (another
    worker's batch) are decoded, and what a batch that did not end took is never used again: the
    same outputs and stored values as a job that decodes every batch."""
    policy = Policy(retention=200_000, node_lease_ms=1_500, directive_interval_ms=100)
    msgs = messages(2, partitions=1, clusters=1)
    size = len(msgs) // 6
    batches = [msgs[i:i + size] for i in range(0, len(msgs), size)]
    kept = LocalJob(policy.to_dict(), TOPICS, accounting_topic="acct", keep="all")
    fresh = LocalJob(policy.to_dict(), TOPICS, accounting_topic="acct", keep="none")
    scope = kept.operator.scope
    hits = KEPT.hits
    assert kept.run_batch(batches[0]) == fresh.run_batch(batches[0])
    assert {k[0] for k in KEPT.entries} >= {scope} and KEPT.hits == hits
    assert kept.run_batch(batches[1]) == fresh.run_batch(batches[1])
    assert KEPT.hits > hits, "the second batch took the first one's states"
    values, nodes = kept.handle.states["cluster"], kept.handle.states["nodes"]
    assert values.data == fresh.handle.states["cluster"].data and nodes.data == fresh.handle.states["nodes"].data
    # another worker wrote the cluster's value and a bucket since: those bytes are decoded, not matched
    other = LocalJob(policy.to_dict(), TOPICS, accounting_topic="acct", keep="none")
    for batch in batches[:3]:
        other.run_batch(batch)
    fresh.run_batch(batches[2])
    values.data = dict(other.handle.states["cluster"].data)
    nodes.data = {k: dict(v) for k, v in other.handle.states["nodes"].data.items()}
    assert kept.run_batch(batches[3]) == fresh.run_batch(batches[3])
    # a batch that fails after it changed states it took (a bucket's read fails: nothing stored)
    # leaves none of them kept: the next one decodes what the store holds
    kept.run_batch(batches[4])
    fresh.run_batch(batches[4])
    taken = dict(KEPT.entries)
    with pytest.raises(RuntimeError, match="state read"):
        kept.run_batch(batches[5], fail_reads=3)
    assert len([k for k in KEPT.entries if k[0] == scope]) < len([k for k in taken if k[0] == scope])
    for batch in batches[5:]:
        assert kept.run_batch(batch) == fresh.run_batch(batch)
    assert kept.accounting == fresh.accounting[:2] + fresh.accounting[3:], "every message taken once (batch 2: the other worker's)"
    assert values.data == fresh.handle.states["cluster"].data and nodes.data == fresh.handle.states["nodes"].data


def test_kept_states_are_bounded_by_their_stored_bytes() -> None:
    kept = Kept(limit=10)
    kept.wrote(("s", "c", 0), b"12345", "a")
    kept.wrote(("s", "c", 1), b"123456", "b")
    assert list(kept.entries) == [("s", "c", 1)] and kept.size == 6
    assert kept.take(("s", "c", 1), b"other") is None and kept.size == 0
    assert kept.take(("s", "c", 1), b"123456") is None, "gone once taken"
    kept.wrote(("s", "c", 1), b"123456", "b")
    assert kept.take(("s", "c", 1), b"123456") == "b"


def test_a_node_joining_in_a_later_batch_has_its_stored_holds_alerted_without_being_touched() -> None:
    """The holds a joining node had below safe_ts come from its own stored state (the cluster keeps
    no copy): in a batch of nothing but the topology that makes it a member, every one is alerted,
    lowest first, and the node is read, not touched (no status part, its bucket not written back)."""
    policy = Policy(retention=10)
    job = LocalJob(policy.to_dict(), TOPICS, buckets=8)

    def msg(offset: int, **ev: Any) -> Message:
        return (0, offset, None, json.dumps({"v": 1, "cluster": "c1", "incarnation": 0, **ev}).encode())

    topo = {"type": "topology", "wall_ms": 1, "version": 1, "nodes": {"n1": []}}
    first = [msg(0, **topo), msg(1, type="heartbeat", node="n1", seq=1, wall_ms=1, mvcc_now=1_010),
             msg(2, type="reader_open", node="n2", seq=1, wall_ms=1, reader_id="r-mid", read_ts=1_500),
             msg(3, type="reader_open", node="n2", seq=2, wall_ms=1, reader_id="r-low", read_ts=1_200),
             msg(4, type="heartbeat", node="n2", seq=3, wall_ms=1, mvcc_now=3_000),
             msg(5, type="heartbeat", node="n1", seq=2, wall_ms=2, mvcc_now=2_010)]
    job.run_batch(first)
    calls = job.state_calls()
    written = job.run_batch([msg(6, **{**topo, "version": 2, "nodes": {"n1": [], "n2": []}})])
    alerts = [json.loads(v) for t, _k, v in written if t == TOPICS["alerts"]]
    assert [(a["kind"], a["node"], a["value"], a["threshold"]) for a in alerts] == [
        ("horizon_violation", "n2", 1_200, 2_000), ("horizon_violation", "n2", 1_500, 2_000)]
    statuses = [json.loads(v) for t, _k, v in written if t == TOPICS["status"]]
    assert [s["type"] for s in statuses] == ["cluster_status"], "the joining node is read, not touched"
    assert job.state_calls() - calls == 3, "the cluster's value read and written, n2's bucket read only"


def test_a_bucket_decodes_only_the_nodes_a_batch_looks_up() -> None:
    """The nodes of a touched bucket that the batch did not look up stay in their stored form and
    go back exactly as they were read."""
    import msgspec

    policy = Policy()
    first = stored_nodes("c1", 1, lambda _b: None)
    for i, name in enumerate(("n1", "n2", "n3")):
        hb = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": name, "incarnation": 0, "seq": 1,
              "wall_ms": 10 + i, "mvcc_now": 1_000 + i, "pinned_bytes": 7}
        assert not isinstance(first.node("c1", name).apply(hb, policy), str)
    (stored,) = stored_buckets(first.dump(), first.buckets).values()
    again = stored_nodes("c1", 1, lambda _b: stored)
    state = again.node("c1", "n2")
    state.seq = 9
    entries = again.loaded[0]
    assert [type(entries[n]).__name__ for n in ("n1", "n2", "n3")] == ["list", "NodeState", "list"]
    _version, _buckets, before = msgspec.msgpack.decode(stored)
    _version, _buckets, after = msgspec.msgpack.decode(stored_buckets(again.dump(), again.buckets)[0])
    assert [after[0], after[2]] == [before[0], before[2]]
    assert after[1][2] == 9 and before[1][2] == 1  # STORED_FIELDS: node, incarnation, seq, ...


def test_a_node_read_from_the_store_takes_the_shortcut_at_its_first_event() -> None:
    """A node's last walk of its holds is not stored; read back, it walks them once at its first
    event that might take the shortcut, so a micro-batch's first event of each node is not sent
    down the full path for that alone."""
    policy = Policy()
    cluster = "c1"
    events: list[dict[str, Any]] = [
        {"v": 1, "type": "topology", "cluster": cluster, "wall_ms": 1, "version": 1, "nodes": {"n1": []}},
        {"v": 1, "type": "reader_open", "cluster": cluster, "node": "n1", "incarnation": 0, "seq": 1, "wall_ms": 1,
         "reader_id": "low", "read_ts": 10},
        {"v": 1, "type": "heartbeat", "cluster": cluster, "node": "n1", "incarnation": 0, "seq": 2, "wall_ms": 1,
         "mvcc_now": 1_000_000},
    ]
    nodes = stored_nodes(cluster, 8, lambda _b: None)
    state = ClusterState.starting(cluster, None)
    for offset, event in enumerate(events):
        step(state, nodes, event, policy, 0, offset)
    assert state.safe_ts == 10
    (bucket, value), = stored_buckets(nodes.dump(), nodes.buckets).items()
    again = stored_nodes(cluster, 8, lambda b: value if b == bucket else None)
    node = again.node(cluster, "n1")
    opening = Hold(20, 1, None, 0)
    what, is_opening = HOLD_EVENTS["reader_open"]
    assert (node.quiet("reader_open", what, is_opening, 1, 0, 3, "above", opening, policy, state.safe_ts, True, 1)
            == ("reader", "above", 20))
    assert "above" in node.holds.of("reader")


def test_each_output_is_yielded_the_moment_it_is_made() -> None:
    """``BatchRun.outputs()`` (what the operator sends on at once) yields each output as the batch
    logic makes it, in the order ``run_batch`` collects them: a directive leaves before the
    messages after it are worked through."""
    from safepoint.core.batch import BatchRun, run_batch

    policy = Policy(retention=100_000, node_lease_ms=2_000)
    msgs = messages(5, partitions=1, clusters=1)
    items = route([(*m[:4], broker_time(m)) for m in msgs], "ev", policy)["c0"]

    def fresh() -> BucketNodes:
        return BucketNodes("c0", 8, lambda _b: None)

    returned = run_batch("c0", None, fresh(), items, policy, True)
    run = BatchRun("c0", None, fresh(), items, policy, True)
    yielded = list(run.outputs())
    assert run.result is not None and run.result.outputs == [] and yielded == returned.outputs
    assert {"directives", "status", None} <= {channel for channel, _k, _v in yielded}
    assert run.result.cluster is not None and returned.cluster is not None
    assert run.result.counts == returned.counts
    assert encode_cluster(run.result.cluster) == encode_cluster(returned.cluster)
    assert ({b: [e if isinstance(e, list) else e.to_stored() for e in es] for b, es in run.result.buckets.items()}
            == {b: [e if isinstance(e, list) else e.to_stored() for e in es] for b, es in returned.buckets.items()})

    nodes = BucketNodes("c0", 8, lambda _b: None)
    at_first: list[int] = []

    def applied() -> int:
        """How far the batch has got: the sum of the nodes' last applied ``seq``."""
        return sum(state.seq + 1 for state in nodes.touched.values())

    for output in BatchRun("c0", None, nodes, items, policy, False).outputs():
        if output[0] == "directives" and not at_first:
            at_first.append(applied())
    assert 0 < at_first[0] < applied() / 2, "the batch was worked through before the first directive left"

