"""The ``etcd`` phase of ``safepoint bench`` (not run by default): on a steady write load with one slow
reader, the history a real etcd keeps under safepoint against the smallest
``--auto-compaction-retention`` that does not break that reader; a ratio from one run.

The load, the same in every run: a writer putting ``--etcd-put-rate`` keys a second (50 keys in
turn, 200 B values, paced) and a reader that every ``--etcd-reader-every`` seconds (P) lists the
keys at one revision, 5 keys a page, its pages spread over ``--etcd-reader-seconds`` (D). Each run
is sampled every 0.5 s over ``--etcd-window`` seconds: the revisions etcd keeps (the current minus
the compacted revision) and the member's ``dbSizeInUse``.

1. Under safepoint: one etcd member without auto-compaction, an embedded broker, the job
   (``safepoint run``, the cluster counting revisions with a ``retention`` of ``RETENTION``) and
   ``safepoint agent etcd`` compacting at most every second; the reader holds its revision with
   ``RevisionHold`` while it lists. The window starts once the agent has compacted.
2. etcd's own compaction: a fresh member with ``--auto-compaction-mode periodic
   --auto-compaction-retention Xs`` and nothing else, the reader reading at the current revision
   (it has nothing to hold it with), for X from D/2 up; the first X whose reader never failed (at
   least 2 lists) is the smallest retention that does not break it. etcd 3.4's periodic compactor
   samples the revision every X/10 and compacts every X at the revision of X ago, so it keeps X to
   2X of history and a reader as long as D needs X near D. Each window starts once the member has
   compacted.

The figure: safepoint's mean revisions kept over that retention's (and the same for the max and
for the mean bytes in use).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench_common import say

from safepoint.connectors.etcd_gateway import EtcdGateway, RevisionCompacted
from safepoint.connectors.etcd_holds import RevisionHold, paginate
from safepoint.devtools.broker import EmbeddedBroker, free_port
from safepoint.devtools.etcd import LocalEtcd, etcd_missing

__all__ = ["etcd_lines", "etcd_phase"]

CLUSTER = "etcd-bench"
RETENTION = 200
"""The job's retention for the cluster, in revisions (one second of the default writer)."""
KEYS, PAGE, PREFIX, VALUE = 50, 5, "/bench/", "v" * 200
SAMPLE_S = 0.5
FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
"""The auto-compaction retentions tried, in units of the reader's D."""
TOPICS = {"events_topic": "etcd-bench.events", "control_topic": "etcd-bench.control", "directives_topic": "etcd-bench.directives",
          "alerts_topic": "etcd-bench.alerts", "deadletter_topic": "etcd-bench.deadletter",
          "status_topic": "etcd-bench.status"}


def _cli() -> list[str]:
    """``safepoint`` beside this interpreter (the virtualenv's), else the module."""
    script = Path(sys.executable).with_name("safepoint")
    return [str(script)] if script.exists() else [sys.executable, "-m", "safepoint.cli"]


