"""A synthetic database cluster: nodes with short and long readers, transactions, heartbeats,
two-phase commits and a restart now and then. Deterministic for a seed and a clock.

``ClusterSim.advance(now_ms)`` returns the events due up to ``now_ms``; ``safepoint simulate``
drives it with the wall clock and publishes to Kafka, tests and benchmarks drive it with a
simulated clock. MVCC time is the wall clock in microseconds (a hybrid-clock stand-in).
"""

from __future__ import annotations

import json
import queue
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClusterSim", "SimConfig", "generate_log", "run_simulator", "bad_message", "BAD_KINDS"]


HISTORY_POINTS = 16
"""The most points of a simulated history curve (its lowest holds' timestamps)."""

@dataclass(frozen=True)
class SimConfig:
    nodes: int = 3
    rate: float = 200.0
    """Target events per second over the whole cluster."""
    cluster: str = "default"
    heartbeat_ms: int = 1000
    long_reader_share: float = 0.0005
    long_reader_ms: tuple[int, int] = (8_000, 30_000)
    short_reader_ms: tuple[int, int] = (5, 400)
    tx_share: float = 0.3
    prepare_share: float = 0.1
    restart_per_node_per_min: float = 0.05
    publish_topology: bool = True
    groups_per_node: int = 0
    pinned_bytes_per_s_of_age: int = 50_000_000
    stuck_reader_every_ms: int = 0
    """Every so often one node opens a reader that would stay open stuck_reader_ms (0: never)."""
    stuck_reader_ms: int = 180_000
    bad_rate: float = 0.0
    """Share of extra bad messages published by ``run_simulator`` (see ``bad_message``; 0: none)."""
    namespaces: int = 0
    """Tenants ``t0`` .. ``t<n-1>``: each reader and transaction belongs to one (0: none, as before);
    the stuck reader belongs to ``t0``, so ``t0`` is held back while the others are not."""
    history_curve: bool = False
    """Heartbeats carry the node's history curve (``history_above``): the bytes only a read below each
    open hold's timestamp needs, as the pinned bytes grow (``pinned_bytes_per_s_of_age`` per second of
    history), so the job can say what each hold alone keeps (the demo turns it on)."""


@dataclass
class _Node:
    name: str
    incarnation: int
    seq: int = 0
    readers: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (read_ts, close_at)
    txs: dict[str, tuple[int, int, bool]] = field(default_factory=dict)  # id -> (begin_ts, end_at, prepared)
    next_hb: int = 0


