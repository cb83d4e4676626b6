"""Driving the throughput workers from the benchmark's main process: each run on its backlog, preloaded."""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from bench_brokers import mark_ends
from bench_common import HERE, PROTO, say
from bench_workload import make_topics, produce_all, read_topic


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
    # the stateful operator's time (allUpdatesTimeMs: its tasks' processing, the Python included),
    # summed over its tasks: what a cluster's events cost in its one task, the capacity model's serial figure
    operator_ms = sum(op.get("allUpdatesTimeMs") or 0 for b in steady for op in b.get("stateOperators") or [])
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
        "operator_us_per_event": operator_ms * 1000 / rows if rows and operator_ms else None,
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


def source_ignores_max_offsets() -> str | None:
    """Whether the job's Python source sees maxOffsetsPerTrigger the way Spark hands options over."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    from safepoint.streaming.kafka_source import KafkaStreamReader

    opts = CaseInsensitiveDict({"bootstrap.servers": "x", "subscribe": "t", "maxOffsetsPerTrigger": "123", "startingOffsets": "latest"})
    reader = KafkaStreamReader(opts)  # type: ignore[arg-type]
    if reader.max_rows == 123 and reader.starting == "latest":
        return None
    return ("BUG (not fixed here): the Python source ignores maxOffsetsPerTrigger and startingOffsets: Spark hands the "
            "options over lower-cased (CaseInsensitiveDict), KafkaStreamReader copies them into a plain dict and looks up "
            "'maxOffsetsPerTrigger' / 'startingOffsets' / 'readTimeoutSeconds' in camel case, so it gets None (no cap: a "
            "backlog is read in one batch) and 'earliest'. The throughput runs' batches are then not the sizes they say.")


def run_spark_tp(args: argparse.Namespace, work: Path, bootstrap: str, events: list[tuple[int, str, bytes]], master: str,
                 tag: str, holds: int, extra_pids: dict[str, int], profile_out: str | None = None,
                 status: bool = True, tree_pids: dict[str, list[int]] | None = None) -> dict[str, Any]:
    topics = make_topics(bootstrap, tag, args.partitions)
    ckpt = work / f"ckpt-{tag}"
    total = len(events)
    spec = {
        "bootstrap": bootstrap, "topics": topics, "checkpoint": str(ckpt), "master": master,
        "shuffle_partitions": args.shuffle_partitions, "max_offsets": args.max_offsets, "trigger_ms": args.trigger_ms,
        "node_buckets": args.node_buckets, "spark_conf": dict(kv.split("=", 1) for kv in args.spark_conf),
        "total": total, "result": str(work / f"{tag}.json"), "extra_pids": extra_pids, "profile_out": profile_out,
        "timeout_s": args.timeout, "profile_rate": args.profile_rate, "status": status, "first_batch": args.first_batch,
        "tree_pids": tree_pids,
        "source_format": getattr(args, "source", "python"),
    }
    # the whole backlog before the job starts, as the plain consumer reads it: nothing else runs
    # on the 2 cores during the job's batches; batch 0 reads --first-batch events (the job's
    # first_batch_max_offsets), the batches after it --max-offsets each
    produce_all(bootstrap, topics["events"], events)
    if getattr(args, "broker", "embedded") == "memory":
        mark_ends(bootstrap, topics["events"], args.partitions)
    child = Child("_spark_tp", spec, work / f"{tag}.log")
    while True:
        msg = child.next(timeout=args.timeout)
        if msg is None or msg["ev"] == "eof":
            break
        if msg["ev"] == "progress":
            say(f"  {tag}: batch {msg['batch']} {msg['rows']} rows in {msg['ms']} ms ({msg['processed']}/{total})")
    rc = child.wait(120)
    if rc != 0 or not (work / f"{tag}.json").exists():
        tail = (work / f"{tag}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"spark run {tag} failed (exit {rc}):\n{tail}")
    res = json.loads((work / f"{tag}.json").read_text())
    out = summarize_tp(res, holds)
    out["status"] = status
    out["source"] = spec["source_format"]
    out["directives"] = sum(1 for v in read_topic(bootstrap, topics["directives"]) if b'"compaction"' in v)
    return out
