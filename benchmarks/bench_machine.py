"""Two figures of the machine the benchmark runs on, which bound the job's figures.

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

__all__ = ["broker_rewrite", "cores_together", "machine_lines"]

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


def machine_lines(res: dict[str, Any]) -> list[str]:
    """The report's paragraph on the machine's two figures."""
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
    return L
