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

import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from safepoint.devtools.broker import free_port
from safepoint.devtools.spark_standalone import Standalone

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


def guide_cluster(tmp: Path) -> Standalone:
    """The guide's standalone master and workers (its lines, with free ports for 7077 and 8080)."""
    port, ui = free_port(), free_port()
    env, daemons, _ = guide_block()
    lines = [ln.replace(":7077", f":{port}").replace("--port 7077", f"--port {port}").replace("--webui-port 8080", f"--webui-port {ui}")
             for ln in daemons]
    return Standalone(tmp, lines, port, ui, env)


def test_the_job_on_a_standalone_cluster_survives_losing_a_worker(broker: Any, tmp_path: Path) -> None:
    cluster = guide_cluster(tmp_path)
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
