"""A Spark standalone master and workers from the pinned PySpark, on loopback, each in its own
process group: what the operations guide's "Running on a Spark cluster" lines start, for the
tests (``tests/integration/test_spark_cluster.py`` runs the guide's own lines) and the
benchmark's ``--masters standalone[N]`` runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["Standalone", "daemon_lines", "kill_family", "spark_env", "spark_home"]


def spark_home() -> str:
    """The installed ``pyspark`` package directory: Spark's own ``bin/spark-class`` lives there."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def spark_env() -> dict[str, str]:
    """What the guide's ``export`` line sets: Spark from the pinned PySpark, bound to loopback, the
    workers' Python this interpreter."""
    return {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


def daemon_lines(port: int, ui: int, workers: int = 2, cores: int = 1, memory: str = "2g") -> list[str]:
    """The master's and ``workers`` workers' ``spark-class`` lines (the guide's, with these ports)."""
    cls = f"{spark_home()}/bin/spark-class"
    master = f"{cls} org.apache.spark.deploy.master.Master --host 127.0.0.1 --port {port} --webui-port {ui}"
    worker = (f"{cls} org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --cores {cores} --memory {memory} "
              f"spark://127.0.0.1:{port}")
    return [master] + [worker] * workers


def kill_family(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL a process group and every descendant (pyspark daemons leave the group); how many died."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)
    proc.wait(10)
    return len(family)


class Standalone:
    """A master and its workers from ``daemons`` (the master's ``spark-class`` line first), logs and
    work directories under ``tmp``; ``ui`` is the master's web UI port (its JSON tells the workers)."""

    def __init__(self, tmp: Path, daemons: list[str], port: int, ui: int, env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.port, self.ui = port, ui
        self.url = f"spark://127.0.0.1:{port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**(env or spark_env()), "SPARK_LOG_DIR": str(tmp / "logs"), "SPARK_WORKER_DIR": str(tmp / "work")}
        master, *workers = daemons
        if ".Master " not in master or not all(".Worker " in w for w in workers):
            msg = f"not a master's line then workers' lines: {daemons}"
            raise ValueError(msg)
        self.master = self._start("master", master)
        self.workers = [self._start(f"worker{i}", line) for i, line in enumerate(workers)]

    def _start(self, name: str, line: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(["bash", "-c", f"exec {line}"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.env, cwd=self.tmp, start_new_session=True)
        self.procs.append(proc)
        return proc

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as resp:  # noqa: S310 - loopback
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def alive_workers(self) -> int:
        """Workers the master counts alive; 0 while its UI is not up, or still answers its JSON
        route with the HTML page (seen once in CI, a second after the UI had started)."""
        try:
            return int(self.state().get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def wait_workers(self, n: int, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < n:
            if time.monotonic() > deadline:
                msg = f"{n} workers did not register with the master in {timeout_s:.0f} s:\n{self.logs()}"
                raise TimeoutError(msg)
            time.sleep(0.5)

    def kill_worker(self, i: int) -> int:
        """SIGKILL worker ``i`` and everything it started (its executor JVM, their Python workers)."""
        return kill_family(self.workers[i])

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.workers]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_family(proc)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("*.log")))
