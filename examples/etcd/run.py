"""safepoint drives a real etcd's compaction: the story in four steps, on this machine.

    .venv/bin/python examples/etcd/run.py            # after ./scripts/setup.sh (it installs etcd)
    .venv/bin/python examples/etcd/run.py --keep-running   # then leaves the dashboard up until Ctrl-C

It starts, on 127.0.0.1 in a temp dir: the embedded broker, the job (``safepoint run`` with
``examples/etcd/safepoint.toml``: cluster ``etcd-main`` counts in revisions), an etcd member without
auto-compaction, ``safepoint agent etcd`` beside it and a writer (about 100 puts a second). Then:

1. **Before**: a second etcd with its own ``--auto-compaction-retention 2s`` and the same writer; a
   slow paginated list (6 s) at the revision it started at fails with "required revision has been
   compacted", as a Kubernetes list or a backup does.
2. **With safepoint**: the same list under ``RevisionHold`` (a service hold of the revision, renewed,
   released on exit) runs to its end while the agent compacts every second up to the held revision.
3. **A holder that dies**: a process takes a hold with a 5 s TTL and is killed; compaction stops at
   its revision until the TTL ends (alert ``service_hold_expired``), then goes on past it.
4. **The dashboard**: a backup's hold set with ``safepoint hold set ... --label "nightly backup"``
   is named by its label in the holds table, beside the compacted revision and the compactions.

Exit 0 when every step did what it says, 1 otherwise (the step that did not is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from safepoint.connectors.etcd_gateway import EtcdGateway, RevisionCompacted
from safepoint.connectors.etcd_holds import RevisionHold, paginate
from safepoint.devtools.broker import EmbeddedBroker
from safepoint.devtools.etcd import LocalEtcd, etcd_missing
from safepoint.devtools.story import answers, finish, get_json, start_job, stop_processes, wait_until

HERE = Path(__file__).resolve().parent
CLUSTER = "etcd-main"
SAFEPOINT = [sys.executable, "-m", "safepoint.cli"]


def say(text: str) -> None:
    print(text, flush=True)


def start_etcd(base: Path, name: str, *extra: str) -> LocalEtcd:
    """One etcd member (Debian's ``etcd``) in ``base/name`` on loopback ports, ``extra`` flags added."""
    if etcd_missing():
        sys.exit(f"{etcd_missing()}")
    return LocalEtcd(base / name, 1, list(extra)).start()


class Writer(threading.Thread):
    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.etcd = EtcdGateway(endpoint, timeout_s=2)
        self.stop_ = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop_.wait(0.01):
            try:
                self.etcd.put(f"/registry/pods/p{i % 40:02d}", f"spec {i}")
                i += 1
            except Exception:  # noqa: S112 - an etcd that stops under the writer at the end
                continue


def slow_list(etcd: EtcdGateway, revision: int, seconds: float = 6.0) -> str | None:
    """A paginated list of /registry/ at ``revision``, a page of 4 keys every 0.6 s; None when it
    ran to its end, else etcd's error."""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for _page in paginate(etcd, "/registry/", revision=revision, page=4):
                time.sleep(0.6)
                if time.monotonic() >= deadline:
                    break
    except RevisionCompacted as exc:
        return str(exc)
    return None




def main() -> int:  # noqa: PLR0915 - one story, step by step
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--http-port", type=int, default=8080, help="the job's status API and dashboard (default 8080)")
    ap.add_argument("--keep-running", action="store_true", help="leave everything up at the end until Ctrl-C")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="safepoint-etcd-example-"))
    procs: list[subprocess.Popen[Any]] = []
    etcds: list[LocalEtcd] = []
    writers: list[Writer] = []
    broker = EmbeddedBroker(data_dir=str(work / "broker")).start()
    kafka = ["--bootstrap", broker.bootstrap]
    base = f"http://127.0.0.1:{args.http_port}"
    failed: list[str] = []

    def check(ok: bool, step: str) -> None:
        say(f"   {'ok' if ok else 'NOT AS EXPECTED'}: {step}")
        if not ok:
            failed.append(step)

    def status() -> dict[str, Any]:
        try:
            return get_json(f"{base}/api/v1/clusters/{CLUSTER}")
        except OSError:
            return {}

    try:
        say(f"work dir {work}; broker at {broker.bootstrap}")
        procs.append(start_job(work, broker.bootstrap, HERE / "safepoint.toml", args.http_port, "--trigger-ms", "200"))
        main_etcd = start_etcd(work, "main")
        etcds.append(main_etcd)
        endpoint = main_etcd.endpoints
        writers.append(Writer(endpoint))
        writers[-1].start()
        say(f"etcd at {endpoint}, writer started; waiting for the job (a Spark session starts: about 30 s) ...")
        wait_until(lambda: answers(f"{base}/healthz"), 240, "the job's HTTP surface")
        agent_log = (work / "agent.log").open("ab")
        procs.append(subprocess.Popen([*SAFEPOINT, "agent", "etcd", "--endpoints", endpoint, *kafka, "--cluster",
                                       CLUSTER, "--compact-every", "1", "--heartbeat", "0.5", "--stats-file",
                                       str(work / "agent.json")], stdout=agent_log, stderr=subprocess.STDOUT))
        wait_until(lambda: bool(status().get("compactions")), 120, "the agent's first compactions in the job's status")
        say(f"the job and the agent run: compacted to revision {status()['compacted_ts']} (logs in {work})")
        etcd = EtcdGateway(endpoint, timeout_s=2)

        say("\n1. Before: etcd's own --auto-compaction-retention 2s, a 6 s paginated list at an old revision")
        auto_etcd = start_etcd(work, "auto", "--auto-compaction-mode", "periodic",
                                              "--auto-compaction-retention", "2s")
        etcds.append(auto_etcd)
        auto_endpoint = auto_etcd.endpoints
        writers.append(Writer(auto_endpoint))
        writers[-1].start()
        auto = EtcdGateway(auto_endpoint, timeout_s=2)
        error = slow_list(auto, auto.revision(), 8.0)
        say(f"   the list: {error or 'ran to its end'}")
        check(error is not None and "compacted" in error, "the list at an old revision broke under auto-compaction")
        auto_etcd.stop()

        say("\n2. With safepoint: the same list under RevisionHold while the agent compacts every second")
        with RevisionHold(broker.bootstrap, CLUSTER, "list-pods", endpoint, ttl_ms=30_000, label="paginated list") as hold:
            assert hold.revision is not None
            before = etcd.compacted_revision()
            error = slow_list(etcd, hold.revision)
            after = etcd.compacted_revision(before)
            say(f"   held revision {hold.revision}; compacted {before} -> {after} meanwhile; the list: "
                f"{error or 'ran to its end'}")
            check(error is None and after <= hold.revision, "the held revision stayed readable")
            check(after > before, "compaction went on meanwhile, up to the held revision")
        wait_until(lambda: etcd.compacted_revision() > hold.revision, 30, "compaction past the released revision")
        say(f"   released: compacted past it, to {etcd.compacted_revision()}")

        say("\n3. A holder that dies: a hold with a 5 s TTL, its process killed")
        holder = subprocess.Popen([sys.executable, "-c", (
            "import sys, time\n"
            "from safepoint.connectors.etcd_holds import RevisionHold\n"
            f"h = RevisionHold({broker.bootstrap!r}, {CLUSTER!r}, 'backup-7', {endpoint!r}, ttl_ms=5_000, "
            "label='backup that dies').__enter__()\n"
            "print(h.revision, flush=True)\n"
            "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None
        dead_rev = int(holder.stdout.readline())
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        killed_at = time.monotonic()
        say(f"   the holder of revision {dead_rev} was killed")
        time.sleep(2)
        check(etcd.compacted_revision() <= dead_rev, "compaction waits at the dead holder's revision meanwhile")
        wait_until(lambda: etcd.compacted_revision() > dead_rev, 60, "compaction past the dead holder's revision")
        say(f"   its TTL ran out: compaction resumed {time.monotonic() - killed_at:.0f} s after the kill, "
            f"to {etcd.compacted_revision()}")

        def expiry_alerted() -> bool:
            return "service_hold_expired" in [a["kind"] for a in status().get("alerts", [])]

        # the directive that let compaction go on is sent as the job's batch makes it; the status that
        # carries the batch's alerts is published when the batch ends, a moment later
        with contextlib.suppress(TimeoutError):
            wait_until(expiry_alerted, 15, "the expired hold's alert in the job's status")
        check(expiry_alerted(), "the job alerted the expired hold (service_hold_expired)")

        say('\n4. The dashboard: safepoint hold set ... --label "nightly backup"')
        rev = etcd.revision()
        subprocess.run([*SAFEPOINT, "hold", "set", CLUSTER, "nightly-backup", "--ts", str(rev), "--ttl", "10m",
                        "--label", "nightly backup", *kafka], check=True, timeout=120)
        try:
            wait_until(lambda: (status().get("blocker") or {}).get("label") == "nightly backup", 60,
                 "the hold to hold the safe point (once the retention's 300 revisions were written above it)")
        except TimeoutError:
            st = status()
            say(f"   status: safe_ts {st.get('safe_ts')}, blocker {st.get('blocker')}, holds {st.get('service_holds')}, "
                f"round {st.get('round')}, revision now {etcd.revision()}")
            raise
        st = status()
        say(f"   {base}/ shows cluster {CLUSTER} in revisions: safe point {st['safe_ts']}, compacted to "
            f"{st['compacted_ts']} ({st['compactions']} compactions), held back by "
            f"{st['blocker']['kind']} {st['blocker']['id']} ({st['blocker']['label']})")
        check(st["blocker"]["label"] == "nightly backup", "the dashboard names the hold by its label")
        return finish(failed, base, args.keep_running)
    finally:
        for w in writers:
            w.stop_.set()
        stop_processes(procs)  # the agent, then the job
        for e in etcds:
            e.stop()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
