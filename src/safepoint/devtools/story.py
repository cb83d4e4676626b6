"""What the examples' stories share: the job's HTTP surface on loopback (a JSON answer, whether it
answers; one cluster's status and holds and an agent's counters, ``ClusterStory``), waiting with a
deadline that says what was waited for, the end of a story (its verdict, ``--keep-running``) and
stopping what it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ClusterStory", "answers", "finish", "get_json", "start_job", "stop_processes", "wait_until"]


def get_json(url: str) -> Any:
    """GET a loopback URL, its JSON decoded."""
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


def answers(url: str) -> bool:
    """Whether ``url`` answers with a success."""
    try:
        with urllib.request.urlopen(url, timeout=5):  # noqa: S310 - loopback
            return True
    except OSError:
        return False


class ClusterStory:
    """A story's checks against one cluster of a running job (``base``: its HTTP surface) and the
    counters its agent writes to ``work/agent.json``: each check says ok or NOT AS EXPECTED, and the
    failed ones are kept for ``finish``."""

    def __init__(self, base: str, work: Path, cluster: str) -> None:
        self.base, self.work, self.cluster = base, work, cluster
        self.failed: list[str] = []

    def check(self, ok: bool, step: str) -> None:
        print(f"   {'ok' if ok else 'NOT AS EXPECTED'}: {step}", flush=True)
        if not ok:
            self.failed.append(step)

    def status(self) -> dict[str, Any]:
        try:
            st: dict[str, Any] = get_json(f"{self.base}/api/v1/clusters/{self.cluster}")
            return st
        except OSError:
            return {}

    def holds(self) -> list[dict[str, Any]]:
        try:
            return [h for h in get_json(f"{self.base}/api/v1/clusters/{self.cluster}/holds")["holds"] if h["id"]]
        except (OSError, KeyError):
            return []

    def node(self, name: str) -> dict[str, Any]:
        try:
            return next(n for n in get_json(f"{self.base}/api/v1/clusters/{self.cluster}/nodes")["nodes"]
                        if n["node"] == name)
        except (OSError, KeyError, StopIteration):
            return {}

    def agent_stats(self) -> dict[str, Any]:
        try:
            stats: dict[str, Any] = json.loads((self.work / "agent.json").read_text())
            return stats
        except (OSError, ValueError):
            return {}


def wait_until(cond: Callable[[], Any], seconds: float, what: str, every_s: float = 0.2) -> None:
    """Return once ``cond()`` is true; ``TimeoutError`` naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            msg = f"waited {seconds:.0f} s for {what}"
            raise TimeoutError(msg)
        time.sleep(every_s)


def finish(failed: list[str], base: str, keep_running: bool) -> int:
    """Say the story's verdict; with ``keep_running``, leave the dashboard up until Ctrl-C or SIGTERM.
    The exit code: 0 when every step did what it says."""
    code = 1 if failed else 0
    print(f"\n{'every step did what it says' if not failed else 'NOT AS EXPECTED: ' + '; '.join(failed)}", flush=True)
    if keep_running:
        print(f"dashboard: {base}/  (Ctrl-C stops everything)", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(code))
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return code


def start_job(work: Path, bootstrap: str, config: Path, port: int, *flags: str) -> subprocess.Popen[bytes]:
    """``safepoint run`` as an example starts it: ``config``, its checkpoint in ``work/ckpt``, its log
    ``work/job.log``, its HTTP surface on ``port``, in a process group of its own (``stop_processes``
    stops its JVM with it)."""
    return subprocess.Popen([sys.executable, "-m", "safepoint.cli", "run", "--bootstrap", bootstrap, "--config", str(config),
                             "--checkpoint", str(work / "ckpt"), "--http-port", str(port), *flags],
                            stdout=(work / "job.log").open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def stop_processes(procs: list[subprocess.Popen[Any]]) -> None:
    """Stop what the story started, the last first; the first is the job, in a process group of its
    own (its JVM stops with it)."""
    for p in reversed(procs):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM) if p is procs[0] else p.terminate()
                p.wait(60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                p.kill()