def _env() -> dict[str, str]:
    """The children's environment: no ``SAFEPOINT_*`` of the caller's, Spark on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEPOINT_")}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


def _flags(**flags: Any) -> list[str]:
    return [a for k, v in flags.items() for a in (f"--{k.replace('_', '-')}", str(v))]


def _wait(what: str, ready: Callable[[], bool], timeout_s: float, alive: Callable[[], bool] = lambda: True,
          log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline or not alive():
            tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            why = "exited" if not alive() else f"not within {timeout_s:.0f} s"
            raise RuntimeError(f"{what}: {why} (log {log}):\n{tail}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM, then SIGKILL to the process, its session and every descendant (Spark's JVM and
    Python workers, some of which leave the session)."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        try:
            own_session = os.getpgid(proc.pid) == proc.pid
        except ProcessLookupError:
            own_session = False
        if own_session:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait(30)
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


class Etcd:
    """One etcd member on loopback ports in ``base`` (``safepoint.devtools.etcd``), ``extra`` flags
    added, and a gateway to it."""

    def __init__(self, base: Path, *extra: str) -> None:
        if etcd_missing():
            raise RuntimeError(f"the etcd phase needs etcd: {etcd_missing()}")
        self.local = LocalEtcd(base, 1, list(extra)).start()
        self.endpoint = self.local.endpoints
        self.alive = self.local.members[0].alive
        self.log = base / f"{self.local.members[0].name}.log"
        self.gateway = EtcdGateway(self.endpoint, timeout_s=5)

    def stop(self) -> None:
        self.gateway.close()
        self.local.stop()


class Load:
    """The writer (started first, runs until ``close``), then the slow reader and the samples over
    one window (``measure``)."""

    def __init__(self, endpoint: str, rate: float, every_s: float, list_s: float,
                 hold: dict[str, Any] | None = None) -> None:
        self.endpoint, self.rate, self.every_s, self.list_s, self.hold = endpoint, rate, every_s, list_s, hold
        self.stop = threading.Event()
        self.puts = 0
        self.reads = 0
        self.failed: list[str] = []
        """The lists that hit a compacted revision (``RevisionCompacted``)."""
        self.errors: list[str] = []
        """Anything else that went wrong in the writer or the reader."""
        self.keys_listed: list[int] = []
        self.list_s_taken: list[float] = []
        self.writer: threading.Thread | None = None

    def start_writer(self) -> None:
        with EtcdGateway(self.endpoint, timeout_s=5) as gw:
            for i in range(KEYS):  # every key there before the first list
                gw.put(f"{PREFIX}k{i:02d}", VALUE)
        self.writer = threading.Thread(target=self._write, name="etcd-writer", daemon=True)
        self.writer.start()

    def _write(self) -> None:
        with EtcdGateway(self.endpoint, timeout_s=5) as gw:
            start, n = time.monotonic(), 0
            while not self.stop.is_set():
                try:
                    gw.put(f"{PREFIX}k{n % KEYS:02d}", VALUE)
                    self.puts += 1
                except Exception as exc:
                    self.errors.append(f"put: {exc.__class__.__name__}: {exc}")
                n += 1
                time.sleep(max(0.0, start + n / self.rate - time.monotonic()))

    def _list(self, gw: EtcdGateway, revision: int) -> None:
        """Every key at ``revision``, the pages spread so that the last one is read ``list_s`` after the first."""
        pages = math.ceil(KEYS / PAGE)
        t0 = last = time.monotonic()
        keys = 0
        for i, page in enumerate(paginate(gw, PREFIX, revision=revision, page=PAGE)):
            keys, last = keys + len(page), time.monotonic()
            if i + 1 < pages:
                time.sleep(max(0.0, t0 + (i + 1) * self.list_s / max(1, pages - 1) - time.monotonic()))
        self.keys_listed.append(keys)
        self.list_s_taken.append(round(last - t0, 2))

    def _read(self, start: float, end: float) -> None:
        with EtcdGateway(self.endpoint, timeout_s=5) as gw:
            slot = start
            while slot + self.list_s <= end and not self.stop.wait(max(0.0, slot - time.monotonic())):
                try:
                    if self.hold is not None:
                        with RevisionHold(**self.hold, endpoints=gw) as held:
                            assert held.revision is not None
                            self._list(gw, held.revision)
                    else:
                        self._list(gw, gw.revision())
                except RevisionCompacted as exc:
                    self.failed.append(str(exc))
                except Exception as exc:
                    self.errors.append(f"list: {exc.__class__.__name__}: {exc}")
                self.reads += 1
                slot += self.every_s

    def measure(self, window_s: float) -> dict[str, Any]:
        start = time.monotonic()
        puts0 = self.puts
        reader = threading.Thread(target=self._read, args=(start, start + window_s), name="etcd-reader", daemon=True)
        reader.start()
        kept: list[int] = []
        in_use: list[int] = []
        compacted, compactions, i = 0, 0, 0
        with EtcdGateway(self.endpoint, timeout_s=5) as gw:
            compacted = gw.compacted_revision()
            while time.monotonic() - start < window_s:
                revision = gw.revision()
                now = gw.compacted_revision(compacted)
                compactions += now > compacted
                compacted = now
                kept.append(revision - compacted)
                in_use.append(gw.status(self.endpoint).db_size_in_use)
                i += 1
                time.sleep(max(0.0, start + i * SAMPLE_S - time.monotonic()))
        took = time.monotonic() - start
        puts = self.puts - puts0
        reader.join(self.list_s + 60)
        return {"puts_per_s": round(puts / took, 1), "reads": self.reads, "reads_failed": len(self.failed),
                "failures": self.failed[:3], "errors": self.errors[:5], "keys_listed": self.keys_listed,
                "list_seconds": self.list_s_taken, "kept_revisions_mean": round(statistics.mean(kept)),
                "kept_revisions_max": max(kept), "kept_revisions_min": min(kept),
                "db_in_use_bytes_mean": round(statistics.mean(in_use)), "db_in_use_bytes_max": max(in_use),
                "compactions_seen": compactions, "samples": len(kept), "window_s": round(took, 1)}

    def close(self) -> None:
        self.stop.set()
        if self.writer is not None:
            self.writer.join(10)


def start_job(stack: ExitStack, work: Path, bootstrap: str, config: Path, topics: dict[str, str],
              **flags: Any) -> subprocess.Popen[bytes]:
    """``safepoint run`` on ``bootstrap`` with ``config`` and ``topics`` (its log ``work/job.log``, its
    checkpoint ``work/checkpoint``), stopped when ``stack`` closes; returned once its query runs."""
    port = free_port()
    job_log = work / "job.log"
    with job_log.open("ab") as log:
        job = subprocess.Popen([*_cli(), "run", *_flags(bootstrap=bootstrap, checkpoint=work / "checkpoint", config=config,
                                                          http_port=port, **topics, **flags)],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(),
                               start_new_session=True)
    stack.callback(_stop, job, 120)

    def active() -> bool:
        import json

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:  # noqa: S310 - loopback
                return bool(json.loads(resp.read()).get("job", {}).get("active"))
        except (OSError, ValueError):
            return False

    _wait("the job's query", active, 300, lambda: job.poll() is None, job_log)
    return job


def under_safepoint(work: Path, args: Any) -> dict[str, Any]:
    """The load on an etcd compacted by ``safepoint agent etcd`` from the job's directives."""
    with ExitStack() as stack:
        broker = EmbeddedBroker(data_dir=str(work / "broker")).start()
        stack.callback(broker.stop)
        etcd = Etcd(work / "etcd")
        stack.callback(etcd.stop)
        config = work / "safepoint.toml"
        config.write_text(f'[clusters.{CLUSTER}]\nmvcc_unit = "revision"\nretention = {RETENTION}\n', encoding="utf-8")
        job = start_job(stack, work, broker.bootstrap, config, TOPICS, trigger_ms=200)
        stats, agent_log = work / "agent.json", work / "agent.log"
        with agent_log.open("ab") as log:
            agent = subprocess.Popen([*_cli(), "agent", "etcd", *_flags(
                endpoints=etcd.endpoint, bootstrap=broker.bootstrap, cluster=CLUSTER, events_topic=TOPICS["events_topic"],
                directives_topic=TOPICS["directives_topic"], compact_every=1, heartbeat=0.5, stats_file=stats)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env())
        stack.callback(_stop, agent, 30)

        def agent_stats() -> dict[str, Any]:
            import json

            try:
                got: dict[str, Any] = json.loads(stats.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
            return got

        load = Load(etcd.endpoint, args.etcd_put_rate, args.etcd_reader_every, args.etcd_reader_seconds,
                    {"bootstrap": broker.bootstrap, "cluster": CLUSTER, "holder": "bench-reader", "ttl_ms": 30_000,
                     "label": "bench slow list", "control_topic": TOPICS["control_topic"],
                     "status_topic": TOPICS["status_topic"]})
        stack.callback(load.close)
        load.start_writer()
        _wait("the agent's first compaction", lambda: agent_stats().get("compactions", 0) >= 1, 180,
              lambda: agent.poll() is None and job.poll() is None, agent_log)
        before = agent_stats()
        got = load.measure(args.etcd_window)
        after = agent_stats()
        got["agent_compactions"] = after.get("compactions", 0) - before.get("compactions", 0)
        got["agent_etcd_failures"] = after.get("etcd_failures", 0)
        return got
    raise AssertionError("unreachable")  # ExitStack swallows nothing


def auto_compaction(work: Path, args: Any, retention_s: int) -> dict[str, Any]:
    """The same load on a fresh etcd with its own periodic compaction of ``retention_s`` seconds."""
    with ExitStack() as stack:
        etcd = Etcd(work / f"etcd-auto-{retention_s}s", "--auto-compaction-mode", "periodic",
                    "--auto-compaction-retention", f"{retention_s}s")
        stack.callback(etcd.stop)
        load = Load(etcd.endpoint, args.etcd_put_rate, args.etcd_reader_every, args.etcd_reader_seconds)
        stack.callback(load.close)
        load.start_writer()
        _wait(f"etcd's first compaction ({retention_s} s)", lambda: etcd.gateway.compacted_revision() > 0,
              3 * retention_s + 30, etcd.alive, etcd.log)
        got = load.measure(args.etcd_window)
        got["retention_s"] = retention_s
        return got
    raise AssertionError("unreachable")


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def etcd_phase(work: Path, args: Any) -> dict[str, Any]:
    p, d, w = args.etcd_reader_every, args.etcd_reader_seconds, args.etcd_window
    res: dict[str, Any] = {"params": {"put_rate": args.etcd_put_rate, "reader_every_s": p, "reader_s": d, "window_s": w,
                                      "retention_revisions": RETENTION, "keys": KEYS, "page": PAGE, "value_bytes": len(VALUE),
                                      "sample_s": SAMPLE_S}}
    try:
        say(f"(etcd) under safepoint: {args.etcd_put_rate:.0f} puts/s, a {d:g} s list every {p:g} s, {w:g} s window, "
            f"retention {RETENTION} revisions ...")
        sp = res["safepoint"] = under_safepoint(work / "safepoint", args)
        say(f"(etcd) safepoint: {sp['puts_per_s']:.0f} puts/s; revisions kept mean {sp['kept_revisions_mean']:,} max "
            f"{sp['kept_revisions_max']:,}; {sp['db_in_use_bytes_mean']:,} B in use; {sp['reads_failed']} of {sp['reads']} "
            f"lists failed; {sp['agent_compactions']} compactions")
        tried: list[dict[str, Any]] = res.setdefault("auto_compaction", [])
        for x in sorted({max(1, round(d * f)) for f in FACTORS}):
            say(f"(etcd) auto-compaction periodic {x} s ...")
            got = auto_compaction(work, args, x)
            tried.append(got)
            say(f"(etcd) auto-compaction {x} s: {got['puts_per_s']:.0f} puts/s; revisions kept mean "
                f"{got['kept_revisions_mean']:,} max {got['kept_revisions_max']:,}; {got['db_in_use_bytes_mean']:,} B in use; "
                f"{got['reads_failed']} of {got['reads']} lists failed")
            if got["reads_failed"] == 0 and got["reads"] >= 2 and not got["errors"]:
                res["smallest_safe_retention_s"] = x
                res["ratio_revisions"] = _ratio(sp["kept_revisions_mean"], got["kept_revisions_mean"])
                res["ratio_revisions_max"] = _ratio(sp["kept_revisions_max"], got["kept_revisions_max"])
                res["ratio_bytes"] = _ratio(sp["db_in_use_bytes_mean"], got["db_in_use_bytes_mean"])
                break
        res["failed_retentions"] = [{"retention_s": t["retention_s"], "reads_failed": t["reads_failed"], "reads": t["reads"]}
                                    for t in tried if t["retention_s"] != res.get("smallest_safe_retention_s")]
        if "ratio_revisions" in res:
            say(f"(etcd) history kept, safepoint / auto-compaction {res['smallest_safe_retention_s']} s (the smallest that "
                f"kept the reader alive): revisions {res['ratio_revisions']} (max {res['ratio_revisions_max']}), bytes in "
                f"use {res['ratio_bytes']}")
        else:
            say("(etcd) no auto-compaction retention tried kept the reader alive")
        return res
    finally:
        if not getattr(args, "keep", False):
            shutil.rmtree(work, ignore_errors=True)


def _row(name: str, t: dict[str, Any]) -> str:
    return (f"| {name} | {t['puts_per_s']:.0f} | {t['kept_revisions_mean']:,} | {t['kept_revisions_max']:,} | "
            f"{t['db_in_use_bytes_mean']:,} | {t['reads_failed']} of {t['reads']} |")


def etcd_lines(res: dict[str, Any]) -> list[str]:
    """The phase's section of the report."""
    sp, p = res["safepoint"], res["params"]
    lines = ["## etcd: history kept, safepoint against etcd's own auto-compaction", "",
             f"{p['put_rate']:.0f} puts/s offered ({p['keys']} keys in turn, {p['value_bytes']} B values); a list of every "
             f"key at one revision, {p['page']} a page over {p['reader_s']:g} s, every {p['reader_every_s']:g} s; each run "
             f"sampled every {p['sample_s']:g} s over {p['window_s']:g} s once its etcd had compacted. Safepoint: the job's "
             f"retention {p['retention_revisions']} revisions, the agent compacting at most every second, the list holding "
             "its revision (RevisionHold). etcd's own: `--auto-compaction-mode periodic` with the retentions below, the "
             "list reading at the current revision.", "",
             "| compaction | puts/s | revisions kept (mean) | max | bytes in use (mean) | lists failed |",
             "| --- | ---: | ---: | ---: | ---: | ---: |",
             _row("safepoint", sp)]
    for t in res.get("auto_compaction", []):
        lines.append(_row(f"auto {t['retention_s']} s", t))
    lines.append("")
    if "ratio_revisions" in res:
        lines.append(f"Safepoint / auto-compaction {res['smallest_safe_retention_s']} s (the smallest retention that "
                     f"broke no list): revisions kept **{res['ratio_revisions']}** (max {res['ratio_revisions_max']}), "
                     f"bytes in use **{res['ratio_bytes']}**; from one run.")
    else:
        lines.append("No auto-compaction retention tried broke no list: no ratio.")
    errors = [f"{name}: {'; '.join(t['errors'])}" for name, t in
              [("safepoint", sp), *((f"auto {t['retention_s']} s", t) for t in res.get("auto_compaction", []))] if t["errors"]]
    if errors:
        lines += ["", "Errors (not compaction): " + " | ".join(errors)]
    return lines
