"""The benchmark's latency runs: the workload replayed in real time at a fixed offered rate, each
directive's arrival matched with the send time of the events it answers."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from bench_common import START_MS, cpu_seconds, percentile, say
from bench_runs import Child
from bench_workload import Workload, kafka_base, make_topics, open_holds, producer, record_headers


class DirectiveWatch(threading.Thread):
    """Records every compaction directive's arrival time (monotonic clock) and body.

    It reads with the project's own reader (``connectors/kafka/follow.py``) in rounds of 20 ms: a
    consumer that fetched again at once after each directive kept the embedded broker and itself
    busy (it answers a fetch at once), taking CPU from the job it measures; a round costs an
    end-offset request per partition, and an arrival is seen 20 ms late at most."""

    ROUND_S = 0.02

    def __init__(self, bootstrap: str, topic: str) -> None:
        from safepoint.connectors.kafka.follow import TopicFollower

        super().__init__(daemon=True, name="bench-directives")
        self.follower = TopicFollower(kafka_base(bootstrap), topic, "beginning", idle_s=self.ROUND_S,
                                      client_id="bench-directives")
        self.follower.open()
        self.got: list[tuple[float, dict[str, Any]]] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.is_set():
            msgs = self.follower.poll(0.1, max_messages=1000)
            t = time.monotonic()
            for m in msgs:
                d = json.loads(m.value())
                if d.get("type") == "compaction":
                    self.got.append((t, d))
        self.follower.close()

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(10)


def run_latency(args: argparse.Namespace, work: Path, bootstrap: str, wl: Workload, tag: str,
                broker_pid: int | None = None) -> dict[str, Any]:
    topics = make_topics(bootstrap, tag, args.partitions)
    watch = DirectiveWatch(bootstrap, topics["directives"])
    watch.start()
    spec = {
        "bootstrap": bootstrap, "topics": topics, "checkpoint": str(work / f"ckpt-{tag}"), "master": args.latency_master,
        "shuffle_partitions": args.shuffle_partitions, "max_offsets": args.max_offsets, "trigger_ms": args.trigger_ms,
        "node_buckets": args.node_buckets, "spark_conf": dict(kv.split("=", 1) for kv in args.spark_conf),
        "source_format": getattr(args, "source", "python"),
        "status": getattr(args, "latency_status", "on") == "on",
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
    ticks: list[tuple[int, list[tuple[str, bytes, Any]]]] = []
    for wall, key, value in wl.events:
        if not ticks or ticks[-1][0] != wall:
            ticks.append((wall, []))
        ticks[-1][1].append((key, value, record_headers(value)))  # as a node client sends it
    warm_end = START_MS + int(args.warmup * 1000)
    warm = [t for t in ticks if t[0] < warm_end]
    paced = [t for t in ticks if t[0] >= warm_end]
    prod = producer(bootstrap, linger_ms=5)
    sent_at: dict[int, float] = {}
    n_sent = 0

    def burst(tick: tuple[int, list[tuple[str, bytes, Any]]]) -> None:
        nonlocal n_sent
        wall, evs = tick
        sent_at.setdefault(wall, time.monotonic())
        for key, value, headers in evs:
            while True:
                try:
                    prod.produce(topics["events"], key=key, value=value, headers=headers)
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
    cpu0 = cpu_seconds(broker_pid), cpu_seconds(os.getpid())
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
    # the cores the broker and this process (the load generator) took while pacing: what the job did not have
    cores_taken = {role: (after - before) / paced_s if paced_s and after is not None and before is not None else None
                   for role, before, after in (("broker", cpu0[0], cpu_seconds(broker_pid)), ("load", cpu0[1], cpu_seconds(os.getpid())))}
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
        for _, v, _headers in evs:
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
        "source": getattr(args, "source", "python"),
        "master": args.latency_master,
        "offered_rate_target": wl.offered_rate,
        "offered_rate_actual": sum(len(t[1]) for t in paced) / paced_s if paced_s else None,
        "producer_lag_max_s": lag_max,
        "cores_taken_while_pacing": cores_taken,
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
        # where a steady batch's time goes: each of Spark's durationMs parts, its median over the batches
        "job_batch_phase_ms_p50": {k: percentile([(b["durationMs"] or {}).get(k, 0) for b in steady], 50)
                                   for k in sorted({k for b in steady for k in (b["durationMs"] or {})})},
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
