"""safepoint benchmark: one command, one generated workload, every figure of the performance targets (README, Benchmark).

    .venv/bin/safepoint bench                 # or: .venv/bin/python benchmarks/bench.py

On one embedded broker (own temp dir, free port) and one generated workload (1,000 nodes, mostly
short readers, some long ones, transactions, heartbeats, node restarts; plus one "probe" node whose
reader closes free the cluster's blocker at a fixed rate, so directives come at a known pace):

1. raw consume: a confluent-kafka consumer reading the whole backlog topic (the physical limit);
2. plain consumer: one Python process, consume + ``Engine.process`` per message + produce outputs;
3. the Spark job (``build_query``), each run in a fresh subprocess (fresh JVM):
   a. throughput over the preloaded backlog for each master (local[1], local[2]): sustained events/s
      after batch 0 (numInputRows / triggerExecution), CPU per process class, RSS, state size;
   b. latency at fixed offered rates (default 1,000 and 10,000 events/s): the workload replayed in
      real time (paced by its own ``wall_ms``), event-to-directive latency p50/p95/p99 over time;
4. profile: cProfile of the core alone and of the job's batch logic run locally (no Spark), and
   py-spy over the job's Python workers during one more local[2] run.

Writes ``<out>/bench-<timestamp>.json``, ``.md`` (the table, ratios, targets met / not met, profile
findings) and ``-latency.png`` (also copied to ``<out>/latency.png``; needs matplotlib, optional).
Measurement only: nothing here changes the job's or the core's code paths.
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import json
import os
import pstats
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safepoint.soak import dir_size

START_MS = 1_700_000_000_000
PROTO = "@@BENCH "
HERE = Path(__file__).resolve()
TARGETS = {
    "throughput_vs_plain": 1.0,
    "throughput_vs_plain_aim": 2.0,
    "p99_latency_s": 2.0,
    "p99_at_rate": 10_000,
    "state_bytes_per_hold": 200,
    "scaling_2_vs_1": 1.5,
}

_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float | None:
    """Linear-interpolated percentile (p in 0..100); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def proc_tree(pid: int) -> dict[str, list[Any]]:
    """The processes under ``pid`` by role: the JVM, the Python workers under it, the driver itself."""
    import psutil

    out: dict[str, list[Any]] = {"driver": [], "jvm": [], "workers": []}
    try:
        me = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return out
    out["driver"].append(me)
    for child in me.children(recursive=True):
        try:
            name = child.name().lower()
            cmd = " ".join(child.cmdline()).lower()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if "java" in name:
            out["jvm"].append(child)
        elif "python" in name or "pyspark" in cmd:
            out["workers"].append(child)
    return out


def rss_sample(pid: int, pss: bool = False) -> dict[str, int]:
    """RSS per role (forked workers share pages: their RSS sum overcounts; ``pss`` adds the fair share)."""
    import psutil

    res = {"driver": 0, "jvm": 0, "workers": 0, "workers_n": 0}
    if pss:
        res.update({"jvm_pss": 0, "workers_pss": 0})
    for role, procs in proc_tree(pid).items():
        for p in procs:
            try:
                res[role] += p.memory_info().rss
                if pss and role in ("jvm", "workers"):
                    res[f"{role}_pss"] += p.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, AttributeError):
                continue
            if role == "workers":
                res["workers_n"] += 1
    return res


def cpu_snapshot(pid: int, extra: dict[str, int] | None = None) -> dict[str, Any]:
    """CPU seconds (user+system) per process of the job's tree, keyed by pid, with its role."""
    import psutil

    snap: dict[str, Any] = {}
    for role, procs in proc_tree(pid).items():
        for p in procs:
            try:
                t = p.cpu_times()
                snap[str(p.pid)] = [role, t.user + t.system]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
    for role, xpid in (extra or {}).items():
        try:
            t = psutil.Process(xpid).cpu_times()
            snap[str(xpid)] = [role, t.user + t.system]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return snap


def cpu_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """CPU seconds spent per role between two snapshots (processes born in between count in full)."""
    out: dict[str, float] = defaultdict(float)
    for pid, (role, secs) in b.items():
        before = a.get(pid, [role, 0.0])[1]
        out[role] += max(0.0, secs - before)
    return dict(out)


def mb(n: float | None) -> str:
    if n is None:
        return "-"
    if abs(n) < 10e6:
        return f"{n / 1e3:,.0f} kB"
    return f"{n / 1e6:,.0f} MB"


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def kafka_base(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap}


# ------------------------------------------------------------------------------------------------
# workload
# ------------------------------------------------------------------------------------------------


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
    duration_s: float | None = None, events: int | None = None,
) -> Workload:
    """The simulator's cluster at ``rate`` events/s (heartbeats included), plus the probe node.

    The probe node ``<cluster>-probe`` keeps two readers whose ``read_ts`` lie below every other
    hold of the cluster and rise by one per probe; every 1/probe_hz s of event time it opens the next
    and closes the oldest, so each close frees the blocker and yields exactly one directive whose
    ``cluster_wall_ms`` is that close's ``wall_ms`` (and whose blocker is the next probe reader).
    """
    from safepoint.simulate import ClusterSim, SimConfig, key_of

    hb = heartbeat_ms_for(nodes, rate)
    probe_rate = 2 * probe_hz + 1000 / hb
    work = max(1.0, rate - nodes * 1000 / hb - probe_rate)
    # the simulator's rate counts ~2.2 events per opening; the real mix (open, close, some prepares)
    # is ~2.03: scale so the generated log comes out at the asked rate
    cfg = SimConfig(nodes=nodes, rate=work * 2.2 / 2.03, heartbeat_ms=hb, long_reader_share=long_share)
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


# ------------------------------------------------------------------------------------------------
# broker side: topics, producing, raw consume
# ------------------------------------------------------------------------------------------------


def make_topics(bootstrap: str, tag: str, partitions: int) -> dict[str, str]:
    from safepoint.connectors.topics import ensure_topics, topic_specs
    from safepoint.settings import Settings

    s = Settings(
        bootstrap=bootstrap,
        events_topic=f"bench.{tag}.events",
        directives_topic=f"bench.{tag}.directives",
        alerts_topic=f"bench.{tag}.alerts",
        deadletter_topic=f"bench.{tag}.deadletter",
    )
    ensure_topics(s.librdkafka(), topic_specs(s.topics(), partitions))
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
        while True:
            try:
                prod.produce(topic, key=key, value=value, on_delivery=on_delivery)
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


# ------------------------------------------------------------------------------------------------
# (2) the plain consumer (a child process: its RSS is its own)
# ------------------------------------------------------------------------------------------------


def logical_state(engine: Any) -> dict[str, int]:
    """Bytes of the values the job would keep for the engine's state (node groups + cluster groups)."""
    node_bytes = sum(len(json.dumps({"nodes": [ns.to_json()], "gates": {}})) for ns in engine.nodes.values())
    gate_bytes = sum(len(json.dumps({"nodes": [], "gates": {c: g}})) for c, g in engine.gates.items())
    cluster_bytes = sum(len(json.dumps(c.to_json())) for c in engine.clusters.values())
    holds = sum(len(ns.readers) + len(ns.txs) for ns in engine.nodes.values())
    return {"node_bytes": node_bytes + gate_bytes, "cluster_bytes": cluster_bytes, "holds": holds, "nodes": len(engine.nodes)}


