"""The benchmark's workload (a generated multi-node cluster with a probe node) and its Kafka plumbing: topics, producing the backlog, consuming."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import msgspec
from bench_common import START_MS

from safepoint.core.ids import CLUSTER_HEADER


def kafka_base(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap}


class _Named(msgspec.Struct):
    """An event's cluster and whether it is a node's (the rest of the event is skipped)."""

    cluster: str = "default"
    node: str | None = None


_NAMED = msgspec.json.Decoder(_Named)


def record_headers(value: bytes) -> list[tuple[str, bytes]] | None:
    """The headers a node client gives ``value``'s record: its cluster (``safepoint-cluster``) for a
    node's event; none for a cluster's event (its publisher is no node client)."""
    named = _NAMED.decode(value)
    return [(CLUSTER_HEADER, named.cluster.encode())] if named.node is not None else None


@dataclass
class Workload:
    """One generated log, encoded once: (wall_ms, key, value bytes) in emission order."""

    name: str
    offered_rate: float
    heartbeat_ms: int
    events: list[tuple[int, str, bytes]]
    types: dict[str, int]
    duration_ms: int
    probe_closes: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def natural_rate(self) -> float:
        return len(self.events) / max(1e-9, self.duration_ms / 1000)


def heartbeat_ms_for(nodes: int, rate: float, share: float = 0.1) -> int:
    """Heartbeat interval so heartbeats are about ``share`` of the offered rate, never under 1 s."""
    return max(1000, int(round(nodes * 1000 / max(1.0, share * rate), -2)))


def build_workload(
    name: str, nodes: int, rate: float, *, seed: int, long_share: float, probe_hz: float,
    duration_s: float | None = None, events: int | None = None, clusters: int = 1, cluster: str = "default",
) -> Workload:
    """The simulator's cluster at ``rate`` events/s (heartbeats included), plus the probe node.
    With ``clusters`` > 1, that many clusters (``c0``, ``c1``, ...) sharing the nodes, the rate,
    the events and the probe's pace, their logs merged by ``wall_ms``: the same load spread over
    clusters the job can run side by side.

    The probe node ``<cluster>-probe`` keeps two readers whose ``read_ts`` lie below every other
    hold of the cluster and rise by one per probe; every 1/probe_hz s of event time it opens the next
    and closes the oldest, so each close frees the blocker and yields exactly one directive whose
    ``cluster_wall_ms`` is that close's ``wall_ms`` (and whose blocker is the next probe reader).
    """
    from safepoint.devtools.simulate import ClusterSim, SimConfig, key_of

    if clusters > 1:
        return merged_workload(name, nodes, rate, seed=seed, long_share=long_share, probe_hz=probe_hz,
                               duration_s=duration_s, events=events, clusters=clusters)
    hb = heartbeat_ms_for(nodes, rate)
    probe_rate = 2 * probe_hz + 1000 / hb
    work = max(1.0, rate - nodes * 1000 / hb - probe_rate)
    # the simulator's rate counts ~2.2 events per opening; the real mix (open, close, some prepares)
    # is ~2.03: scale so the generated log comes out at the asked rate
    cfg = SimConfig(nodes=nodes, rate=work * 2.2 / 2.03, heartbeat_ms=hb, long_reader_share=long_share, cluster=cluster)
    if duration_s is None:
        assert events is not None
        duration_s = events / rate * 1.05 + 1
    duration_ms = int(duration_s * 1000)
    sim = ClusterSim(cfg, seed=seed, start_ms=START_MS)
    raw = sim.advance(START_MS + duration_ms)
    cluster = cfg.cluster
    pname = f"{cluster}-probe"
    pseq = 0
    k = 0
    every = 1000.0 / probe_hz
    ts0 = START_MS * 1000 - 10**9
    next_hb = next_probe = None
    closes = 0
    out: list[tuple[int, str, bytes]] = []
    types: Counter[str] = Counter()

    def emit(ev: dict[str, Any]) -> None:
        types[ev["type"]] += 1
        out.append((ev["wall_ms"], key_of(ev), json.dumps(ev, separators=(",", ":")).encode()))

    def probe_event(kind: str, wall: int, **fields: Any) -> dict[str, Any]:
        nonlocal pseq
        pseq += 1
        return {"v": 1, "type": kind, "cluster": cluster, "node": pname, "incarnation": 0, "seq": pseq, "wall_ms": wall, **fields}

    for ev in raw:
        w = ev["wall_ms"]
        if ev["type"] == "topology":
            ev["nodes"][pname] = []
            emit(ev)
            emit(probe_event("heartbeat", w, mvcc_now=w * 1000, pinned_bytes=0, active_readers=1, active_txs=0))
            emit(probe_event("reader_open", w, reader_id=f"probe-{k}", read_ts=ts0 + k, label="bench-probe"))
            next_hb, next_probe = w + hb, w + every
            continue
        if next_hb is not None and next_probe is not None:
            while w >= next_hb:
                emit(probe_event("heartbeat", w, mvcc_now=w * 1000, pinned_bytes=0, active_readers=1, active_txs=0))
                next_hb += hb
            while w >= next_probe:
                emit(probe_event("reader_open", w, reader_id=f"probe-{k + 1}", read_ts=ts0 + k + 1, label="bench-probe"))
                emit(probe_event("reader_close", w, reader_id=f"probe-{k}"))
                k += 1
                closes += 1
                next_probe += every
        emit(ev)
        if events is not None and len(out) >= events:
            break
    if events is not None:
        del out[events:]
        duration_ms = max(1, out[-1][0] - START_MS)
    return Workload(
        name=name,
        offered_rate=rate,
        heartbeat_ms=hb,
        events=out,
        types=dict(types),
        duration_ms=duration_ms,
        probe_closes=closes,
        meta={
            "nodes": nodes,
            "sim_rate": cfg.rate,
            "long_reader_share": long_share,
            "long_reader_ms": list(cfg.long_reader_ms),
            "short_reader_ms": list(cfg.short_reader_ms),
            "tx_share": cfg.tx_share,
            "prepare_share": cfg.prepare_share,
            "restart_per_node_per_min": cfg.restart_per_node_per_min,
            "probe_hz": probe_hz,
            "seed": seed,
        },
    )


def merged_workload(name: str, nodes: int, rate: float, *, seed: int, long_share: float, probe_hz: float,
                    duration_s: float | None, events: int | None, clusters: int) -> Workload:
    """``clusters`` workloads of ``build_workload`` (a share of the nodes, rate, events and probe
    pace each, seeds apart), merged by ``wall_ms``."""
    import heapq

    parts = [
        build_workload(name, max(1, nodes // clusters), rate / clusters, seed=seed + 7919 * i, long_share=long_share,
                       probe_hz=probe_hz / clusters, duration_s=duration_s,
                       events=None if events is None else events // clusters + (1 if i < events % clusters else 0),
                       cluster=f"c{i}")
        for i in range(clusters)
    ]
    types: Counter[str] = Counter()
    for w in parts:
        types.update(w.types)
    first = parts[0]
    return Workload(
        name=name,
        offered_rate=rate,
        heartbeat_ms=first.heartbeat_ms,
        events=list(heapq.merge(*(w.events for w in parts), key=lambda e: e[0])),
        types=dict(types),
        duration_ms=max(w.duration_ms for w in parts),
        probe_closes=sum(w.probe_closes for w in parts),
        meta={**first.meta, "nodes": sum(w.meta["nodes"] for w in parts), "clusters": clusters,
              "sim_rate": sum(w.meta["sim_rate"] for w in parts), "probe_hz": probe_hz},
    )


def open_holds(values: list[bytes]) -> int:
    """Open readers + undecided transactions at the end of a log (the workload model, no core)."""
    readers: dict[str, set[str]] = defaultdict(set)
    txs: dict[str, dict[str, bool]] = defaultdict(dict)
    inc: dict[str, int] = {}
    for v in values:
        ev = json.loads(v)
        node = ev.get("node")
        if node is None:
            continue
        i = ev["incarnation"]
        if i > inc.get(node, i):
            readers[node].clear()
            txs[node] = {t: p for t, p in txs[node].items() if p}
        inc[node] = max(i, inc.get(node, i))
        kind = ev["type"]
        if kind == "reader_open":
            readers[node].add(ev["reader_id"])
        elif kind == "reader_close":
            readers[node].discard(ev["reader_id"])
        elif kind == "tx_begin":
            txs[node][ev["tx_id"]] = False
        elif kind == "tx_prepare":
            if ev["tx_id"] in txs[node]:
                txs[node][ev["tx_id"]] = True
        elif kind == "tx_end":
            txs[node].pop(ev["tx_id"], None)
    return sum(len(r) for r in readers.values()) + sum(len(t) for t in txs.values())


def make_topics(bootstrap: str, tag: str, partitions: int) -> dict[str, str]:
    from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
    from safepoint.settings import Settings

    s = Settings(
        bootstrap=bootstrap,
        events_topic=f"bench.{tag}.events",
        control_topic=f"bench.{tag}.control",
        directives_topic=f"bench.{tag}.directives",
        alerts_topic=f"bench.{tag}.alerts",
        deadletter_topic=f"bench.{tag}.deadletter",
        status_topic=f"bench.{tag}.status",
    )
    ensure_topics(s.librdkafka(), topic_specs(s.topics(), partitions, log_append_time=False))
    return s.topics()


def producer(bootstrap: str, linger_ms: int) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            **kafka_base(bootstrap),
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
        }
    )


def produce_all(bootstrap: str, topic: str, events: list[tuple[int, str, bytes]]) -> dict[str, Any]:
    prod = producer(bootstrap, linger_ms=20)
    failures = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal failures
        if err is not None:
            failures += 1

    t0 = time.perf_counter()
    for _, key, value in events:
        headers = record_headers(value)
        while True:
            try:
                prod.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                prod.poll(0.05)
        prod.poll(0)
    left = prod.flush(120)
    el = time.perf_counter() - t0
    if failures or left:
        raise RuntimeError(f"producing the backlog failed: {failures} failed, {left} unflushed")
    return {"events": len(events), "seconds": el, "events_per_s": len(events) / el}


def consumer(bootstrap: str, group: str, low_latency: bool = False, extra: dict[str, Any] | None = None) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            **(extra or {}),
            **kafka_base(bootstrap),
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "receive.message.max.bytes": 1_000_000_000,  # the embedded broker ignores fetch limits
            "fetch.wait.max.ms": 5 if low_latency else 50,
        }
    )


def idle(c: Any, seconds: float) -> None:
    """Stop fetching for a while. The embedded broker answers a fetch at the end of a partition
    at once (it ignores fetch.wait.max.ms), so a consumer that has caught up spins a core of its
    own and one of the broker's (measured: 4 caught-up consumers cost 12 s of broker CPU and made
    the Engine 3x slower in the same process). Real Kafka holds such a fetch for fetch.wait.max.ms."""
    parts = c.assignment()
    c.pause(parts)
    time.sleep(seconds)
    c.resume(parts)


def assign_all(c: Any, topic: str) -> list[int]:
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    md = c.list_topics(topic, timeout=30)
    parts = sorted(md.topics[topic].partitions)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    return parts


def raw_consume(bootstrap: str, topic: str, total: int, timeout_s: float = 300) -> dict[str, Any]:
    c = consumer(bootstrap, "bench-raw")
    t0 = time.perf_counter()
    assign_all(c, topic)
    n = nbytes = 0
    deadline = time.monotonic() + timeout_s
    while n < total and time.monotonic() < deadline:
        for m in c.consume(num_messages=10_000, timeout=1.0):
            if m.error() is not None:
                continue
            n += 1
            nbytes += len(m.value())
    el = time.perf_counter() - t0
    c.close()
    return {"events": n, "bytes": nbytes, "seconds": el, "events_per_s": n / el, "mb_per_s": nbytes / el / 1e6}


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[bytes]:
    """Every value of a (small) topic, up to the high watermarks it has now."""
    from confluent_kafka import TopicPartition

    c = consumer(bootstrap, "bench-read")
    parts = assign_all(c, topic)
    high = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)[1] for p in parts}
    pos = {p: 0 for p in parts}
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while any(pos[p] < high[p] for p in parts) and time.monotonic() < deadline:
        for m in c.consume(num_messages=1000, timeout=0.5):
            if m.error() is None:
                out.append(m.value())
                pos[m.partition()] = m.offset() + 1
    c.close()
    return out


def logical_state(engine: Any) -> dict[str, int]:
    """Bytes of the values the job would keep for the engine's state (the nodes' buckets, the
    clusters' values), in the stored forms the job writes (``streaming/stored.py``)."""
    from safepoint.core.batch import bucket_of
    from safepoint.settings import Settings
    from safepoint.streaming.stored import encode_bucket, encode_cluster

    buckets = Settings().node_buckets
    grouped: dict[tuple[str, int], list[Any]] = {}
    for (cluster, node), ns in engine.nodes.items():
        grouped.setdefault((cluster, bucket_of(node, buckets)), []).append(ns)
    node_bytes = sum(len(encode_bucket(nodes, buckets)) for nodes in grouped.values())
    cluster_bytes = sum(len(encode_cluster(c)) for c in engine.clusters.values())
    holds = sum(ns.holds.count() for ns in engine.nodes.values())
    return {"node_bytes": node_bytes, "cluster_bytes": cluster_bytes, "holds": holds, "nodes": len(engine.nodes)}
