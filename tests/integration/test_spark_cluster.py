"""The job on a real Spark standalone cluster, losing a worker in the middle of the stream.

A master and two workers (one core each) start from the pinned PySpark distribution on
127.0.0.1; ``safepoint run --spark-master spark://...`` drives the job from its own process (client
mode: the driver is the command, the executors run on the workers); the checkpoint is on the disk
they share. After two committed batches one worker is killed with SIGKILL, together with the
executor it launched and that executor's Python workers, as if its machine had died. Spark
reschedules the lost tasks on the other executor, which loads the state stores from the
checkpoint. The query must finish the log with the outputs replay computes, every input offset
applied exactly once (the per-offset accounting) and the directives' ``seq`` gap-free.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from safepoint.devtools.broker import free_port

from doc_blocks import ROOT, block
from tests_support import (
    CATCH_UP_TIMEOUT_S,
    JOB_START_TIMEOUT_S,
    JobProcess,
    _ids,
    caught_up,
    job_flags,
    make_settings,
    report,
    send,
    simulated_log,
    topic_ends,
    verify,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


def kill_family(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL a process group and every descendant (pyspark daemons leave the group); how many died."""
    family = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)
    proc.wait(10)
    return len(family)


def guide_block() -> tuple[dict[str, str], list[str], list[str]]:
    """The guide's "Running on a Spark cluster" block: the environment its ``export`` lines give
    (evaluated by bash in the checkout), its ``spark-class`` lines, and its ``safepoint run`` line."""
    lines = block("docs/operations.md", "export SPARK_HOME=").text.strip().splitlines()
    exports = [ln for ln in lines if ln.startswith("export ")]
    daemons = [ln.removesuffix("&").strip() for ln in lines if "/bin/spark-class " in ln]
    [run] = [ln for ln in lines if " run " in ln]
    assert len(exports) + len(daemons) + 1 == len(lines), lines
    out = subprocess.run(["bash", "-c", "\n".join([*exports, "env -0"])], cwd=ROOT, capture_output=True, check=True)
    env = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return env, daemons, shlex.split(run)


class Standalone:
    """The guide's standalone master and workers (its lines, with free ports for 7077 and 8080),
    each in its own process group."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        env, daemons, _ = guide_block()
        self.env = {**env, "SPARK_LOG_DIR": str(tmp / "logs"), "SPARK_WORKER_DIR": str(tmp / "work")}
        master, *workers = [ln.replace(":7077", f":{self.port}").replace("--port 7077", f"--port {self.port}")
                            .replace("--webui-port 8080", f"--webui-port {self.ui}") for ln in daemons]
        assert ".Master " in master and all(".Worker " in w for w in workers), daemons
        self.master = self._start("master", master)
        self.workers = [self._start(f"worker{i}", line) for i, line in enumerate(workers)]

    def _start(self, name: str, line: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(["bash", "-c", f"exec {line}"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=self.env, cwd=ROOT, start_new_session=True)
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

    def kill_worker(self, i: int) -> int:
        """SIGKILL worker ``i`` and everything it started (its executor JVM, their Python workers)."""
        return kill_family(self.workers[i])

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_family(proc)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("*.log")))


def test_the_job_on_a_standalone_cluster_survives_losing_a_worker(broker: Any, tmp_path: Path) -> None:
    cluster = Standalone(tmp_path)
    job: JobProcess | None = None
    try:
        wait_for(lambda: cluster.alive_workers() == 2, 90, "two workers to register with the master")
        settings = make_settings(broker.bootstrap, "standalone", 3, retention=1_000_000, node_lease_ms=3_000,
                                 trigger_ms=200, max_offsets_per_trigger=300)
        log, closing = simulated_log(seed=21, duration_ms=20_000)
        send(broker.bootstrap, settings.events_topic, log)
        ckpt = tmp_path / "ckpt"
        started = time.monotonic()
        _, _, run = guide_block()
        assert run[:2] == [".venv/bin/safepoint", "run"], run
        swap = {"--spark-master": cluster.url, "--bootstrap": broker.bootstrap, "--checkpoint": str(ckpt)}
        assert run[2::2] == list(swap), run
        flags = job_flags(settings, ckpt, **{k[2:].replace("-", "_"): v for k, v in swap.items()})
        job = JobProcess(flags, tmp_path / "job.log")
        wait_for(lambda: len(_ids(ckpt, "commits")) >= 3, JOB_START_TIMEOUT_S, "three committed batches", job)
        running = [a for a in cluster.state().get("activeapps", [])]
        assert len(running) == 1 and running[0]["cores"] == 2, running
        committed_at_kill = len(_ids(ckpt, "commits"))
        killed = cluster.kill_worker(0)
        killed_at = time.monotonic()
        wait_for(lambda: cluster.alive_workers() == 1, 120, "the master to see the worker gone", job)
        for last in (False, True):
            ends = topic_ends(broker.bootstrap, settings.events_topic)
            wait_for(lambda e=ends: caught_up(ckpt, e), CATCH_UP_TIMEOUT_S, "the job to finish the log on one worker", job)
            if not last:
                recovered_s = time.monotonic() - killed_at
                send(broker.bootstrap, settings.events_topic, [closing])
        assert job.alive(), job.tail()
        assert job.stop() == 0, job.tail()
    except BaseException:
        print(cluster.logs())
        if job is not None:
            print(job.tail(80))
        raise
    finally:
        if job is not None and job.alive():
            job.kill9()
        cluster.stop()
    v = verify(broker.bootstrap, settings, ckpt)
    lost = [ln for ln in (tmp_path / "job.log").read_text(errors="replace").splitlines()
            if "Lost executor" in ln or "lost worker" in ln.lower() or "ExecutorLost" in ln]
    assert lost, "the driver saw the executor go"
    final = v.directives["c1"][-1]
    assert final["catalog_floor"] == 1, "the last directive is the closing catalog event's"
    report("standalone", messages=len(log), batches=len(v.replay.batches), committed_at_kill=committed_at_kill,
           killed_processes=killed, catch_up_after_kill_s=round(recovered_s, 1),
           total_s=round(time.monotonic() - started, 1), output_repeats=v.output_repeats,
           accounting_repeats=v.accounting_repeats, directives=len(v.directives["c1"]), lost_lines=len(lost))