def worker_plain(spec: dict[str, Any]) -> int:
    import resource

    from safepoint.core import Engine, Position
    from safepoint.core.codec import encode

    bootstrap, topic, total, topics = spec["bootstrap"], spec["topic"], spec["total"], spec["topics"]
    from confluent_kafka import TopicPartition

    engine = Engine()
    # One consumer per partition, read in rounds of ``chunk`` messages each, and each round's
    # partitions merged by the messages' timestamps: the same interleaving rule as the job's
    # micro-batches (a single consumer hands over whole fetches partition by partition, and on
    # this broker a fetch is a whole partition, so the cluster's time would jump back and forth
    # and every node would look stale in turn).
    md = consumer(bootstrap, "bench-plain-md")
    parts = sorted(md.list_topics(topic, timeout=30).topics[topic].partitions)
    ends = {p: md.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
    md.close()
    cs = []
    for p in parts:
        # fetch again only when fewer than 1,000 messages are queued (librdkafka's default, 100,000,
        # would refetch at once: on this broker a fetch returns the whole partition, and a fetch at
        # its end returns at once, so the client would spin; see ``idle``)
        c = consumer(bootstrap, f"bench-plain-{p}", extra={"queued.min.messages": 1000})
        c.assign([TopicPartition(topic, p, 0)])
        cs.append(c)
    chunk = max(1, 10_000 // len(cs))
    # A partition read to the end of the backlog is paused, as the job's source unassigns at its
    # planned end: see ``idle`` for why a caught-up consumer must not keep fetching here.
    live = [(c, p) for c, p in zip(cs, parts, strict=True) if ends[p] > 0]
    prod = producer(bootstrap, linger_ms=5)
    outs: Counter[str] = Counter()
    out_bytes = 0
    t0 = time.perf_counter()
    n = 0
    deadline = time.monotonic() + spec.get("timeout_s", 600)
    while n < total and time.monotonic() < deadline:
        runs = []
        for c, p in list(live):
            run = [m for m in c.consume(num_messages=chunk, timeout=0.05) if m.error() is None]
            if run and run[-1].offset() >= ends[p] - 1:
                c.pause(c.assignment())
                live.remove((c, p))
            runs.append(run)
        if not live and not any(runs):
            break
        for m in heapq.merge(*runs, key=lambda m: m.timestamp()[1]):
            n += 1
            for o in engine.process(m.value(), Position(topic, m.partition(), m.offset(), m.key())):
                value = encode(o.value)
                out_bytes += len(value)
                outs[o.channel] += 1
                while True:
                    try:
                        prod.produce(topics[o.channel], key=o.key, value=value)
                        break
                    except BufferError:
                        prod.poll(0.05)
        prod.poll(0)
    prod.flush(60)
    el = time.perf_counter() - t0
    for c in cs:
        c.close()
    rss_end = rss_sample(os.getpid())["driver"]
    result = {
        "events": n,
        "seconds": el,
        "events_per_s": n / el,
        "outputs": dict(outs),
        "output_bytes": out_bytes,
        "rss_end": rss_end,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "labels": dict(engine.labels),
        "state": logical_state(engine),
        "safe_ts": {k: v.safe_ts for k, v in engine.clusters.items()},
    }
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


# ------------------------------------------------------------------------------------------------
# (3) the Spark job in a child process
# ------------------------------------------------------------------------------------------------


def _job_settings(spec: dict[str, Any]) -> Any:
    from safepoint.settings import Settings

    t = spec["topics"]
    return Settings(
        bootstrap=spec["bootstrap"],
        checkpoint=spec["checkpoint"],
        events_topic=t["events"],
        directives_topic=t["directives"],
        alerts_topic=t["alerts"],
        deadletter_topic=t["deadletter"],
        max_offsets_per_trigger=spec["max_offsets"],
        trigger_ms=spec["trigger_ms"],
        spark_master=spec["master"],
        shuffle_partitions=spec["shuffle_partitions"],
        starting_offsets="earliest",
    )


def _progress_row(p: dict[str, Any]) -> dict[str, Any]:
    ops = []
    for op in p.get("stateOperators") or []:
        ops.append(
            {
                "name": op.get("operatorName"),
                "numRowsTotal": op.get("numRowsTotal"),
                "numRowsUpdated": op.get("numRowsUpdated"),
                "memoryUsedBytes": op.get("memoryUsedBytes"),
                "allUpdatesTimeMs": op.get("allUpdatesTimeMs"),
                "commitTimeMs": op.get("commitTimeMs"),
                "custom": {k: v for k, v in (op.get("customMetrics") or {}).items() if k.startswith("rocksdb") or "Size" in k},
            }
        )
    return {
        "batchId": p.get("batchId"),
        "numInputRows": p.get("numInputRows"),
        "sparkInputRows": p.get("sparkInputRows"),
        "durationMs": p.get("durationMs"),
        "stateOperators": ops,
        "timestamp": p.get("timestamp"),
    }


def _to_dict(p: Any) -> dict[str, Any]:
    """A progress as a dict whose ``numInputRows`` counts messages (the accounting counter
    ``consumed``: with the Python source Spark's own count is of packed rows, kept as ``sparkInputRows``)."""
    from safepoint.streaming.job import messages_in

    d = p if isinstance(p, dict) else json.loads(p.json) if hasattr(p, "json") else dict(p)
    if "sparkInputRows" not in d:
        d = {**d, "sparkInputRows": d.get("numInputRows"), "numInputRows": messages_in(d)}
    return d


def new_progress(query: Any, last_b: int) -> list[dict[str, Any]]:
    """Progress of the batches after ``last_b``, in order (lastProgress, or recentProgress after a jump)."""
    lp = query.lastProgress
    if lp is None:
        return []
    d0 = _to_dict(lp)
    if d0.get("batchId") is None or d0["batchId"] <= last_b:
        return []
    if d0["batchId"] == last_b + 1:
        return [d0]
    return sorted((x for x in map(_to_dict, query.recentProgress) if x.get("batchId", -1) > last_b), key=lambda x: x["batchId"])


class _Sampler(threading.Thread):
    """RSS of the job's process tree every ``every`` s: peak and last per role."""

    def __init__(self, pid: int, every: float = 1.0) -> None:
        super().__init__(daemon=True, name="bench-sampler")
        self.pid, self.every = pid, every
        self.peak: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.series: list[tuple[float, int]] = []
        self._stop_evt = threading.Event()

    def sample(self) -> None:
        s = rss_sample(self.pid, pss=True)
        s["total"] = s["jvm"] + s["workers"] + s["driver"]
        self.last = s
        for k, v in s.items():
            self.peak[k] = max(self.peak.get(k, 0), v)
        self.series.append((round(time.monotonic() - _T0, 1), s["total"]))

    def run(self) -> None:
        while not self._stop_evt.wait(self.every):
            try:
                self.sample()
            except Exception:  # noqa: BLE001, S112 - a vanished process between listing and reading
                continue

    def stop(self) -> None:
        self._stop_evt.set()


def _start_pyspy(pid: int, out: str, rate: int) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(exe):
        return None
    cmd = [exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--rate", str(rate), "--format", "raw", "--output", out]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(out + ".log", "wb"))  # noqa: SIM115


def _jdk_tool(name: str) -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", name)):
        return os.path.join(home, "bin", name)
    return shutil.which(name)


def _jfr(pid: int, action: str, out: str) -> bool:
    """Start or stop a Java Flight Recorder recording (the JDK's own sampling profiler) in the job's JVM."""
    jcmd = _jdk_tool("jcmd")
    tree = proc_tree(pid)["jvm"]
    if not jcmd or not tree:
        return False
    args = ["name=bench", "settings=profile", f"filename={out}"] if action == "start" else ["name=bench"]
    r = subprocess.run([jcmd, str(tree[0].pid), f"JFR.{action}", *args], capture_output=True, text=True, timeout=60, check=False)
    return r.returncode == 0


def worker_spark_tp(spec: dict[str, Any]) -> int:
    """Throughput: the job over the preloaded backlog until every offset is processed."""
    from safepoint.streaming.job import build_query
    from safepoint.streaming.session import build_session

    settings = _job_settings(spec)
    total = spec["total"]
    sampler = _Sampler(os.getpid())
    t0 = time.monotonic()
    spark = build_session(
        settings.spark_master, settings.shuffle_partitions, app="safepoint-bench",
        extra={"spark.sql.streaming.numRecentProgressUpdates": "10000"},
    )
    session_s = time.monotonic() - t0
    sampler.start()
    query = build_query(spark, settings)
    seen: dict[int, dict[str, Any]] = {}
    processed = 0
    cpu0: dict[str, Any] | None = None
    t_batch0 = None
    pyspy = None
    jfr_on = False
    deadline = time.monotonic() + spec.get("timeout_s", 900)
    try:
        last_b = -1
        while processed < total:
            if not query.isActive:
                raise RuntimeError(f"the query stopped: {query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {processed} of {total} events processed in time")
            time.sleep(0.1)
            new = new_progress(query, last_b)
            for d in new:
                b = d["batchId"]
                seen[b] = d
                last_b = max(last_b, b)
                processed += int(d.get("numInputRows") or 0)
                print(f"{PROTO}" + json.dumps({"ev": "progress", "batch": b, "rows": d.get("numInputRows"),
                                                "ms": (d.get("durationMs") or {}).get("triggerExecution"),
                                                "processed": processed}), flush=True)
                if t_batch0 is None:
                    t_batch0 = time.monotonic()
                    cpu0 = cpu_snapshot(os.getpid(), spec.get("extra_pids"))
                    sampler.sample()
                    if spec.get("profile_out"):
                        pyspy = _start_pyspy(os.getpid(), spec["profile_out"], spec.get("profile_rate", 100))
                        jfr_on = _jfr(os.getpid(), "start", spec["profile_out"] + ".jfr")
        t_end = time.monotonic()
        cpu1 = cpu_snapshot(os.getpid(), spec.get("extra_pids"))
        sampler.sample()
        if jfr_on:
            _jfr(os.getpid(), "stop", spec["profile_out"] + ".jfr")
        if pyspy is not None:
            pyspy.send_signal(signal.SIGINT)
            try:
                pyspy.wait(30)
            except subprocess.TimeoutExpired:
                pyspy.kill()
        state_dir = os.path.join(settings.checkpoint, "state")
        result = {
            "master": settings.spark_master,
            "session_s": session_s,
            "total_s": t_end - t0,
            "batches": [_progress_row(seen[b]) for b in sorted(seen)],
            "after_batch0_wall_s": (t_end - t_batch0) if t_batch0 else None,
            "cpu_after_batch0": cpu_delta(cpu0 or {}, cpu1),
            "rss_peak": sampler.peak,
            "rss_end": sampler.last,
            "state_dir_bytes": dir_size(state_dir),
            "checkpoint_bytes": dir_size(settings.checkpoint),
            "profiled": pyspy is not None,
            "jfr": jfr_on,
        }
    finally:
        sampler.stop()
        if query.isActive:
            query.stop()
        spark.stop()
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


def worker_spark_lat(spec: dict[str, Any]) -> int:
    """Latency: start the job, report progress on stdout until told ``stop`` on stdin."""
    from safepoint.streaming.job import build_query
    from safepoint.streaming.session import build_session

    settings = _job_settings(spec)
    sampler = _Sampler(os.getpid())
    t0 = time.monotonic()
    spark = build_session(settings.spark_master, settings.shuffle_partitions, app="safepoint-bench-latency",
                          extra={"spark.sql.streaming.numRecentProgressUpdates": "10000"})
    session_s = time.monotonic() - t0
    sampler.start()
    query = build_query(spark, settings)
    print(PROTO + json.dumps({"ev": "started", "session_s": session_s}), flush=True)
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    seen: dict[int, dict[str, Any]] = {}
    processed = 0
    last_b = -1
    try:
        while not stop.is_set():
            if not query.isActive:
                print(PROTO + json.dumps({"ev": "failed", "error": str(query.exception())}), flush=True)
                return 1
            stop.wait(0.05)
            for d in new_progress(query, last_b):
                b = d["batchId"]
                last_b = max(last_b, b)
                seen[b] = d
                processed += int(d.get("numInputRows") or 0)
                print(PROTO + json.dumps({"ev": "progress", "batch": b, "rows": d.get("numInputRows"), "processed": processed,
                                          "ms": (d.get("durationMs") or {}).get("triggerExecution"), "t": time.monotonic()}),
                      flush=True)
        # lastProgress may have skipped batches; recentProgress has them all
        for p in query.recentProgress:
            d = _to_dict(p)
            if d.get("batchId") is not None:
                seen[d["batchId"]] = d
        sampler.sample()
        state_dir = os.path.join(settings.checkpoint, "state")
        result = {
            "master": settings.spark_master,
            "session_s": session_s,
            "batches": [_progress_row(seen[b]) for b in sorted(seen)],
            "rss_peak": sampler.peak,
            "rss_end": sampler.last,
            "rss_series": sampler.series,
            "state_dir_bytes": dir_size(state_dir),
            "checkpoint_bytes": dir_size(settings.checkpoint),
        }
        print(PROTO + json.dumps({"ev": "result", "result": result}), flush=True)
    finally:
        sampler.stop()
        if query.isActive:
            query.stop()
        spark.stop()
    return 0


class Child:
    """A bench worker subprocess (this file, a hidden mode), its protocol lines in a queue."""

    def __init__(self, mode: str, spec: dict[str, Any], log_path: Path, stdin: bool = False) -> None:
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        env = dict(os.environ)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), mode, json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=self.log,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=env,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            if line.startswith(PROTO):
                self.lines.put(json.loads(line[len(PROTO):]))
        self.lines.put({"ev": "eof"})

    def next(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.close()
        return rc


def summarize_tp(res: dict[str, Any], holds: int) -> dict[str, Any]:
    batches = res["batches"]
    steady = batches[1:]
    rows = sum(b["numInputRows"] or 0 for b in steady)
    ms = sum((b["durationMs"] or {}).get("triggerExecution", 0) for b in steady)
    phases: Counter[str] = Counter()
    for b in steady:
        for k, v in (b["durationMs"] or {}).items():
            phases[k] += v
    last_ops = batches[-1]["stateOperators"] if batches else []
    rss_end = res["rss_end"].get("jvm", 0) + res["rss_end"].get("workers", 0)
    cpu = res.get("cpu_after_batch0") or {}
    return {
        "master": res["master"],
        "path": res.get("path", "fast"),
        "batches": len(batches),
        "batch0_rows": batches[0]["numInputRows"] if batches else None,
        "batch0_ms": (batches[0]["durationMs"] or {}).get("triggerExecution") if batches else None,
        "sustained_events_per_s": rows / (ms / 1000) if ms else None,
        "wall_events_per_s_after_batch0": rows / res["after_batch0_wall_s"] if res.get("after_batch0_wall_s") else None,
        "steady_rows": rows,
        "steady_ms": ms,
        "phase_ms_after_batch0": dict(phases),
        "session_s": res["session_s"],
        "total_s": res["total_s"],
        "cpu_s_after_batch0": cpu,
        "cpu_us_per_event": {k: v / rows * 1e6 for k, v in cpu.items()} if rows else {},
        "rss_peak": res["rss_peak"],
        "rss_end": res["rss_end"],
        "jvm_plus_workers_rss_end": rss_end,
        "rss_per_hold": rss_end / holds if holds else None,
        "state_dir_bytes": res["state_dir_bytes"],
        "state_bytes_per_hold": res["state_dir_bytes"] / holds if holds else None,
        "checkpoint_bytes": res["checkpoint_bytes"],
        "state_operators_last": last_ops,
        "holds": holds,
        "profiled": res.get("profiled", False),
    }


class Feeder(threading.Thread):
    """Feeds the backlog to a fresh topic one chunk ahead of the job.

    Batch 0 (JVM start, worker start, codegen: left out of the figures) gets a small chunk, and no
    batch depends on the source honouring ``maxOffsetsPerTrigger`` (the Python source ignored it
    until it read Spark's lower-cased option keys). Chunk 0 is produced first, and chunk k+1 as soon as
    the job has planned batch k (its ``offsets/<k>`` file exists in the checkpoint): each batch
    then reads one chunk of ``--max-offsets`` events, as a working cap would give it, while the
    next chunk is produced during that batch.
    """

    def __init__(self, bootstrap: str, topic: str, events: list[tuple[int, str, bytes]], chunk: int, checkpoint: Path,
                 first: int) -> None:
        super().__init__(daemon=True, name="bench-feeder")
        self.bootstrap, self.topic, self.events, self.chunk, self.checkpoint = bootstrap, topic, events, chunk, checkpoint
        self.first = min(first, chunk)
        self.late = 0  # chunks not fully produced when the previous batch ended (the job waited on the feeder)
        self.error: str | None = None
        self._stop_evt = threading.Event()

    def run(self) -> None:
        try:
            prod = producer(self.bootstrap, linger_ms=20)
            # batch 0 (JVM and workers warming up, left out of the figures) gets a small chunk of its own
            chunks = [self.events[:self.first]]
            chunks += [self.events[i:i + self.chunk] for i in range(self.first, len(self.events), self.chunk)]
            for k, part in enumerate(chunks):
                if k > 0:
                    planned = self.checkpoint / "offsets" / str(k - 1)
                    while not planned.exists():
                        if self._stop_evt.wait(0.02):
                            return
                for _, key, value in part:
                    while True:
                        try:
                            prod.produce(self.topic, key=key, value=value)
                            break
                        except BufferError:
                            prod.poll(0.02)
                    prod.poll(0)
                prod.flush(60)
                if k > 0 and (self.checkpoint / "commits" / str(k - 1)).exists():
                    self.late += 1
        except Exception as exc:  # noqa: BLE001 - reported with the run
            self.error = repr(exc)

    def stop(self) -> None:
        self._stop_evt.set()


def source_ignores_max_offsets() -> str | None:
    """Whether the job's Python source sees maxOffsetsPerTrigger the way Spark hands options over."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    from safepoint.connectors.kafka_source import KafkaStreamReader

    opts = CaseInsensitiveDict({"bootstrap.servers": "x", "subscribe": "t", "maxOffsetsPerTrigger": "123", "startingOffsets": "latest"})
    reader = KafkaStreamReader(opts)  # type: ignore[arg-type]
    if reader.max_rows == 123 and reader.starting == "latest":
        return None
    return ("BUG (not fixed here): the Python source ignores maxOffsetsPerTrigger and startingOffsets: Spark hands the "
            "options over lower-cased (CaseInsensitiveDict), KafkaStreamReader copies them into a plain dict and looks up "
            "'maxOffsetsPerTrigger' / 'startingOffsets' / 'readTimeoutSeconds' in camel case, so it gets None (no cap: a "
            "backlog is read in one batch) and 'earliest'. The throughput runs therefore feed the backlog in chunks of "
            "--max-offsets events, one batch ahead of the job, instead of preloading it.")


def run_spark_tp(args: argparse.Namespace, work: Path, bootstrap: str, events: list[tuple[int, str, bytes]], master: str,
                 tag: str, holds: int, extra_pids: dict[str, int], profile_out: str | None = None) -> dict[str, Any]:
    topics = make_topics(bootstrap, tag, args.partitions)
    ckpt = work / f"ckpt-{tag}"
    total = len(events)
    spec = {
        "bootstrap": bootstrap, "topics": topics, "checkpoint": str(ckpt), "master": master,
        "shuffle_partitions": args.shuffle_partitions, "max_offsets": args.max_offsets, "trigger_ms": args.trigger_ms,
        "total": total, "result": str(work / f"{tag}.json"), "extra_pids": extra_pids, "profile_out": profile_out,
        "timeout_s": args.timeout, "profile_rate": args.profile_rate,
    }
    feeder = Feeder(bootstrap, topics["events"], events, args.max_offsets, ckpt, args.first_batch)
    feeder.start()
    child = Child("_spark_tp", spec, work / f"{tag}.log")
    try:
        while True:
            msg = child.next(timeout=args.timeout)
            if msg is None or msg["ev"] == "eof":
                break
            if msg["ev"] == "progress":
                say(f"  {tag}: batch {msg['batch']} {msg['rows']} rows in {msg['ms']} ms ({msg['processed']}/{total})")
        rc = child.wait(120)
    finally:
        feeder.stop()
        feeder.join(10)
    if rc != 0 or not (work / f"{tag}.json").exists():
        tail = (work / f"{tag}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"spark run {tag} failed (exit {rc}; feeder {feeder.error}):\n{tail}")
    res = json.loads((work / f"{tag}.json").read_text())
    out = summarize_tp(res, holds)
    out["feeder_late_chunks"] = feeder.late
    out["directives"] = sum(1 for v in read_topic(bootstrap, topics["directives"]) if b'"compaction"' in v)
    return out


# ------------------------------------------------------------------------------------------------
# (3b) latency at an offered rate
# ------------------------------------------------------------------------------------------------


class DirectiveWatch(threading.Thread):
    """Records every compaction directive's arrival time (monotonic clock) and body."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True, name="bench-directives")
        self.c = consumer(bootstrap, "bench-lat", low_latency=True)
        assign_all(self.c, topic)
        self.got: list[tuple[float, dict[str, Any]]] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            msgs = self.c.consume(num_messages=1000, timeout=0.05)
            for m in msgs:
                t = time.monotonic()
                if m.error() is not None:
                    continue
                d = json.loads(m.value())
                if d.get("type") == "compaction":
                    self.got.append((t, d))
            if not msgs:
                idle(self.c, 0.01)
        self.c.close()

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(10)


def run_latency(args: argparse.Namespace, work: Path, bootstrap: str, wl: Workload, tag: str) -> dict[str, Any]:
    topics = make_topics(bootstrap, tag, args.partitions)
    watch = DirectiveWatch(bootstrap, topics["directives"])
    watch.start()
    spec = {
        "bootstrap": bootstrap, "topics": topics, "checkpoint": str(work / f"ckpt-{tag}"), "master": args.latency_master,
        "shuffle_partitions": args.shuffle_partitions, "max_offsets": args.max_offsets, "trigger_ms": args.trigger_ms,
    }
    child = Child("_spark_lat", spec, work / f"{tag}.log", stdin=True)
    progress: list[dict[str, Any]] = []
    processed = 0

    def pump(timeout: float) -> dict[str, Any] | None:
        nonlocal processed
        msg = child.next(timeout)
        if msg is not None and msg["ev"] == "progress":
            progress.append(msg)
            processed = msg["processed"]
        if msg is not None and msg["ev"] in ("failed", "eof"):
            tail = (work / f"{tag}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"latency run {tag}: the job {msg['ev']}: {msg.get('error', '')}\n{tail}")
        return msg

    msg = None
    deadline = time.monotonic() + 180
    while msg is None or msg["ev"] != "started":
        msg = pump(max(0.1, deadline - time.monotonic()))
        if time.monotonic() > deadline:
            raise RuntimeError(f"latency run {tag}: the job did not start in 180 s")
    # ticks: the simulator emits in 50 ms steps; every event of one wall_ms goes out in one burst
    ticks: list[tuple[int, list[tuple[str, bytes]]]] = []
    for wall, key, value in wl.events:
        if not ticks or ticks[-1][0] != wall:
            ticks.append((wall, []))
        ticks[-1][1].append((key, value))
    warm_end = START_MS + int(args.warmup * 1000)
    warm = [t for t in ticks if t[0] < warm_end]
    paced = [t for t in ticks if t[0] >= warm_end]
    prod = producer(bootstrap, linger_ms=5)
    sent_at: dict[int, float] = {}
    n_sent = 0

    def burst(tick: tuple[int, list[tuple[str, bytes]]]) -> None:
        nonlocal n_sent
        wall, evs = tick
        sent_at.setdefault(wall, time.monotonic())
        for key, value in evs:
            while True:
                try:
                    prod.produce(topics["events"], key=key, value=value)
                    break
                except BufferError:
                    prod.poll(0.01)
        n_sent += len(evs)
        prod.poll(0)

    # warm-up: the first seconds of event time at once; wait for the first directive and the drain
    t_warm = time.monotonic()
    for t in warm:
        burst(t)
    prod.flush(30)
    warm_sent = n_sent
    deadline = time.monotonic() + args.timeout
    while (not watch.got or processed < warm_sent) and time.monotonic() < deadline:
        pump(0.2)
    warm_s = time.monotonic() - t_warm
    say(f"  {tag}: warm-up {warm_sent} events, first directive after {warm_s:.1f} s; pacing {len(paced)} ticks "
        f"({sum(len(t[1]) for t in paced)} events over {(paced[-1][0] - paced[0][0]) / 1000 if paced else 0:.0f} s)")
    # paced: event i goes out at t0 + (wall_i - wall_0)
    t0 = time.monotonic()
    w0 = paced[0][0] if paced else warm_end
    lag_max = 0.0
    for t in paced:
        target = t0 + (t[0] - w0) / 1000
        now = time.monotonic()
        if target > now:
            time.sleep(target - now)
        else:
            lag_max = max(lag_max, now - target)
        burst(t)
        pump(0)
    prod.flush(30)
    t_paced_end = time.monotonic()
    paced_s = t_paced_end - t0
    backlog_at_end = n_sent - processed
    # drain: every sent event processed, then a little for the last directives to arrive
    deadline = time.monotonic() + args.drain_timeout
    while processed < n_sent and time.monotonic() < deadline:
        pump(0.2)
    drained = processed >= n_sent
    end_wait = time.monotonic() + 3
    while time.monotonic() < end_wait:
        pump(0.1)
    drain_s = time.monotonic() - t_paced_end
    t_stop = time.monotonic()
    child.send("stop")
    result = None
    deadline = time.monotonic() + 120
    while result is None and time.monotonic() < deadline:
        msg = child.next(1.0)
        if msg is not None and msg["ev"] == "result":
            result = msg["result"]
        elif msg is not None and msg["ev"] == "progress":
            progress.append(msg)
        elif msg is not None and msg["ev"] in ("eof", "failed"):
            break
    child.wait(120)
    watch.stop()
    if result is None:
        raise RuntimeError(f"latency run {tag}: no result from the job; see {work / (tag + '.log')}")

    # latencies: directive arrival - send time of the events whose wall_ms == cluster_wall_ms
    seen_seq: set[int] = set()
    samples: list[tuple[float, float]] = []  # (send time since t0, latency)
    warm_lat: list[float] = []
    unmatched = 0
    freed: set[int] = set()  # probe readers whose close a directive answered (its blocker is the next probe)
    for arrived, d in watch.got:
        if d["seq"] in seen_seq:
            continue  # at-least-once sink: a repeat
        seen_seq.add(d["seq"])
        bid = str((d.get("blocker") or {}).get("id", ""))
        if bid.startswith("probe-"):
            freed.update(range(int(bid[6:])))
        sent = sent_at.get(d["cluster_wall_ms"])
        if sent is None:
            unmatched += 1
            continue
        lat = arrived - sent
        if sent < t0:
            warm_lat.append(lat)
        else:
            samples.append((sent - t0, lat))
    lats = [x[1] for x in samples]
    # probe closes sent while pacing whose directive never came before the job was stopped: their
    # latency is at least (stop - send); they count with that lower bound, and the percentiles say so
    closes: dict[int, int] = {}
    for wall, evs in paced:
        for _, v in evs:
            if b'"reader_close"' in v and b'"probe-' in v:
                closes[int(json.loads(v)["reader_id"][6:])] = wall
    censored = [t_stop - sent_at[w] for k, w in closes.items() if k not in freed]
    all_lats = lats + censored
    expected = len(closes)
    steady = [b for b in result["batches"] if b["numInputRows"]][1:]
    rows = sum(b["numInputRows"] for b in steady)
    ms = sum((b["durationMs"] or {}).get("triggerExecution", 0) for b in steady)
    holds = open_holds([v for _, _, v in wl.events])
    rss_end = result["rss_end"].get("jvm", 0) + result["rss_end"].get("workers", 0)
    return {
        "tag": tag,
        "master": args.latency_master,
        "offered_rate_target": wl.offered_rate,
        "offered_rate_actual": sum(len(t[1]) for t in paced) / paced_s if paced_s else None,
        "producer_lag_max_s": lag_max,
        "events_sent": n_sent,
        "warmup_events": warm_sent,
        "warmup_s": warm_s,
        "paced_s": paced_s,
        "backlog_at_end_of_pacing": backlog_at_end,
        "drained": drained,
        "drain_s": drain_s,
        "directives_expected": expected,
        "directives_measured": len(lats),
        "directives_unmatched": unmatched,
        "directives_missing": len(censored),
        "latency_s": {
            "p50": percentile(all_lats, 50), "p95": percentile(all_lats, 95), "p99": percentile(all_lats, 99),
            "max": max(all_lats) if all_lats else None, "mean": sum(all_lats) / len(all_lats) if all_lats else None,
            "lower_bound": bool(censored),
        },
        "warmup_latency_s": {"p50": percentile(warm_lat, 50), "max": max(warm_lat) if warm_lat else None, "n": len(warm_lat)},
        "series": [(round(a, 3), round(b, 4)) for a, b in samples],
        "job_batches": len(result["batches"]),
        "job_sustained_events_per_s": rows / (ms / 1000) if ms else None,
        "job_batch_ms_p50": percentile([(b["durationMs"] or {}).get("triggerExecution", 0) for b in steady], 50),
        "job_batch_rows_p50": percentile([b["numInputRows"] for b in steady], 50),
        "session_s": result["session_s"],
        "rss_peak": result["rss_peak"],
        "rss_end": result["rss_end"],
        "jvm_plus_workers_rss_end": rss_end,
        "holds": holds,
        "rss_per_hold": rss_end / holds if holds else None,
        "state_dir_bytes": result["state_dir_bytes"],
        "state_bytes_per_hold": result["state_dir_bytes"] / holds if holds else None,
        "state_operators_last": result["batches"][-1]["stateOperators"] if result["batches"] else [],
    }


# ------------------------------------------------------------------------------------------------
# (4) profiles
# ------------------------------------------------------------------------------------------------


def _top_stats(prof: cProfile.Profile, us_per_event: float, n: int = 12) -> list[dict[str, Any]]:
    """Top functions by self time, as a share of all profiled time and scaled to the unprofiled cost."""
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values()) or 1.0  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        short = file.split("site-packages/")[-1].split("/main/")[-1]
        rows.append({"func": f"{func} ({short}:{line})", "calls": nc, "self_share": tt / total,
                     "self_us_per_event": tt / total * us_per_event})
    return sorted(rows, key=lambda r: -r["self_share"])[:n]


def _cum_for(prof: cProfile.Profile, us_per_event: float, names: list[str]) -> dict[str, float]:
    """Cumulative time of the named functions ("file-suffix:func"), as a share of all profiled time scaled
    to the unprofiled cost per event (cProfile roughly doubles the cost; shares hold up better)."""
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values()) or 1.0  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        for name in names:
            mod, _, fn = name.rpartition(":")
            if fn == func and file.endswith(mod):
                out[name] = out.get(name, 0.0) + ct / total * us_per_event
    return out


def profile_plain(values: list[bytes]) -> dict[str, Any]:
    """The core alone (Engine.process per message, outputs encoded), timed and under cProfile."""
    from safepoint.core import Engine, Position
    from safepoint.core.codec import encode

    def run() -> float:
        eng = Engine()
        t = time.perf_counter()
        for i, v in enumerate(values):
            for o in eng.process(v, Position("t", 0, i)):
                encode(o.value)
        return time.perf_counter() - t

    plain_s = run()
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    n = len(values)
    return {
        "events": n,
        "us_per_event": plain_s / n * 1e6,
        "events_per_s": n / plain_s,
        "top_self": _top_stats(prof, plain_s / n * 1e6),
        "cumulative_us_per_event": _cum_for(prof, plain_s / n * 1e6, [
            "engine.py:node_stage", "engine.py:cluster_stage", "events.py:parse", "node.py:apply", "cluster.py:apply_node_update", "cluster.py:evaluate",
            "cluster.py:problems", "cluster.py:_directive", "codec.py:encode", "node.py:_pressure",
        ]),
    }


def profile_processors(values: list[tuple[str, bytes]], batch_rows: int, partitions: int) -> dict[str, Any]:
    """The job's batch logic (core/batch.py: route, stage one per bucket, stage two per cluster, with
    the state values and the pickled hand-offs between them) run in this process, without Spark.

    A second pass runs under cProfile. What is left between this and the job's real rate is Spark's
    own cost (Arrow between JVM and Python, the shuffles, RocksDB, the source and sink).
    """
    import pickle

    from safepoint.core.batch import route, stage_one_bucket, stage_two
    from safepoint.core.policy import Policy

    policy = Policy()
    buckets = 8
    offsets = [0] * partitions
    msgs: list[tuple[int, int, bytes, bytes]] = []
    for key, value in values:
        p = zlib.crc32(key.encode()) % partitions
        msgs.append((p, offsets[p], key.encode(), value))
        offsets[p] += 1
    n = len(msgs)
    prof = cProfile.Profile()

    def one_pass(profiled: bool) -> tuple[dict[str, float], int, int]:
        seconds = {"route": 0.0, "stage1": 0.0, "stage2": 0.0}
        state1: dict[Any, str] = {}
        state2: dict[str, str] = {}
        outs = 0
        if profiled:
            prof.enable()
        for start in range(0, n, batch_rows):
            batch = msgs[start:start + batch_rows]
            t0 = time.perf_counter()
            groups1: dict[tuple[str, int], list[Any]] = defaultdict(list)
            for part in range(partitions):  # one router call per Kafka partition, as the read tasks do
                for gkey, items in route([m for m in batch if m[0] == part], "bench", policy, buckets).items():
                    groups1[gkey].extend(pickle.loads(pickle.dumps(items, 5)))
            t1 = time.perf_counter()
            groups2: dict[str, list[Any]] = defaultdict(list)
            for gkey, items in groups1.items():
                new, staged, _counts = stage_one_bucket(state1.get(gkey), items, policy, buckets)
                if new is not None:
                    state1[gkey] = new
                groups2[gkey[0]].extend(pickle.loads(pickle.dumps(staged, 5)))
            t2 = time.perf_counter()
            for cluster, items in groups2.items():
                new, outputs = stage_two(cluster, state2.get(cluster), items, policy, False)
                if new is not None:
                    state2[cluster] = new
                outs += len(outputs)
            t3 = time.perf_counter()
            seconds["route"] += t1 - t0
            seconds["stage1"] += t2 - t1
            seconds["stage2"] += t3 - t2
        if profiled:
            prof.disable()
        return seconds, outs, sum(len(v) for v in state1.values()) + sum(len(v) for v in state2.values())

    fs, n_out, state_bytes = one_pass(False)
    one_pass(True)
    total = sum(fs.values())
    return {
        "events": n,
        "batch_rows": batch_rows,
        "route_us_per_event": fs["route"] / n * 1e6,
        "node_stage_us_per_event": fs["stage1"] / n * 1e6,
        "cluster_stage_us_per_event": fs["stage2"] / n * 1e6,
        "total_us_per_event": total / n * 1e6,
        "events_per_s": n / total,
        "outputs": n_out,
        "state_value_bytes": state_bytes,
        "top_self": _top_stats(prof, total / n * 1e6),
        "cumulative_us_per_event": _cum_for(prof, total / n * 1e6, [
            "engine.py:parse_stage", "events.py:parse", "engine.py:apply_stage", "node.py:apply",
            "node.py:from_json", "node.py:to_json", "engine.py:cluster_stage", "cluster.py:from_json", "cluster.py:to_json",
            "cluster.py:_directive", "codec.py:encode", "batch.py:merge_log_order", "batch.py:route",
            "batch.py:stage_one_bucket", "batch.py:stage_two", "json/__init__.py:dumps", "json/__init__.py:loads",
        ]),
    }


_PYSPY_GROUPS = [
    # (label, predicate over one frame "func (file:line)"); the deepest matching frame of a sample wins
    ("safepoint core: parse + validate (core/events.py)", lambda f: "safepoint/core/events.py" in f or "fastjsonschema" in f),
    ("safepoint core: node rules (core/node.py, bands)", lambda f: "safepoint/core/node.py" in f or "safepoint/core/bands.py" in f),
    ("safepoint core: cluster round (core/cluster.py)", lambda f: "safepoint/core/cluster.py" in f or "sortedcontainers" in f),
    ("safepoint core: engine glue, outputs, codec", lambda f: "safepoint/core/" in f),
    ("batch logic: routing, staging, state JSON, log-order merge (core/batch.py)", lambda f: "safepoint/core/batch.py" in f),
    ("processors: (un)pickling packed rows, Row fields (streaming/processors.py)", lambda f: "streaming/processors.py" in f),
    ("source: Kafka read (kafka_source.py read)", lambda f: "kafka_source.py" in f and f.startswith(("read ", "KafkaStreamReader.read "))),
    ("sink: Kafka write (kafka_sink.py write)", lambda f: "kafka_sink.py" in f),
    ("source: driver-side offsets, planning, commit (kafka_source.py)", lambda f: "kafka_source.py" in f),
    ("pyspark: Arrow -> Row, cell by cell (worker.py generate_data_batches)", lambda f: "generate_data_batches" in f),
    ("pyspark: Row -> Arrow of the outputs (worker.py convert_results)", lambda f: "convert_results" in f),
    ("pyspark: state API client (ValueState get/update: socket round trips to the JVM)",
     lambda f: "stateful_processor" in f or "state_api" in f or "value_state" in f),
    ("pyspark: Arrow/pickle serializers, Row class", lambda f: "serializers.py" in f or "pyspark/sql/types.py" in f
     or "conversion.py" in f),
    ("pyspark daemon: gc.collect() after every task (daemon.py manager)", lambda f: f.startswith("manager (") and "daemon.py" in f),
]
_PYSPY_FALLBACK = [  # only when no frame of the sample matches a group above
    ("pyarrow", lambda f: "pyarrow" in f),
    ("pyspark: worker setup, other", lambda f: "pyspark" in f),
]


def classify(frames_leaf_first: list[str], groups: list[Any], fallback: list[Any]) -> str:
    """The group of the deepest frame matching a specific group, else of the deepest matching a fallback."""
    for rules in (groups, fallback):
        for f in frames_leaf_first:
            for label, pred in rules:
                if pred(f):
                    return str(label)
    return "other"


def parse_pyspy(path: Path, rate: int, seconds: float | None) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks of the job's Python processes (the bench driver itself left out).

    Each sample goes to the group of its deepest frame that matches one; top self frames and the
    process kinds (executor workers, data source runners) come along.
    """
    if not path.exists():
        return {"error": "no py-spy output"}
    groups: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    procs: Counter[str] = Counter()
    pids: set[str] = set()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        heads = [f for f in frames if f.startswith("process ")]
        inner = heads[-1] if heads else "?"
        if "benchmarks/bench.py" in inner:
            continue  # the bench driver (sampling psutil, py4j): not the job
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        kind = "executor workers (pyspark.worker)" if "pyspark.worker" in inner else (
            inner.split("pyspark.sql.worker.")[-1].split('"')[0] if "pyspark.sql.worker." in inner else "other")
        procs[kind] += n
        pids.add(inner.split(":")[0])
        total += n
        leaf[_short(frames[-1])] += n
        for f in set(frames):
            incl[_short(f)] += n
        groups[classify(frames[::-1], _PYSPY_GROUPS, _PYSPY_FALLBACK)] += n
    res: dict[str, Any] = {
        "samples": total,
        "rate_hz": rate,
        "processes": len(pids),
        "by_process_kind": dict(procs),
        "groups": [(k, v, v / total if total else 0) for k, v in groups.most_common()],
        "top_self": [(k, v, v / total if total else 0) for k, v in leaf.most_common(15)],
        "top_inclusive": [(k, v, v / total if total else 0) for k, v in incl.most_common(30)],
    }
    if seconds:
        res["busy_python_processes"] = total / rate / seconds
    return res


_JFR_GROUPS = [
    ("RocksDB (JNI calls)", lambda f: f.startswith("org.rocksdb.")),
    ("state store: RocksDB provider, changelog, snapshot upload", lambda f: ".execution.streaming.state." in f),
    ("transformWithState: JVM side of the Python state API (state server)", lambda f: "StateServer" in f or "StatefulProcessorHandleImpl" in f),
    ("Arrow (JVM side)", lambda f: f.startswith("org.apache.arrow.")),
    ("Python runner: Arrow streams to and from the Python workers", lambda f: ".execution.python." in f or ".api.python." in f),
    ("from_json (Jackson)", lambda f: "jackson" in f or "JsonToStructs" in f or ".catalyst.json." in f),
    ("shuffle: sort, serialize, compress, read/write", lambda f: ".shuffle." in f or "ExternalSorter" in f or "net.jpountz" in f
     or "com.github.luben" in f or "io.netty" in f or ".storage." in f or "UnsafeRowSerializer" in f),
    ("generated code (projections, sorts, aggregates)", lambda f: "GeneratedClass" in f or "generated" in f.lower()),
    ("query planning, analysis, optimizer (driver)", lambda f: ".catalyst.optimizer." in f or ".catalyst.analysis." in f
     or ".catalyst.rules." in f or "QueryExecution" in f or ".catalyst.trees." in f or "IncrementalExecution" in f),
    ("codegen: generating and compiling code (per batch)", lambda f: "CodeGenerator" in f or "CodegenContext" in f
     or "CodeFormatter" in f or "janino" in f or "codehaus" in f),
    ("scheduler: tasks, task results, DAG", lambda f: ".scheduler." in f or "DirectTaskResult" in f or "TaskRunner" in f
     and "runWorker" not in f),
    ("closure cleaning, task serialization", lambda f: "ClosureCleaner" in f or "JavaSerializer" in f or ".serializer." in f),
    ("listeners, progress, logging", lambda f: ".status." in f or "Logging" in f or "ProgressReporter" in f or "ListenerBus" in f),
    ("Spark streaming engine (driver: offsets, commits, progress)", lambda f: ".execution.streaming." in f),
]
_JFR_FALLBACK = [
    ("rows: UnsafeRow, UTF8String, projections (Spark, other)", lambda f: f.startswith("org.apache.spark.")),
    ("sockets, NIO", lambda f: f.startswith(("sun.nio.", "java.net.", "sun.net."))),
    ("Scala, JDK", lambda f: True),
]


def parse_jfr(path: Path) -> dict[str, Any]:
    """Java Flight Recorder execution samples by group (deepest matching frame) and thread kind, plus GC pauses."""
    jfr = _jdk_tool("jfr")
    if not jfr or not path.exists():
        return {"error": "no JFR recording"}
    r = subprocess.run([jfr, "print", "--events", "jdk.ExecutionSample", "--stack-depth", "48", str(path)],
                       capture_output=True, text=True, timeout=300, check=False)
    groups: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    frames: list[str] = []
    thread = ""
    in_stack = False
    for line in r.stdout.splitlines():
        t = line.strip()
        if t.startswith("sampledThread = "):
            thread = t
        elif t.startswith("stackTrace = ["):
            in_stack, frames = True, []
        elif in_stack and t == "]":
            in_stack = False
            if not frames:
                continue
            total += 1
            threads["executor task threads" if "Executor task launch" in thread else "driver and other threads"] += 1
            leaf[frames[0]] += 1
            groups[classify(frames, _JFR_GROUPS, _JFR_FALLBACK)] += 1
        elif in_stack and t and t != "...":
            frames.append(t.split("(")[0].strip())
    g = subprocess.run([jfr, "print", "--events", "jdk.GarbageCollection", str(path)], capture_output=True, text=True,
                       timeout=300, check=False)
    pauses_ms = 0.0
    n_gc = 0
    for line in g.stdout.splitlines():
        t = line.strip()
        if t.startswith("sumOfPauses = "):
            n_gc += 1
            val = t.split("=", 1)[1].strip()
            num = float(val.split()[0].replace(",", ""))
            pauses_ms += num * ({"s": 1000.0, "ms": 1.0, "us": 0.001, "ns": 1e-6}.get(val.split()[1], 1.0) if " " in val else 1.0)
    return {
        "samples": total,
        "by_thread": dict(threads),
        "groups": [(k, v, v / total if total else 0) for k, v in groups.most_common()],
        "top_self": [(k, v, v / total if total else 0) for k, v in leaf.most_common(12)],
        "gc_count": n_gc,
        "gc_pauses_ms": pauses_ms,
    }


def _short(frame: str) -> str:
    name, _, loc = frame.partition(" (")
    loc = loc.rstrip(")")
    for cut in ("site-packages/", "/main/", "python3.11/"):
        if cut in loc:
            loc = loc.split(cut)[-1]
    return f"{name} ({loc})"


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------


def plot_latency(lat_runs: list[dict[str, Any]], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install -e '.[bench]'): no plot"
    fig, ax = plt.subplots(figsize=(10, 5))
    for r in lat_runs:
        if r.get("series"):
            xs = [a for a, _ in r["series"]]
            ys = [b for _, b in r["series"]]
            p99 = r["latency_s"]["p99"]
            ax.plot(xs, ys, ".", markersize=3, label=f"{r['offered_rate_target']:,.0f} ev/s offered (p99 {p99:.2f} s)")
    ax.axhline(TARGETS["p99_latency_s"], color="red", linestyle="--", linewidth=1, label="target p99 2 s")
    ax.set_xlabel("send time of the event, s since pacing started")
    ax.set_ylabel("event-to-directive latency, s")
    ax.set_yscale("log")
    ax.set_title("safepoint job: event-to-directive latency over time")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def status(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


def build_report(res: dict[str, Any]) -> str:
    L: list[str] = []  # noqa: N806
    a = res["args"]
    L.append(f"# safepoint benchmark {res['timestamp']}")
    L.append("")
    L.append(f"Machine: {res['machine']['cpus']} CPUs, load average at start {res['machine']['loadavg_start']}, at end "
             f"{res['machine'].get('loadavg_end')}. Total run {res['total_s']:.0f} s.")
    tw = res["workloads"].get("throughput")
    if tw:
        L.append(f"Workload: {a['nodes']} nodes + 1 probe node, {tw['events']:,} events backlog ({tw['types']}), "
                 f"{tw['heartbeat_ms']} ms heartbeats, long-reader share {a['long_share']}, probe {a['probe_hz']} Hz "
                 f"({tw['probe_closes']} probe closes = directives); {a['partitions']} partitions.")
    L.append("")
    L.append("| measurement | events/s | vs plain | vs raw consume | memory (RSS) | notes |")
    L.append("| --- | ---: | ---: | ---: | ---: | --- |")
    raw = res.get("raw_consume")
    plain = res.get("plain")
    raw_r = raw["events_per_s"] if raw else None
    plain_r = plain["events_per_s"] if plain else None

    def ratio(x: float | None, y: float | None) -> str:
        return "-" if not x or not y else f"{x / y:.2f}x"

    if res.get("produce"):
        p = res["produce"]
        L.append(f"| broker produce (backlog load) | {fmt_rate(p['events_per_s'])} | | | | idempotent producer, linger 20 ms |")
    if raw:
        L.append(f"| (1) raw consume | {fmt_rate(raw_r)} | {ratio(raw_r, plain_r)} | 1.00x | | {raw['mb_per_s']:.1f} MB/s, "
                 f"confluent-kafka, no processing |")
    if plain:
        L.append(f"| (2) plain consumer (1 process) | {fmt_rate(plain_r)} | 1.00x | {ratio(plain_r, raw_r)} | "
                 f"{mb(plain['rss_peak'])} peak | consume + Engine.process + produce; outputs {plain['outputs']} |")
    for tp in res.get("spark_throughput", []):
        s = tp["sustained_events_per_s"]
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(tp["cpu_us_per_event"].items()))
        L.append(f"| (3a) job {tp['master']}, sustained after batch 0 | {fmt_rate(s)} | {ratio(s, plain_r)} | {ratio(s, raw_r)} | "
                 f"{mb(tp['jvm_plus_workers_rss_end'])} (JVM {mb(tp['rss_end'].get('jvm'))} + {tp['rss_end'].get('workers_n')} "
                 f"workers {mb(tp['rss_end'].get('workers'))}; PSS {mb(tp['rss_end'].get('jvm_pss', 0) + tp['rss_end'].get('workers_pss', 0))}) | "
                 f"{tp['batches']} batches{' (feeder late ' + str(tp['feeder_late_chunks']) + 'x)' if tp.get('feeder_late_chunks') else ''}, "
                 f"{tp['directives']} directives; batch 0: {tp['batch0_rows']} rows in "
                 f"{tp['batch0_ms']} ms; wall after batch 0 {fmt_rate(tp['wall_events_per_s_after_batch0'])}/s; "
                 f"CPU us/event: {cpu} |")
    prof_tp = res.get("profile", {}).get("spark_pyspy_run")
    if prof_tp:
        L.append(f"| job {prof_tp['master']} under py-spy (not a figure) | {fmt_rate(prof_tp['sustained_events_per_s'])} | "
                 f"{ratio(prof_tp['sustained_events_per_s'], plain_r)} | | | sampling overhead included |")
    L.append("")
    lat = res.get("latency", [])
    if lat:
        L.append(f"Latency (job on {lat[0]['master']}, trigger {a['trigger_ms']} ms; each directive's arrival minus the send time "
                 "of the events whose `wall_ms` equals its `cluster_wall_ms`; warm-up excluded):")
        L.append("")
        L.append("| offered ev/s (actual) | directives | p50 s | p95 s | p99 s | max s | job ev/s (sustained) | backlog at end | "
                 "RSS JVM+workers | state dir |")
        L.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in lat:
            q = r["latency_s"]

            def f(x: float | None, q: dict[str, Any] = q) -> str:
                return "-" if x is None else (">=" if q.get("lower_bound") else "") + f"{x:.2f}"

            L.append(f"| {r['offered_rate_target']:,.0f} ({fmt_rate(r['offered_rate_actual'])}) | {r['directives_measured']}/"
                     f"{r['directives_expected']} | {f(q['p50'])} | {f(q['p95'])} | {f(q['p99'])} | {f(q['max'])} | "
                     f"{fmt_rate(r['job_sustained_events_per_s'])} | {r['backlog_at_end_of_pacing']:,} ev"
                     f"{'' if r['drained'] else ' (not drained)'} | {mb(r['jvm_plus_workers_rss_end'])} | "
                     f"{mb(r['state_dir_bytes'])} |")
        L.append("")
        if res.get("plot"):
            L.append(f"![latency over time]({res['plot']})")
            L.append("")
    st = res.get("state")
    if st:
        L.append(f"State at the end of the backlog: {st['holds']:,} active holds (open readers + undecided transactions) on "
                 f"{st['nodes']:,} nodes. Checkpoint `state/` dir (du): {mb(st['state_dir_bytes'])} = "
                 f"**{st['state_dir_per_hold']:,.0f} B/hold**; live RocksDB SST + memtable per the last batch: "
                 f"{mb(st.get('rocksdb_bytes'))}; the JSON values themselves: node groups {mb(st['node_bytes'])}, cluster "
                 f"{mb(st['cluster_bytes'])} = {st['logical_per_hold']:,.0f} B/hold (of which per-node fixed part "
                 f"~{st['per_node_fixed_bytes']:,.0f} B/node). JVM+workers RSS per hold: {st['rss_per_hold']:,.0f} B.")
        L.append("")
    L.append("## Targets (reported, not asserted)")
    L.append("")
    L.append("| target | measured | status |")
    L.append("| --- | --- | --- |")
    for t in res["targets"]:
        L.append(f"| {t['target']} | {t['measured']} | {status(t['ok'])} |")
    L.append("")
    prof = res.get("profile")
    if prof:
        L.append("## Profile: where the job's per-event time goes")
        L.append("")
        for line in prof.get("findings", []):
            L.append(f"- {line}")
        L.append("")
        ps = prof.get("pyspy")
        if ps and "groups" in ps:
            L.append(f"py-spy over the job's Python processes ({ps['samples']:,} samples at {ps['rate_hz']} Hz; "
                     f"by process: {ps['by_process_kind']}), deepest matching frame:")
            L.append("")
            L.append("| where | share of Python samples |")
            L.append("| --- | ---: |")
            for k, _n, sh in ps["groups"]:
                L.append(f"| {k} | {sh:.1%} |")
            L.append("")
            L.append("Top self frames: " + "; ".join(f"{k} {sh:.1%}" for k, _n, sh in ps["top_self"][:10]))
            L.append("")
        jf = prof.get("jfr")
        if jf and jf.get("groups"):
            L.append(f"Java Flight Recorder over the job's JVM during the same run ({jf['samples']:,} execution samples; "
                     f"{jf['by_thread']}; {jf['gc_count']} GCs, {jf['gc_pauses_ms']:,.0f} ms of pauses), deepest matching frame:")
            L.append("")
            L.append("| where (JVM) | share of JVM samples |")
            L.append("| --- | ---: |")
            for k, _n, sh in jf["groups"]:
                L.append(f"| {k} | {sh:.1%} |")
            L.append("")
            L.append("Top self frames (JVM): " + "; ".join(f"{k} {sh:.1%}" for k, _n, sh in jf["top_self"][:8]))
            L.append("")
        pp = prof.get("processors_local")
        if pp:
            L.append(f"The job's processors run locally without Spark ({pp['events']:,} events in batches of {pp['batch_rows']:,}): "
                     f"router {pp['route_us_per_event']:.1f} us/event, node stage {pp['node_stage_us_per_event']:.1f}, "
                     f"cluster stage {pp['cluster_stage_us_per_event']:.1f}, {fmt_rate(pp['events_per_s'])} ev/s. "
                     "Cumulative us/event: "
                     + ", ".join(f"`{k}` {v:.1f}" for k, v in sorted(pp["cumulative_us_per_event"].items(), key=lambda kv: -kv[1])))
            L.append("")
        pl = prof.get("plain_core")
        if pl:
            L.append(f"The core alone (Engine.process, no Kafka): {pl['us_per_event']:.1f} us/event ({fmt_rate(pl['events_per_s'])} ev/s). "
                     "Cumulative us/event: " + ", ".join(f"`{k}` {v:.1f}" for k, v in
                                                          sorted(pl["cumulative_us_per_event"].items(), key=lambda kv: -kv[1])))
            L.append("")
    if res.get("notes"):
        L.append("## Notes")
        L.append("")
        for n in res["notes"]:
            L.append(f"- {n}")
        L.append("")
    return "\n".join(L)


def evaluate_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    plain = (res.get("plain") or {}).get("events_per_s")
    tps = {t["master"]: t for t in res.get("spark_throughput", []) }
    best = max((t["sustained_events_per_s"] or 0 for t in tps.values()), default=0) or None
    best_master = max(tps.values(), key=lambda t: t["sustained_events_per_s"] or 0)["master"] if tps else None
    r = best / plain if best and plain else None
    out.append({"target": "job throughput >= plain consumer (aim 2x)",
                "measured": f"{r:.2f}x ({best_master}: {fmt_rate(best)} vs {fmt_rate(plain)} ev/s)" if r else "-",
                "ok": (r >= TARGETS["throughput_vs_plain"]) if r else None})
    out.append({"target": "aim: job throughput 2x plain", "measured": f"{r:.2f}x" if r else "-",
                "ok": (r >= TARGETS["throughput_vs_plain_aim"]) if r else None})
    lat = [x for x in res.get("latency", []) if x["offered_rate_target"] == TARGETS["p99_at_rate"]]
    if lat:
        q = lat[0]["latency_s"]
        p99, lb = q["p99"], q.get("lower_bound")
        ok = None if p99 is None else p99 < TARGETS["p99_latency_s"]
        if lb and ok:
            ok = None  # a lower bound under 2 s proves nothing
        out.append({"target": "p99 event-to-directive latency < 2 s at 10,000 ev/s",
                    "measured": "-" if p99 is None else f"{'>= ' if lb else ''}{p99:.2f} s (p50 {q['p50']:.2f} s; job "
                    f"{fmt_rate(lat[0]['job_sustained_events_per_s'])} ev/s sustained, backlog "
                    f"{lat[0]['backlog_at_end_of_pacing']:,} events when pacing ended)",
                    "ok": ok})
    else:
        out.append({"target": "p99 event-to-directive latency < 2 s at 10,000 ev/s", "measured": "not run at 10,000 ev/s", "ok": None})
    st = res.get("state")
    if st:
        out.append({"target": "state < 200 bytes per active hold",
                    "measured": f"{st['state_dir_per_hold']:,.0f} B/hold (checkpoint state dir); JSON values alone "
                                f"{st['logical_per_hold']:,.0f} B/hold",
                    "ok": st["state_dir_per_hold"] < TARGETS["state_bytes_per_hold"]})
    if "local[1]" in tps and "local[2]" in tps and tps["local[1]"]["sustained_events_per_s"]:
        s = tps["local[2]"]["sustained_events_per_s"] / tps["local[1]"]["sustained_events_per_s"]
        out.append({"target": "scaling 1 -> 2 cores (local[2] / local[1]; 1.5x taken as the bar, 2.0x ideal)",
                    "measured": f"{s:.2f}x ({fmt_rate(tps['local[1]']['sustained_events_per_s'])} -> "
                                f"{fmt_rate(tps['local[2]']['sustained_events_per_s'])} ev/s)",
                    "ok": s >= TARGETS["scaling_2_vs_1"]})
    return out


def findings(res: dict[str, Any]) -> list[str]:
    """Plain-language top findings from the numbers (the .md and the console)."""
    out: list[str] = []
    tps = [t for t in res.get("spark_throughput", []) ]
    t2 = next((t for t in tps if t["master"] == "local[2]"), tps[-1] if tps else None)
    prof = res.get("profile", {})
    pp = prof.get("processors_local")
    pl = prof.get("plain_core")
    ps = prof.get("pyspy")
    if t2 and t2.get("sustained_events_per_s"):
        per_ev = 1e6 / t2["sustained_events_per_s"]
        cpu = t2.get("cpu_us_per_event") or {}
        tot = sum(cpu.values())
        out.append(
            f"Job {t2['master']}: {per_ev:.0f} us of wall time per event; CPU per event "
            + ", ".join(f"{k} {v:.0f} us ({v / tot:.0%})" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))
            + f" = {tot:.0f} us of CPU per event on 2 cores"
            + (f" (the plain consumer: {1e6 / res['plain']['events_per_s']:.0f} us of wall time per event in one process)"
               if res.get("plain") else "")
            + "."
        )
        ph = t2.get("phase_ms_after_batch0") or {}
        if ph.get("triggerExecution"):
            te = ph["triggerExecution"]
            parts = ", ".join(f"{k} {v / te:.0%}" for k, v in sorted(ph.items(), key=lambda kv: -kv[1]) if k != "triggerExecution")
            out.append(f"Micro-batch time after batch 0 by phase (of triggerExecution): {parts}.")
        ops = t2.get("state_operators_last") or []
        if ops:
            out.append("State operators in the last batch: " + "; ".join(
                f"{o['name']}: rows {o['numRowsTotal']}, updated {o['numRowsUpdated']}, allUpdates {o['allUpdatesTimeMs']} ms, "
                f"commit {o['commitTimeMs']} ms" for o in ops) + ".")
    for r in res.get("latency", []):
        if r.get("job_batch_ms_p50") and r.get("job_batch_rows_p50"):
            out.append(f"At {r['offered_rate_target']:,.0f} ev/s offered, the job's batches held {r['job_batch_rows_p50']:,.0f} "
                       f"rows (p50) and took {r['job_batch_ms_p50']:,.0f} ms (p50): "
                       f"{r['job_batch_ms_p50'] * 1000 / r['job_batch_rows_p50']:,.0f} us per event in small batches, "
                       f"{'behind' if r['backlog_at_end_of_pacing'] > r['offered_rate_target'] else 'keeping up'} "
                       f"({r['backlog_at_end_of_pacing']:,} events of backlog when pacing ended).")
    if pp and pl:
        out.append(
            f"Python work per event in the job's batch logic, measured without Spark: "
            f"{pp['total_us_per_event']:.1f} us (router {pp['route_us_per_event']:.1f}, node stage "
            f"{pp['node_stage_us_per_event']:.1f}, cluster stage {pp['cluster_stage_us_per_event']:.1f}), "
            f"Engine.process alone {pl['us_per_event']:.1f} us. Stage state values at the end: {pp['state_value_bytes']:,} B."
        )
    jf = prof.get("jfr")
    if jf and jf.get("groups"):
        top = ", ".join(f"{k} {sh:.0%}" for k, _n, sh in jf["groups"][:6])
        out.append(f"JFR over the JVM: {top}; GC pauses {jf['gc_pauses_ms']:,.0f} ms over {jf['gc_count']} collections.")
    if ps and ps.get("groups"):
        top = ", ".join(f"{k} {sh:.0%}" for k, _n, sh in ps["groups"][:6])
        out.append(f"py-spy over the job's Python processes: {top}.")
        if ps.get("busy_python_processes") is not None:
            out.append(f"On average {ps['busy_python_processes']:.2f} Python processes were on CPU during the profiled run "
                       "(out of 2 cores): the rest is the JVM, the broker and idle time.")
    return out


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="safepoint bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--events", type=int, default=410_000, help="events in the throughput backlog")
    p.add_argument("--nodes", type=int, default=1000, help="database nodes in the workload (plus one probe node)")
    p.add_argument("--rate", default="1000,10000", help="offered rates for the latency runs, events/s, comma-separated")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of paced load per latency rate")
    p.add_argument("--out", default="out", help="directory for the JSON, markdown and plot")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--long-share", type=float, default=0.001, help="share of readers that stay open 8-30 s")
    p.add_argument("--probe-hz", type=float, default=10.0, help="probe blocker frees per second of event time (= directives/s)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the events topics")
    p.add_argument("--shuffle-partitions", type=int, default=None, help="default: the job's shuffle_partitions setting")
    p.add_argument("--max-offsets", type=int, default=200_000,
                   help="maxOffsetsPerTrigger given to the job (the job's default), and the chunk the throughput runs are fed in (one per batch)")
    p.add_argument("--first-batch", type=int, default=10_000, help="events in the throughput runs' batch 0 (excluded)")
    p.add_argument("--trigger-ms", type=int, default=500, help="processing-time trigger of the job (the job's default)")
    p.add_argument("--masters", default="local[1],local[2]", help="Spark masters of the throughput runs")
    p.add_argument("--latency-master", default="local[2]")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of event time sent before pacing (first batch, excluded)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="most seconds to wait for the job to catch up after pacing")
    p.add_argument("--timeout", type=float, default=600.0, help="most seconds for one Spark run")
    p.add_argument("--phases", default="raw,plain,spark,latency,profile",
                   help="which phases to run: raw,plain,spark,latency,profile (profile = cProfile + a py-spy'd local[2] run)")
    p.add_argument("--profile-rate", type=int, default=50, help="py-spy samples per second")
    p.add_argument("--profile-events", type=int, default=60_000, help="events for the cProfile runs and the py-spy'd job run")
    p.add_argument("--keep", action="store_true", help="keep the work directory (checkpoints, logs)")
    args = p.parse_args(argv)
    if args.shuffle_partitions is None:
        from safepoint.settings import Settings

        args.shuffle_partitions = Settings().shuffle_partitions
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("_plain", "_spark_tp", "_spark_lat"):
        spec = json.loads(argv[1])
        return {"_plain": worker_plain, "_spark_tp": worker_spark_tp, "_spark_lat": worker_spark_lat}[argv[0]](spec)
    args = parse_args(argv)
    phases = set(args.phases.split(","))
    rates = [float(r) for r in args.rate.split(",") if r.strip()]
    from safepoint.broker import EmbeddedBroker

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = Path(tempfile.mkdtemp(prefix="safepoint-bench-"))
    res: dict[str, Any] = {
        "timestamp": stamp,
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": _loadavg()},
        "workloads": {},
        "notes": [],
    }
    t_start = time.monotonic()
    say(f"work dir {work}; load average {_loadavg()}")
    broker = EmbeddedBroker(data_dir=str(work / "broker"))
    try:
        # -- workloads -----------------------------------------------------------------------
        top_rate = max(rates) if rates else 10_000.0
        wl = build_workload("throughput", args.nodes, top_rate, seed=args.seed, long_share=args.long_share,
                            probe_hz=args.probe_hz, events=args.events)
        values = [v for _, _, v in wl.events]
        holds_model = open_holds(values)
        res["workloads"]["throughput"] = {"events": len(wl.events), "types": wl.types, "heartbeat_ms": wl.heartbeat_ms,
                                          "event_time_s": wl.duration_ms / 1000, "probe_closes": wl.probe_closes,
                                          "holds_at_end": holds_model, **wl.meta}
        say(f"throughput workload: {len(wl.events):,} events over {wl.duration_ms / 1000:.0f} s of event time, "
            f"{holds_model} holds open at the end")
        broker.start()
        bootstrap = broker.bootstrap
        assert broker.proc is not None
        broker_pid = broker.proc.pid
        say(f"broker at {bootstrap}")
        tp_topic = make_topics(bootstrap, "tp", args.partitions)["events"]
        res["produce"] = produce_all(bootstrap, tp_topic, wl.events)
        say(f"backlog produced: {res['produce']['events_per_s']:,.0f} ev/s")
        total = len(wl.events)

        if "raw" in phases:
            res["raw_consume"] = raw_consume(bootstrap, tp_topic, total)
            say(f"(1) raw consume: {res['raw_consume']['events_per_s']:,.0f} ev/s")
        if "plain" in phases:
            topics = make_topics(bootstrap, "plain", args.partitions)
            spec = {"bootstrap": bootstrap, "topic": tp_topic, "total": total, "topics": topics, "result": str(work / "plain.json")}
            child = Child("_plain", spec, work / "plain.log")
            rc = child.wait(args.timeout)
            if rc != 0:
                raise RuntimeError("plain consumer failed:\n" + (work / "plain.log").read_text(errors="replace")[-3000:])
            res["plain"] = json.loads((work / "plain.json").read_text())
            say(f"(2) plain consumer: {res['plain']['events_per_s']:,.0f} ev/s, RSS peak {mb(res['plain']['rss_peak'])}, "
                f"outputs {res['plain']['outputs']}")
            if res["plain"]["state"]["holds"] != holds_model:
                res["notes"].append(f"holds at the end: workload model {holds_model}, engine {res['plain']['state']['holds']}")
        holds = holds_model
        if res.get("plain"):
            res["notes"].append(
                f"The plain consumer emitted {res['plain']['outputs'].get('directives', 0)} directive(s) for {wl.probe_closes} probe "
                "closes (the job: one per close): it merges each round's partitions by the messages' timestamps, the job by "
                "the events' wall_ms, so the two can differ by a directive where timestamps tie; a consumer that applied whole "
                "fetches partition by partition would see nodes of the other partitions go stale and abort most rounds.")

        if "spark" in phases or "latency" in phases:
            why = source_ignores_max_offsets()
            if why:
                res["notes"].append(why)
        if "spark" in phases:
            res["spark_throughput"] = []
            for master in [m.strip() for m in args.masters.split(",") if m.strip()]:
                tag = "tp-" + master.replace("[", "").replace("]", "").replace("*", "all")
                say(f"(3a) job {master} over the backlog ...")
                tp = run_spark_tp(args, work, bootstrap, wl.events, master, tag, holds, {"broker": broker_pid})
                res["spark_throughput"].append(tp)
                say(f"(3a) job {master}: sustained {fmt_rate(tp['sustained_events_per_s'])} ev/s after batch 0 "
                    f"({tp['batches']} batches), RSS JVM+workers {mb(tp['jvm_plus_workers_rss_end'])}, state dir "
                    f"{mb(tp['state_dir_bytes'])}, {tp['directives']} directives")

        if "latency" in phases:
            res["latency"] = []
            for rate in rates:
                lw = build_workload(f"latency-{rate:.0f}", args.nodes, rate, seed=args.seed + 1, long_share=args.long_share,
                                    probe_hz=args.probe_hz, duration_s=args.warmup + args.duration)
                res["workloads"][lw.name] = {"events": len(lw.events), "types": lw.types, "heartbeat_ms": lw.heartbeat_ms,
                                             "natural_rate": lw.natural_rate, "probe_closes": lw.probe_closes}
                say(f"(3b) latency at {rate:,.0f} ev/s offered: {len(lw.events):,} events ({lw.natural_rate:,.0f} ev/s of "
                    f"event time, heartbeat {lw.heartbeat_ms} ms)")
                r = run_latency(args, work, bootstrap, lw, f"lat-{rate:.0f}")
                res["latency"].append(r)
                q = r["latency_s"]
                say(f"(3b) {rate:,.0f} ev/s: p50 {q['p50']} p95 {q['p95']} p99 {q['p99']} s over {r['directives_measured']} "
                    f"directives; job {fmt_rate(r['job_sustained_events_per_s'])} ev/s; backlog at end "
                    f"{r['backlog_at_end_of_pacing']}")

        if "profile" in phases:
            prof: dict[str, Any] = {}
            n = min(args.profile_events, len(values))
            say(f"(4) cProfile: core alone and the job's processors run locally, {n:,} events ...")
            prof["plain_core"] = profile_plain(values[:n])
            prof["processors_local"] = profile_processors([(k, v) for _, k, v in wl.events[:n]], args.max_offsets, args.partitions)
            if "spark" in phases:
                say("(4) py-spy over a local[2] run of the job ...")
                out_raw = work / "pyspy.txt"
                t_prof = run_spark_tp(args, work, bootstrap, wl.events[:n], "local[2]", "tp-pyspy", holds,
                                      {"broker": broker_pid}, profile_out=str(out_raw))
                prof["spark_pyspy_run"] = t_prof
                secs = t_prof.get("steady_ms", 0) / 1000 or None
                prof["pyspy"] = parse_pyspy(out_raw, args.profile_rate, secs)
                prof["jfr"] = parse_jfr(Path(str(out_raw) + ".jfr"))
                if out_raw.exists():
                    shutil.copy(out_raw, out_dir / f"bench-{stamp}-pyspy.txt")
                if Path(str(out_raw) + ".jfr").exists():
                    shutil.copy(str(out_raw) + ".jfr", out_dir / f"bench-{stamp}.jfr")
            res["profile"] = prof

        # state per hold: the local[2] throughput run at the end of the backlog
        tps = [t for t in res.get("spark_throughput", []) ]
        t2 = next((t for t in tps if t["master"] == "local[2]"), tps[-1] if tps else None)
        if t2:
            ls = (res.get("plain") or {}).get("state") or {}
            rocks = 0
            for op in t2["state_operators_last"]:
                c = op.get("custom") or {}
                rocks += int(c.get("rocksdbSstFileSize") or 0) + int(op.get("memoryUsedBytes") or 0)
            n_nodes = ls.get("nodes") or args.nodes + 1
            node_b = ls.get("node_bytes", 0)
            empty = len(json.dumps({"nodes": [_empty_node_json()], "gates": {}}))
            res["state"] = {
                "holds": holds,
                "nodes": n_nodes,
                "state_dir_bytes": t2["state_dir_bytes"],
                "state_dir_per_hold": t2["state_dir_bytes"] / holds if holds else 0,
                "rocksdb_bytes": rocks or None,
                "node_bytes": node_b,
                "cluster_bytes": ls.get("cluster_bytes", 0),
                "logical_per_hold": (node_b + ls.get("cluster_bytes", 0)) / holds if holds else 0,
                "per_node_fixed_bytes": empty,
                "rss_per_hold": t2["rss_per_hold"] or 0,
            }
    finally:
        broker.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"kept {work}")
    res["machine"]["loadavg_end"] = _loadavg()
    res["total_s"] = time.monotonic() - t_start
    res["targets"] = evaluate_targets(res)
    if "profile" in res:
        res["profile"]["findings"] = findings(res)
    if res.get("latency"):
        png = out_dir / f"bench-{stamp}-latency.png"
        err = plot_latency(res["latency"], png)
        if err:
            res["notes"].append(err)
        else:
            shutil.copy(png, out_dir / "latency.png")
            res["plot"] = png.name
    md = build_report(res)
    (out_dir / f"bench-{stamp}.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    (out_dir / f"bench-{stamp}.md").write_text(md + "\n", encoding="utf-8")
    print(md)
    say(f"wrote {out_dir / f'bench-{stamp}.json'} and .md")
    return 0


def _empty_node_json() -> dict[str, Any]:
    from safepoint.core.node import NodeState

    ns = NodeState("default", "default-n1000")
    ns.incarnation, ns.seq, ns.mvcc_now, ns.pinned_bytes, ns.last_wall_ms = 0, 123456, 1_700_000_000_000_000, 0, START_MS
    return ns.to_json()


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