class ClusterSim:
    def __init__(self, config: SimConfig, seed: int = 0, start_ms: int | None = None) -> None:
        self.cfg = config
        self.rng = random.Random(seed)
        self.now = start_ms if start_ms is not None else int(time.time() * 1000)
        self.nodes = [_Node(f"{config.cluster}-n{i + 1}", incarnation=0) for i in range(config.nodes)]
        for i, n in enumerate(self.nodes):
            n.next_hb = self.now + (i * config.heartbeat_ms) // max(1, config.nodes)
        self._ids = 0
        self._carry = 0.0
        self._started = False
        self._topology_version = 0
        self._next_stuck = self.now + config.stuck_reader_every_ms // 3 if config.stuck_reader_every_ms else None
        self.expired: list[tuple[str, str]] = []

    def expire(self, node: str, reader_id: str) -> None:
        """The node obeys an expire directive: the reader is cancelled at its next boundary."""
        for n in self.nodes:
            if n.name == node and reader_id in n.readers:
                ts, _ = n.readers[reader_id]
                n.readers[reader_id] = (ts, self.now)
                self.expired.append((node, reader_id))

    # -- event builders -------------------------------------------------------------
    def _node_event(self, n: _Node, kind: str, **fields: Any) -> dict[str, Any]:
        n.seq += 1
        return {
            "v": 1,
            "type": kind,
            "cluster": self.cfg.cluster,
            "node": n.name,
            "incarnation": n.incarnation,
            "seq": n.seq,
            "wall_ms": self.now,
            **fields,
        }

    def _mvcc(self) -> int:
        return self.now * 1000

    def _tenant(self) -> dict[str, str]:
        """A random tenant's namespace (no draw at all without namespaces: the same log as before)."""
        return {"namespace": f"t{self.rng.randrange(self.cfg.namespaces)}"} if self.cfg.namespaces else {}

    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids}"

    def topology(self) -> dict[str, Any]:
        self._topology_version += 1
        groups = {n.name: [f"g{n.name}-{k}" for k in range(self.cfg.groups_per_node)] for n in self.nodes}
        return {
            "v": 1,
            "type": "topology",
            "cluster": self.cfg.cluster,
            "wall_ms": self.now,
            "version": self._topology_version,
            "nodes": groups,
        }

    def heartbeat(self, n: _Node) -> dict[str, Any]:
        oldest = min([r[0] for r in n.readers.values()] + [t[0] for t in n.txs.values()] + [self._mvcc()])
        pinned = max(0, (self._mvcc() - oldest) // 1_000_000) * self.cfg.pinned_bytes_per_s_of_age
        hb: dict[str, Any] = {
            "mvcc_now": self._mvcc(),
            "pinned_bytes": pinned,
            "active_readers": len(n.readers),
            "active_txs": len(n.txs),
        }
        if self.cfg.history_curve:
            now, rate = self._mvcc(), self.cfg.pinned_bytes_per_s_of_age
            marks = sorted({ts for ts, *_ in [*n.readers.values(), *n.txs.values()] if ts < now})[:HISTORY_POINTS]
            hb["history_above"] = [{"ts": ts, "bytes": (now - ts) * rate // 1_000_000} for ts in marks]
        if self.cfg.groups_per_node:
            hb["groups"] = [
                {"group": f"g{n.name}-{k}", "leader": True, "published_min_tx_time": oldest}
                for k in range(self.cfg.groups_per_node)
            ]
        return self._node_event(n, "heartbeat", **hb)

    # -- the clock ----------------------------------------------------------------------
    def advance(self, now_ms: int) -> list[dict[str, Any]]:
        """Every event due between the last call and ``now_ms``, in emission order."""
        events: list[dict[str, Any]] = []
        step = max(1, min(50, now_ms - self.now))
        while self.now < now_ms:
            self.now = min(now_ms, self.now + step)
            events.extend(self._tick(step))
        return events

    def _tick(self, dt_ms: int) -> list[dict[str, Any]]:
        cfg, rng, out = self.cfg, self.rng, []
        if not self._started:
            self._started = True
            if cfg.publish_topology:
                out.append(self.topology())
            for n in self.nodes:
                out.append(self.heartbeat(n))
        for n in self.nodes:
            for rid, (_, close_at) in list(n.readers.items()):
                if close_at <= self.now:
                    del n.readers[rid]
                    out.append(self._node_event(n, "reader_close", reader_id=rid))
            for tid, (_, end_at, _) in list(n.txs.items()):
                if end_at <= self.now:
                    del n.txs[tid]
                    out.append(self._node_event(n, "tx_end", tx_id=tid, outcome="commit" if rng.random() < 0.9 else "abort"))
            if n.next_hb <= self.now:
                n.next_hb += cfg.heartbeat_ms
                out.append(self.heartbeat(n))
            if rng.random() < cfg.restart_per_node_per_min * dt_ms / 60_000:
                n.incarnation += 1
                n.seq = 0
                n.readers.clear()
                n.txs = {t: v for t, v in n.txs.items() if v[2]}
                out.append(self.heartbeat(n))
        if self._next_stuck is not None and self.now >= self._next_stuck:
            self._next_stuck = self.now + cfg.stuck_reader_every_ms
            n = rng.choice(self.nodes)
            rid = self._id("stuck-")
            n.readers[rid] = (self._mvcc(), self.now + cfg.stuck_reader_ms)
            out.append(self._node_event(n, "reader_open", reader_id=rid, read_ts=self._mvcc(), label="stuck-report",
                                        **({"namespace": "t0"} if cfg.namespaces else {})))
        # New work: each opening is followed by a close later, so ~2 events per opening.
        self._carry += cfg.rate * dt_ms / 1000 / 2.2
        while self._carry >= 1:
            self._carry -= 1
            n = rng.choice(self.nodes)
            ts = self._mvcc()
            if rng.random() < cfg.tx_share:
                tid = self._id("tx")
                life = rng.randint(20, 500)
                prepared = rng.random() < cfg.prepare_share
                n.txs[tid] = (ts, self.now + life, prepared)
                out.append(self._node_event(n, "tx_begin", tx_id=tid, begin_ts=ts, label="oltp", **self._tenant()))
                if prepared:
                    others = [m.name for m in rng.sample(self.nodes, min(2, len(self.nodes)))]
                    out.append(
                        self._node_event(
                            n, "tx_prepare", tx_id=tid, coordinator=others[0], participants=sorted({n.name, *others})
                        )
                    )
            else:
                rid = self._id("r")
                long = rng.random() < cfg.long_reader_share
                lo, hi = cfg.long_reader_ms if long else cfg.short_reader_ms
                n.readers[rid] = (ts, self.now + rng.randint(lo, hi))
                out.append(self._node_event(n, "reader_open", reader_id=rid, read_ts=ts, label="report-job" if long else "query",
                                            **self._tenant()))
        return out


def generate_log(config: SimConfig, duration_ms: int, seed: int = 0, start_ms: int = 1_700_000_000_000) -> list[dict[str, Any]]:
    """A whole log on a simulated clock (no sleeping), for tests and benchmarks."""
    sim = ClusterSim(config, seed=seed, start_ms=start_ms)
    return sim.advance(start_ms + duration_ms)


def key_of(event: dict[str, Any]) -> str:
    return str(event.get("node") or event.get("cluster", "default"))


BAD_KINDS = (
    "null",
    "not_utf8",
    "not_json",
    "not_object",
    "missing_v",
    "unsupported_v",
    "unknown_type",
    "missing_field",
    "mistyped_field",
    "negative_seq",
    "fraction",
    "duplicate",
)
"""What ``bad_message`` makes: every kind but ``duplicate`` must be dead-lettered; a duplicate is ignored."""


def bad_message(rng: random.Random, event: dict[str, Any], kind: str | None = None) -> tuple[str, bytes | None, str]:
    """(key, value, kind): a poison message derived from ``event``, or ``event`` itself sent again."""
    kind = kind or rng.choice(BAD_KINDS)
    key = key_of(event)
    ev = dict(event)
    if kind == "null":
        return key, None, kind
    if kind == "duplicate":
        return key, json.dumps(ev, separators=(",", ":")).encode(), kind
    if kind == "not_utf8":
        return key, b"\xff\xfe" + json.dumps(ev).encode(), kind
    if kind == "not_json":
        text = json.dumps(ev)
        return key, text[: max(1, len(text) // 2)].encode(), kind
    if kind == "not_object":
        return key, json.dumps([ev]).encode(), kind
    if kind == "missing_v":
        del ev["v"]
    elif kind == "unsupported_v":
        ev["v"] = 2
    elif kind == "unknown_type":
        ev["type"] = ev["type"] + "_x"
    elif kind == "missing_field":
        del ev["wall_ms"]
    elif kind == "mistyped_field":
        ev["wall_ms"] = str(ev["wall_ms"])
    elif kind == "negative_seq":
        if "seq" in ev:
            ev["seq"] = -1 - int(ev["seq"])
        else:
            ev["version"] = -1
    elif kind == "fraction":
        ev["wall_ms"] = ev["wall_ms"] + 0.5
    return key, json.dumps(ev, separators=(",", ":")).encode(), kind


def run_simulator(
    bootstrap: str,
    topic: str,
    config: SimConfig,
    duration_s: float | None,
    seed: int,
    kafka_conf: dict[str, Any] | None = None,
    clusters: int = 1,
    quiet_output: bool = False,
    expiries: queue.Queue[tuple[str, str, str]] | None = None,
    flush_timeout_s: float = 30.0,
    halt: threading.Event | None = None,
) -> int:
    """Publish a live simulated cluster (or several) until the duration ends, SIGINT/SIGTERM or
    ``halt`` is set (a caller that runs it in a thread); at the end, wait at most
    ``flush_timeout_s`` for the last deliveries."""
    from safepoint.connectors.kafka.clients import CONFLUENT
    from safepoint.connectors.kafka.producer import BOOTSTRAP_SERVERS, Deliveries, make_producer, producer_conf
    from safepoint.connectors.kafka.topics import check_reachable, quiet

    conf = quiet(producer_conf({BOOTSTRAP_SERVERS: bootstrap, **(kafka_conf or {})}, linger_ms=20))
    check_reachable(conf)
    producer = make_producer(CONFLUENT, conf)
    deliveries = Deliveries()
    on_delivery = deliveries.on_delivery

    sims = [
        ClusterSim(
            SimConfig(
                **{
                    **config.__dict__,
                    "cluster": config.cluster if clusters == 1 else f"{config.cluster}{c + 1}",
                    "rate": config.rate / clusters,
                }
            ),
            seed=seed + c,
        )
        for c in range(clusters)
    ]
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    try:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    except ValueError:
        pass  # not the main thread: the caller stops us through duration or KeyboardInterrupt
    bad_rng = random.Random(seed + 7919)  # apart from the simulation's own, so bad_rate changes no event
    start = time.monotonic()
    sent = 0
    last_report = start
    try:
        while not stop and not (halt is not None and halt.is_set()) and (
                duration_s is None or time.monotonic() - start < duration_s):
            now = int(time.time() * 1000)
            while expiries is not None and not expiries.empty():
                cluster, node, rid = expiries.get_nowait()
                for sim in sims:
                    if sim.cfg.cluster == cluster:
                        sim.expire(node, rid)
            for sim in sims:
                for ev in sim.advance(now):
                    producer.produce(topic, key=key_of(ev), value=json.dumps(ev, separators=(",", ":")), on_delivery=on_delivery)
                    producer.poll(0)
                    sent += 1
                    if config.bad_rate and bad_rng.random() < config.bad_rate:
                        key, value, _ = bad_message(bad_rng, ev)
                        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                        sent += 1
            if not quiet_output and time.monotonic() - last_report >= 5:
                last_report = time.monotonic()
                print(f"simulate: {sent} events sent ({sent / (last_report - start):.0f}/s), {deliveries.failures} failed",
                      flush=True)
            time.sleep(0.05)
    finally:
        undelivered = producer.flush(flush_timeout_s)  # still queued: never delivered, and no report said so
    failed = deliveries.failures + undelivered
    if failed:
        print(f"simulate: {failed} of {sent} events were not delivered to {topic} at {bootstrap} "
              f"({deliveries.failures} failed, {undelivered} still queued after {flush_timeout_s:.0f} s)", file=sys.stderr, flush=True)
    elif not quiet_output:
        print(f"simulate: done, {sent} events sent, all delivered", flush=True)
    return 0 if failed == 0 else 1
