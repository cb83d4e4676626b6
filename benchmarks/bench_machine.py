"""Three figures of the machine the benchmark runs on, which bound the job's figures.

- **cores together**: ``safepoint replay``'s core over the workload's first events alone, then
  with a second process spinning on the other core (a Python busy loop), alternating, best of
  two each. Where the two cores share a physical core or its caches (a VM's vCPUs often do), the
  core runs slower while the other is busy, and ``2 * alone / together`` is the most any
  ``local[1] -> local[2]`` scaling can reach here, however well the work is spread.
- **broker rewrite**: what one small write costs the embedded broker once it holds the
  benchmark's backlog: it keeps everything in memory and rewrites a JSON snapshot of all of it
  about a second after a write (its data file is that snapshot). The job writes its outputs every
  micro-batch, so every batch pays one such rewrite on the 2 cores it shares with the broker; a
  Kafka cluster on other machines would not.
- **cores left to the job** (``saturation``, from the runs' own CPU figures): how many cores each
  run kept busy, and how many of them the broker took. What the broker leaves is all a job run can
  use, so at ``local[1]``'s CPU per event the ``local[1] -> local[2]`` scaling is at most
  ``(cores - broker) / (local[1]'s cores besides the broker)``, and the job reaches at most
  ``(cores - broker) / (its CPU per event besides the broker)`` events per second, which the
  plain consumer's figure can be held against.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import cpu_seconds
from bench_fleet import replay_seconds, write_events

__all__ = ["broker_rewrite", "cores_together", "machine_lines", "saturation"]

_SPIN = "while True:\n    pass\n"


def cores_together(values: list[bytes], repeat: int = 2) -> dict[str, Any]:
    """us/event of ``replay_file`` over ``values`` alone and with the other core busy."""
    with tempfile.TemporaryDirectory(prefix="safepoint-cores-") as d:
        path = write_events(values, d)
        alone: list[float] = []
        together: list[float] = []
        for _ in range(repeat):
            alone.append(replay_seconds(path))
            spin = subprocess.Popen([sys.executable, "-c", _SPIN])  # noqa: S603 - our own interpreter
            try:
                time.sleep(0.2)
                together.append(replay_seconds(path))
            finally:
                spin.kill()
                spin.wait()
    n = len(values)
    a, b = min(alone) / n * 1e6, min(together) / n * 1e6
    return {"events": n, "alone_us": a, "together_us": b, "slowdown": b / a, "scaling_ceiling": min(2.0, 2 * a / b)}


def broker_rewrite(bootstrap: str, pid: int, data_dir: str, topic: str, watch_s: float = 3.0) -> dict[str, Any]:
    """The broker's CPU seconds in the ``watch_s`` after one small write, less what it spends idle
    in as long, and the size of its data file."""
    from confluent_kafka import Producer

    def cpu() -> float:
        seconds = cpu_seconds(pid)
        if seconds is None:
            msg = f"the broker (pid {pid}) is gone"
            raise RuntimeError(msg)
        return seconds

    time.sleep(watch_s)  # let a rewrite of earlier writes end
    c0 = cpu()
    time.sleep(watch_s)
    idle = cpu() - c0
    # read while no rewrite runs (a rewrite writes a second copy beside the first)
    size = sum(f.stat().st_size for f in Path(data_dir).rglob("*") if f.is_file())
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    prod.produce(topic, key=b"bench-rewrite", value=b"{}")
    prod.flush(30)
    c1 = cpu()
    time.sleep(watch_s)
    spent = cpu() - c1
    return {"cpu_s": max(spent - idle, 0.0), "idle_cpu_s": idle, "watch_s": watch_s, "data_bytes": size}


def _cores(run: dict[str, Any]) -> tuple[float, float, float] | None:
    """(cores busy in all, cores of the broker, us of CPU per event besides the broker) of a run
    with CPU figures (the job's or the plain consumer's); None without them."""
    cpu, rate = run.get("cpu_us_per_event") or {}, run.get("sustained_events_per_s") or run.get("events_per_s")
    if not cpu or not rate or "broker" not in cpu:
        return None
    total = sum(cpu.values())
    return total * rate / 1e6, cpu["broker"] * rate / 1e6, total - cpu["broker"]


def saturation(res: dict[str, Any]) -> dict[str, Any]:
    """The cores each throughput run kept busy and the bounds they set (module docstring): keys
    ``runs`` (master -> cores, broker cores, us/event besides the broker), ``plain`` (the same for the
    plain consumer), ``scaling_bound`` and ``job_bound_events_per_s`` where their runs were made."""
    cores = float((res.get("machine") or {}).get("cpus") or 2)
    runs = {t["master"]: c for t in res.get("spark_throughput", []) if t.get("status", True) and (c := _cores(t))}
    out: dict[str, Any] = {"cores": cores, "runs": runs, "plain": _cores(res.get("plain") or {})}
    one, two = runs.get("local[1]"), runs.get("local[2]")
    if one and two and one[0] > one[1]:
        out["scaling_bound"] = (cores - two[1]) / (one[0] - one[1])
    if two and two[2] > 0:
        out["job_bound_events_per_s"] = (cores - two[1]) / two[2] * 1e6
    return out


def saturation_lines(res: dict[str, Any]) -> list[str]:
    """The report's paragraph on the cores the runs kept busy."""
    sat = saturation(res)
    if not sat["runs"]:
        return []
    busy = "; ".join(f"{m} {c:.2f} (the broker {b:.2f}; {u:.0f} us of CPU per event besides it)"
                     for m, (c, b, u) in sat["runs"].items())
    L = [f"Cores left to the job: of the {sat['cores']:g} cores, the job's runs kept busy {busy}."]  # noqa: N806
    if sat["plain"]:
        c, b, u = sat["plain"]
        L.append(f"The plain consumer kept {c:.2f} busy (the broker {b:.2f}; {u:.0f} us of CPU per event in its one process).")
    if "scaling_bound" in sat:
        L.append(f"What the broker leaves bounds the local[1] -> local[2] scaling at **{sat['scaling_bound']:.2f}x** at "
                 "local[1]'s CPU per event ((cores - the broker's in local[2]) / local[1]'s cores besides the broker).")
    if "job_bound_events_per_s" in sat:
        L.append(f"At local[2]'s CPU per event, the job reaches at most **{sat['job_bound_events_per_s']:,.0f} ev/s** with "
                 "every core the broker leaves busy.")
    return [" ".join(L), ""]


def machine_lines(res: dict[str, Any]) -> list[str]:
    """The report's paragraph on the machine's three figures."""
    L: list[str] = []  # noqa: N806
    ct = res.get("cores_together")
    if ct:
        L.append(f"Cores together: `safepoint replay`'s core over {ct['events']:,} events takes {ct['alone_us']:.1f} us/event "
                 f"alone and {ct['together_us']:.1f} with the other core spinning ({ct['slowdown']:.2f}x; alternating, best "
                 f"of two each): two busy cores give at most **{ct['scaling_ceiling']:.2f}x** one core's throughput "
                 "here, the ceiling of the local[1] -> local[2] scaling.")
        L.append("")
    br = res.get("broker_rewrite")
    if br:
        L.append(f"Broker rewrite: one small write costs the embedded broker {br['cpu_s']:.2f} CPU-s in the next "
                 f"{br['watch_s']:.0f} s (its idle use subtracted) while it holds {br['data_bytes'] / 1e6:,.0f} MB on disk "
                 "(the backlog and the plain consumer's outputs): it rewrites a snapshot of everything it holds after "
                 "writes. The job writes its outputs every micro-batch, so each batch pays about that on the 2 cores.")
        L.append("")
    return L + saturation_lines(res)
