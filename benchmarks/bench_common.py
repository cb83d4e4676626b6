"""Shared pieces of the benchmark: constants and targets, log lines, process sampling (RSS, CPU), formatting."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

START_MS = 1_700_000_000_000


PROTO = "@@BENCH "


HERE = Path(__file__).resolve().parent / "bench.py"
"""The benchmark's entry point: worker processes run it again with their mode."""


TARGETS = {
    "throughput_vs_plain": 1.0,
    "throughput_vs_plain_aim": 1.5,
    "p99_latency_s": 0.46,
    "p99_at_rate": 10_000,
    "p99_low_latency_s": 0.46,
    "p99_low_rate": 1_000,
    "cpu_vs_plain": 1.3,
    "batch0_s": 8.0,
    "state_bytes_per_hold": 110,
    "state_bytes_per_hold_clusters": 130,
    "core_vs_json": 0.6,
    "scaling_2_vs_1": 1.5,
    "cpu_growth_10x_nodes": 1.2,
    "rss_bytes": 2 * 1000**3,
}


_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench {time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


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


def cpu_snapshot(pid: int, extra: dict[str, int] | None = None, trees: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """CPU seconds (user+system) per process of the job's tree, keyed by pid, with its role; and
    of each ``extra`` process (a role each), and of each of ``trees``' processes with everything
    under it (a standalone cluster's workers: their executor JVMs and Python workers)."""
    import psutil

    snap: dict[str, Any] = {}

    def take(role: str, procs: list[Any]) -> None:
        for p in procs:
            try:
                t = p.cpu_times()
                snap[str(p.pid)] = [role, t.user + t.system]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue

    for role, procs in proc_tree(pid).items():
        take(role, procs)
    for role, xpid in (extra or {}).items():
        seconds = cpu_seconds(xpid)
        if seconds is not None:
            snap[str(xpid)] = [role, seconds]
    for role, roots in (trees or {}).items():
        for root in roots:
            try:
                take(role, [psutil.Process(root), *psutil.Process(root).children(recursive=True)])
            except psutil.NoSuchProcess:
                continue
    return snap


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None: no such process, or no pid)."""
    import psutil

    if pid is None:
        return None
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(t.user + t.system)


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


def empty_node_bytes() -> int:
    """What a node without holds adds to its bucket's stored value (``streaming/stored.py``), with
    the job's default ``node_buckets``: the state's fixed part per node."""
    from safepoint.core.node import NodeState
    from safepoint.settings import Settings
    from safepoint.streaming.stored import encode_bucket

    ns = NodeState("default", "default-n1000")
    ns.incarnation, ns.seq, ns.mvcc_now, ns.pinned_bytes, ns.last_wall_ms = 0, 123456, 1_700_000_000_000_000, 0, START_MS
    buckets = Settings().node_buckets
    return len(encode_bucket([ns], buckets)) - len(encode_bucket([], buckets))


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def scale_base(res: dict[str, Any]) -> dict[str, Any] | None:
    """The usual-nodes run the scale run is compared with: the one right before it (``scale_base``),
    else the local[2] throughput run with the status on (a result from before that run existed)."""
    return res.get("scale_base") or next(
        (t for t in res.get("spark_throughput", []) if t["master"] == "local[2]" and t.get("status", True)), None)
