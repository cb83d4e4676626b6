"""The ``etcd`` phase of ``safepoint bench``: the history a real etcd keeps under safepoint against its
own auto-compaction, on a steady write load with one slow reader.

Under safepoint: one etcd member (no auto-compaction), a fresh embedded broker, the job
(``safepoint run``, the cluster counting revisions with a small ``retention``) and
``safepoint agent etcd`` compacting every second. Against it: the same member with
``--auto-compaction-mode periodic --auto-compaction-retention Xs`` and nothing else, for X from
half the reader's length up, until a run in which the reader never failed: the smallest retention
that does not break that reader (etcd 3.4's periodic compactor compacts every X at the revision
of X ago, so a reader as long as D needs X near D, and keeps X to 2X of history).

The load: a writer putting ``--etcd-put-rate`` keys a second (50 keys, rotating) and a reader that
every ``--etcd-reader-every`` seconds lists the keys at one revision, a page of 5 keys at a time,
for ``--etcd-reader-seconds`` (under safepoint it holds that revision with ``RevisionHold``;
against auto-compaction it has nothing to hold with). Sampled every 0.5 s over
``--etcd-window`` seconds: the revisions kept (current minus compacted) and the members'
``dbSizeInUse``. The figure: the mean revisions (and bytes) kept under safepoint divided by the
same under the smallest auto-compaction retention that kept the reader alive, from one run.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench_common import say

from safepoint.connectors.etcd_gateway import EtcdGateway, RevisionCompacted
from safepoint.connectors.etcd_holds import RevisionHold, paginate
from safepoint.devtools.broker import EmbeddedBroker, free_port

__all__ = ["etcd_lines", "etcd_phase"]

CLUSTER = "etcd-bench"
SAFEPOINT = [sys.executable, "-m", "safepoint.cli"]


class Etcd:
    def __init__(self, base: Path, *extra: str) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            msg = "the etcd phase needs Debian's etcd-server (scripts/setup.sh installs it as root)"
            raise RuntimeError(msg)
        base.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        self.endpoint = client
        with (base / "etcd.log").open("ab") as log:
            self.proc = subprocess.Popen([binary, "--name", "m0", "--data-dir", str(base / "data"), "--listen-client-urls",
                                          client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                                          "--initial-advertise-peer-urls", peer, "--initial-cluster", f"m0={peer}",
                                          *extra], stdout=log, stderr=subprocess.STDOUT)
        self.gateway = EtcdGateway(client, timeout_s=2)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.gateway.revision()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        self.gateway.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


class Load:
    """The writer and the slow reader, and the samples, over one window."""

    def __init__(self, etcd: EtcdGateway, rate: float, reader_every_s: float, reader_s: float,
                 hold: dict[str, Any] | None) -> None:
        self.etcd, self.rate, self.reader_every_s, self.reader_s, self.hold = etcd, rate, reader_every_s, reader_s, hold
        self.stop = threading.Event()
        self.puts = 0
        self.reads = 0
        self.failed: list[str] = []

    def write(self) -> None:
        writer = EtcdGateway(self.etcd.endpoints, timeout_s=2)
        start = time.monotonic()
        while not self.stop.is_set():
            writer.put(f"/bench/k{self.puts % 50:02d}", "v" * 200)
            self.puts += 1
            time.sleep(max(0.0, start + self.puts / self.rate - time.monotonic()))
        writer.close()

    def read_once(self, revision: int) -> None:
        deadline = time.monotonic() + self.reader_s
        pages = 0
        while time.monotonic() < deadline and not self.stop.is_set():
            for _page in paginate(self.etcd, "/bench/", revision=revision, page=5):
                pages += 1
                time.sleep(self.reader_s / 12)
                if time.monotonic() >= deadline:
                    break

    def read(self) -> None:
        while not self.stop.wait(0 if self.reads == 0 else self.reader_every_s - self.reader_s):
            try:
                if self.hold is not None:
                    with RevisionHold(**self.hold, endpoints=self.etcd) as h:
                        assert h.revision is not None
                        self.read_once(h.revision)
                else:
                    self.read_once(self.etcd.revision())
            except RevisionCompacted as exc:
                self.failed.append(str(exc))
            self.reads += 1

    def run(self, window_s: float) -> dict[str, Any]:
        threads = [threading.Thread(target=self.write, daemon=True), threading.Thread(target=self.read, daemon=True)]
        for t in threads:
            t.start()
        kept: list[int] = []
        in_use: list[int] = []
        compacted = 0
        start = time.monotonic()
        while time.monotonic() - start < window_s:
            revision = self.etcd.revision()
            compacted = self.etcd.compacted_revision(compacted)
            kept.append(revision - max(compacted, 1))
            in_use.append(self.etcd.status(self.etcd.endpoints[0]).db_size_in_use)
            time.sleep(0.5)
        self.stop.set()
        for t in threads:
            t.join(self.reader_s + 10)
        return {"puts_per_s": round(self.puts / window_s, 1), "reads": self.reads, "reads_failed": len(self.failed),
                "kept_revisions_mean": round(statistics.mean(kept)), "kept_revisions_max": max(kept),
                "db_in_use_bytes_mean": round(statistics.mean(in_use)), "samples": len(kept)}


def under_safepoint(work: Path, args: Any) -> dict[str, Any]:
    broker = EmbeddedBroker(data_dir=str(work / "broker")).start()
    etcd = Etcd(work / "etcd-sp")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        config = work / "safepoint.toml"
        config.write_text(f'trigger_ms = 200\n\n[clusters.{CLUSTER}]\nmvcc_unit = "revision"\nretention = '
                          f"{args.etcd_retention}\n")
        port = free_port()
        with (work / "job.log").open("ab") as log:
            procs.append(subprocess.Popen([*SAFEPOINT, "run", "--bootstrap", broker.bootstrap, "--config", str(config),
                                           "--checkpoint", str(work / "ckpt"), "--http-port", str(port)],
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        import urllib.request

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):  # noqa: S310 - loopback
                    return True
            except OSError:
                return False

        deadline = time.monotonic() + 300
        while not healthy():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                msg = f"the job did not start (log: {work / 'job.log'})"
                raise RuntimeError(msg)
            time.sleep(0.5)
        stats = work / "agent.json"
        with (work / "agent.log").open("ab") as log:
            procs.append(subprocess.Popen([*SAFEPOINT, "agent", "etcd", "--endpoints", etcd.endpoint, "--bootstrap",
                                           broker.bootstrap, "--cluster", CLUSTER, "--compact-every", "1",
                                           "--heartbeat", "0.5", "--stats-file", str(stats)],
                                          stdout=log, stderr=subprocess.STDOUT))
        warm = Load(etcd.gateway, args.etcd_put_rate, 1e9, 0.0, None)
        writer = threading.Thread(target=warm.write, daemon=True)
        writer.start()
        deadline = time.monotonic() + 120
        while not (stats.exists() and json.loads(stats.read_text() or "{}").get("compactions", 0) >= 1):
            if time.monotonic() > deadline:
                msg = f"the agent made no compaction in 120 s (log: {work / 'agent.log'})"
                raise RuntimeError(msg)
            time.sleep(0.5)
        warm.stop.set()
        writer.join(5)
        hold = {"bootstrap": broker.bootstrap, "cluster": CLUSTER, "holder": "bench-reader", "ttl_ms": 30_000,
                "label": "slow list"}
        got = Load(etcd.gateway, args.etcd_put_rate, args.etcd_reader_every, args.etcd_reader_seconds, hold).run(
            args.etcd_window)
        got["compactions"] = json.loads(stats.read_text()).get("compactions")
        return got
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
        etcd.stop()
        broker.stop()


def etcd_phase(work: Path, args: Any) -> dict[str, Any]:
    d = args.etcd_reader_seconds
    say(f"(etcd) under safepoint: {args.etcd_put_rate:.0f} puts/s, a {d:.0f} s list every {args.etcd_reader_every:.0f} s, "
        f"{args.etcd_window:.0f} s window ...")
    sp = under_safepoint(work / "sp", args)
    say(f"(etcd) safepoint: {sp['kept_revisions_mean']:,} revisions kept on average (max {sp['kept_revisions_max']:,}), "
        f"{sp['db_in_use_bytes_mean']:,} B in use; {sp['reads_failed']} of {sp['reads']} lists failed")
    tried: list[dict[str, Any]] = []
    chosen = None
    for x in sorted({max(1, round(d * f)) for f in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)}):
        etcd = Etcd(work / f"etcd-auto-{x}", "--auto-compaction-mode", "periodic", "--auto-compaction-retention", f"{x}s")
        try:
            got = Load(etcd.gateway, args.etcd_put_rate, args.etcd_reader_every, d, None).run(args.etcd_window)
        finally:
            etcd.stop()
        got["retention_s"] = x
        tried.append(got)
        say(f"(etcd) auto-compaction {x} s: {got['kept_revisions_mean']:,} revisions kept on average, "
            f"{got['reads_failed']} of {got['reads']} lists failed")
        if got["reads_failed"] == 0 and got["reads"] >= 2:
            chosen = got
            break
    res: dict[str, Any] = {"safepoint": sp, "auto_compaction": tried,
                           "params": {"put_rate": args.etcd_put_rate, "reader_every_s": args.etcd_reader_every,
                                      "reader_s": d, "window_s": args.etcd_window, "retention": args.etcd_retention}}
    if chosen is not None:
        res["smallest_safe_retention_s"] = chosen["retention_s"]
        res["ratio_revisions"] = round(sp["kept_revisions_mean"] / chosen["kept_revisions_mean"], 3)
        res["ratio_revisions_max"] = round(sp["kept_revisions_max"] / chosen["kept_revisions_max"], 3)
        res["ratio_bytes"] = round(sp["db_in_use_bytes_mean"] / chosen["db_in_use_bytes_mean"], 3)
        say(f"(etcd) history kept, safepoint / auto-compaction {chosen['retention_s']} s (the smallest that kept the "
            f"reader alive): revisions {res['ratio_revisions']} (max {res['ratio_revisions_max']}), "
            f"bytes in use {res['ratio_bytes']}")
    else:
        say("(etcd) no auto-compaction retention tried kept the reader alive")
    return res


def etcd_lines(res: dict[str, Any]) -> list[str]:
    """The phase's table for the report."""
    sp, p = res["safepoint"], res["params"]
    lines = ["## etcd: history kept, safepoint against etcd's own auto-compaction", "",
             f"{p['put_rate']:.0f} puts/s; a {p['reader_s']:.0f} s paginated list every {p['reader_every_s']:.0f} s; "
             f"{p['window_s']:.0f} s sampled every 0.5 s; safepoint's retention {p['retention']} revisions.", "",
             "| compaction | revisions kept (mean) | max | bytes in use (mean) | lists failed |",
             "| --- | --- | --- | --- | --- |",
             f"| safepoint | {sp['kept_revisions_mean']:,} | {sp['kept_revisions_max']:,} | {sp['db_in_use_bytes_mean']:,} | "
             f"{sp['reads_failed']} of {sp['reads']} |"]
    for t in res["auto_compaction"]:
        lines.append(f"| auto {t['retention_s']} s | {t['kept_revisions_mean']:,} | {t['kept_revisions_max']:,} | "
                     f"{t['db_in_use_bytes_mean']:,} | {t['reads_failed']} of {t['reads']} |")
    if "ratio_revisions" in res:
        lines += ["", f"Ratio (safepoint / auto {res['smallest_safe_retention_s']} s, the smallest that kept the reader "
                      f"alive): revisions {res['ratio_revisions']}, max {res['ratio_revisions_max']}, "
                      f"bytes in use {res['ratio_bytes']}."]
    return lines
