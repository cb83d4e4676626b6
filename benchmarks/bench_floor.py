"""Spark's own floor for the job's plan (``--phases floor``, not in the default run; about a minute):
what a micro-batch of the job's shape costs with nothing of safepoint's in it.

Spark's ``rate`` source at ``--rate``'s first figure (rows/s), every row of one key, a Python
``transformWithState`` that reads and writes one ``ValueState`` per batch and returns one row, a
``noop`` sink, in a fresh session with the job's settings (RocksDB with changelog checkpointing,
its shuffle partitions, its trigger; ``bench_workers.worker_spark_floor``). Each batch's time and
phases over ``--duration`` seconds after a warm-up: a batch of the job costs at least this, and an
event's p99 to its directive is at least about two of them (the batch running when it arrives,
then its own) wherever the batches run back to back.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from bench_common import percentile, say
from bench_runs import Child

__all__ = ["floor_lines", "floor_phase"]


def floor_phase(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    rate = int(float(args.rate.split(",")[0]))
    out = work / "floor.json"
    spec = {
        "bootstrap": "127.0.0.1:9", "topics": {k: f"floor.{k}" for k in ("events", "control", "directives", "alerts",
                                                                         "deadletter", "status")},
        "checkpoint": str(work / "ckpt-floor"), "master": args.latency_master, "shuffle_partitions": args.shuffle_partitions,
        "max_offsets": args.max_offsets, "trigger_ms": args.trigger_ms, "node_buckets": args.node_buckets,
        "spark_conf": dict(kv.split("=", 1) for kv in args.spark_conf), "rate": rate, "warmup_s": 15.0,
        "seconds": float(args.duration), "result": str(out),
    }
    say(f"(floor) Spark's rate source at {rate:,} rows/s, one key, a one-ValueState Python transformWithState, "
        f"noop sink, {args.duration:.0f} s ...")
    child = Child("_spark_floor", spec, work / "floor.log")
    rc = child.wait(spec["warmup_s"] + spec["seconds"] + 180)
    if rc != 0 or not out.exists():
        return {"error": f"the floor run exited with {rc}: {(work / 'floor.log').read_text()[-2000:]}"}
    batches = json.loads(out.read_text())["batches"]
    trig = [float((b["durationMs"] or {}).get("triggerExecution", 0)) for b in batches]
    phases: dict[str, list[float]] = {}
    for b in batches:
        for k, v in (b["durationMs"] or {}).items():
            phases.setdefault(k, []).append(float(v))
    ops = [(b["stateOperators"] or [{}])[0] for b in batches]
    res = {
        "rate": rate, "master": args.latency_master, "trigger_ms": args.trigger_ms, "batches": len(batches),
        "rows_p50": percentile([float(b["numInputRows"] or 0) for b in batches], 50),
        "batch_ms": {p: percentile(trig, p) for p in (50, 90, 99)},
        "phase_ms_p50": {k: percentile(v, 50) for k, v in sorted(phases.items())},
        "operator_ms_p50": percentile([float(o.get("allUpdatesTimeMs") or 0) for o in ops], 50),
        "commit_ms_p50": percentile([float(o.get("commitTimeMs") or 0) for o in ops], 50),
    }
    say(f"(floor) {len(batches)} batches of {res['rows_p50']:,.0f} rows (p50): p50 {res['batch_ms'][50]:.0f} ms, "
        f"p99 {res['batch_ms'][99]:.0f} ms")
    return res


def floor_lines(floor: dict[str, Any], latency: list[dict[str, Any]] | None = None) -> list[str]:
    """The report's section, with the latency runs' own batches beside it where the run has them."""
    if "error" in floor:
        return ["## Spark's floor", "", floor["error"]]
    b, ph = floor["batch_ms"], floor["phase_ms_p50"]
    phases = ", ".join(f"{k} {v:.0f}" for k, v in Counter(ph).most_common() if k != "triggerExecution" and v)
    lines = [
        "## Spark's floor for the job's plan",
        "",
        f"Spark's `rate` source at {floor['rate']:,} rows/s, one key, a Python `transformWithState` reading and "
        f"writing one `ValueState` per batch, a `noop` sink; the job's settings, {floor['master']}, trigger "
        f"{floor['trigger_ms']} ms: {floor['batches']} batches of {floor['rows_p50']:,.0f} rows (p50) took "
        f"**{b[50]:.0f} ms** p50, {b[90]:.0f} p90, {b[99]:.0f} p99 (phases p50, ms: {phases}; the operator's "
        f"allUpdatesTimeMs {floor['operator_ms_p50']:.0f}, its commit {floor['commit_ms_p50']:.0f}). An event waits "
        "for the batch running when it arrives, then its own: about two batches at p99 where they run back to back.",
    ]
    for lat in latency or []:
        lines.append(f"- the job at {lat['offered_rate_target']:,.0f} ev/s: batches of {lat['job_batch_rows_p50']:,.0f} "
                     f"rows took {lat['job_batch_ms_p50']:.0f} ms (p50), {lat['job_batch_ms_p50'] / b[50]:.2f}x the floor")
    return lines
