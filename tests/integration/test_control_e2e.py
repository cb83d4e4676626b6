"""Steering the safe point through the real broker and the Spark job: a backup's ``ServiceHold``
keeps the safe point at its ``ts`` while the nodes advance and its release lets it go; a pause
issued with the CLI holds the safe point and a resume releases it; a changefeed's hold set over
HTTP (bearer token) expires after its TTL with an alert; ``hold list`` shows it meanwhile; a
Reporter whose reader_close is lost is healed by a snapshot request; and the job's outputs equal
replay's for the whole log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.connectors.service_hold import HoldRefused, ServiceHold
from safepoint.devtools.broker import free_port

from doc_blocks import block
from kafka_util import read_topic
from tests_support import (
    JOB_START_TIMEOUT_S,
    JobProcess,
    answers,
    caught_up,
    get,
    job_env,
    job_flags,
    make_settings,
    noisy_lines,
    send,
    topic_ends,
    verify,
    wait_for,
)

pytestmark = pytest.mark.integration
TOKEN = "e2e-admin-token"


def post(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",  # noqa: S310 - loopback
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback
        return resp.status, json.loads(resp.read())


class Nodes:
    """Two nodes of c1 heartbeating on partition 0, their clock moved by the test."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic, self.seq = bootstrap, topic, 0

    def beat(self, wall: int, mvcc: int) -> None:
        self.seq += 1
        send(self.bootstrap, self.topic, [
            (0, n, {"v": 1, "type": "heartbeat", "cluster": "c1", "node": n, "incarnation": 1, "seq": self.seq,
                    "wall_ms": wall, "mvcc_now": mvcc}) for n in ("n1", "n2")])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "safepoint.cli", *args], capture_output=True, text=True, env=job_env(),
                          timeout=60, check=False)


def test_service_holds_pause_and_ttl_through_the_job(broker: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "control", 1, node_lease_ms=60_000, trigger_ms=200, leak_window_ms=2_000)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ckpt = tmp_path / "ckpt"
    job = JobProcess(job_flags(settings, ckpt, http_port=port, leak_window_ms=settings.leak_window_ms), tmp_path / "job.log",
                     env={"SAFEPOINT_ADMIN_TOKEN": TOKEN})  # a secret: no flag (a flag shows in the process list)
    kafka = ["--bootstrap", broker.bootstrap, "--control-topic", settings.control_topic, "--status-topic",
             settings.status_topic]

    def directives() -> list[dict[str, Any]]:
        return [d for d in read_topic(broker.bootstrap, settings.directives_topic, timeout_s=2)
                if d.get("type") == "compaction"]

    def status() -> dict[str, Any]:
        try:
            return get(base + "/api/v1/clusters/c1")
        except OSError:
            return {}

    def reaches(safe_ts: int) -> dict[str, Any]:
        """The newest directive, once it has ``safe_ts`` (the status and the directive of one batch
        are on two topics: either may be readable first)."""
        wait_for(lambda: directives()[-1]["safe_ts"] == safe_ts, 30, f"a directive with safe_ts {safe_ts}", job,
                 every_s=0.3)
        return directives()[-1]

    def settled(wall: int) -> None:
        """The job has applied everything up to the nodes' beat at ``wall``."""
        wait_for(lambda: status().get("cluster_wall_ms") == wall, 120, f"the job to apply the beat at {wall}", job,
                 every_s=0.3)

    try:
        wait_for(lambda: answers(base + "/healthz"), JOB_START_TIMEOUT_S, "the job's HTTP surface", job)
        w = time.time_ns() // 1_000_000  # event time near now: service holds carry the publisher's clock
        send(broker.bootstrap, settings.events_topic, [
            (0, "c1", {"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": w, "nodes": {"n1": [], "n2": []}})])
        nodes = Nodes(broker.bootstrap, settings.events_topic)
        nodes.beat(w, 1_000)
        settled(w)
        reaches(1_000)

        # 1. the README's backup example: the hold keeps the safe point at its ts while the nodes
        #    advance, and its release (on exit) lets it go
        def run_the_backup() -> None:
            nodes.beat(w + 1_000, 2_000)
            nodes.beat(w + 2_000, 3_000)
            settled(w + 2_000)
            d = reaches(1_500)
            assert d["safe_ts"] == 1_500 and d["blocker"]["kind"] == "service" and d["blocker"]["id"] == "backup-nightly"
            st = status()
            assert [h["holder"] for h in st["service_holds"]] == ["backup-nightly"]
            assert st["holds"][0]["kind"] == "service" and st["holds"][0]["id"] == "backup-nightly"

        example = block("README.md", "from safepoint.connectors.service_hold import ServiceHold").text
        code = example.replace('"kafka:9092"', repr(broker.bootstrap)).replace(
            "ttl_ms=600_000)", f"ttl_ms=600_000, control_topic={settings.control_topic!r}, "
                               f"status_topic={settings.status_topic!r})")
        assert settings.control_topic in code
        exec(compile(code, "README.md", "exec"),  # noqa: S102 - the README's block, only the address and topic replaced
             {"__name__": "readme", "snapshot_ts": 1_500, "run_the_backup": run_the_backup})
        nodes.beat(w + 3_000, 4_000)
        settled(w + 3_000)
        reaches(4_000)  # released: the safe point moves on

        # 2. pause with the CLI: the safe point holds; resume releases it
        proc = cli("pause", "c1", "--reason", "restore of orders", *kafka)
        assert proc.returncode == 0, proc.stderr
        assert "pause applied: paused: restore of orders" in proc.stdout, proc.stdout  # the job's outcome, waited for
        wait_for(lambda: status().get("paused") is True, 60, "the pause to be applied", job)
        nodes.beat(w + 4_000, 5_000)
        settled(w + 4_000)
        assert directives()[-1]["safe_ts"] == 4_000, "paused: no directive advances"
        assert status()["pause"]["reason"] == "restore of orders"
        proc = cli("resume", "c1", *kafka)
        assert proc.returncode == 0 and "resume applied" in proc.stdout, (proc.stdout, proc.stderr)
        wait_for(lambda: directives()[-1]["safe_ts"] == 5_000, 60, "the resume to release the safe point", job)
        refused = cli("hold", "set", "c1", "late", "--ts", "10", "--ttl", "1m", *kafka)  # below the safe point
        assert refused.returncode == 1 and "service_hold refused (below_safe_ts)" in refused.stdout, refused
        with pytest.raises(HoldRefused):
            ServiceHold(broker.bootstrap, "c1", "late-backup", ts=10, ttl_ms=60_000, control_topic=settings.control_topic,
                        status_topic=settings.status_topic).__enter__()

        # 3. a changefeed's hold over HTTP (bearer token) with a 3 s TTL: held, listed, then expired with an alert
        code, body = post(base + "/api/v1/clusters/c1/service-holds/cdc-7", {"ts": 5_500, "ttl_ms": 3_000,
                                                                             "label": "changefeed 7"})
        assert code == 202
        wait_for(lambda: [h["holder"] for h in status().get("service_holds", [])] == ["cdc-7"], 60, "the cdc hold", job)
        set_at = status()["service_holds"][0]["expires_after_ms"] - 3_000  # its TTL runs on cluster time from here
        listed = cli("hold", "list", "c1", "--json", *kafka)
        assert listed.returncode == 0, listed.stderr
        assert [h["holder"] for h in json.loads(listed.stdout)["service_holds"]] == ["cdc-7"]
        nodes.beat(set_at + 1_000, 6_000)
        settled(set_at + 1_000)
        reaches(5_500)
        nodes.beat(set_at + 3_001, 7_000)  # cluster time passes the renewal's wall_ms + ttl_ms
        settled(set_at + 3_001)
        reaches(7_000)
        alerts = read_topic(broker.bootstrap, settings.alerts_topic, timeout_s=5)
        [expired] = [a for a in alerts if a["kind"] == "service_hold_expired"]
        assert "cdc-7 (changefeed 7)" in expired["detail"]
        outcome = get(base + body["outcome"])  # the HTTP action's outcome, by its id
        assert outcome["id"] == body["action_id"] and outcome["outcome"] == "expired" and outcome["reason"] == "ttl"
        assert {a["kind"] for a in alerts} >= {"paused", "service_hold_expired"}

        # 4. a leaked hold: a Reporter's reader_close is lost on the way; the heartbeats' counts
        #    show it, the job asks for a snapshot, the listener answers, and the hold is gone
        rep = Reporter(broker.bootstrap, "r1", cluster="c2", mvcc_clock=lambda: time.time_ns() // 1_000,
                       topic=settings.events_topic)
        listener = DirectiveListener(broker.bootstrap, "c2", topic=settings.directives_topic, reporter=rep).start()
        try:
            sender = rep._sender
            real_send = sender.send

            def lossy(event_type: str, fields: dict[str, Any]) -> int:
                return sender.seq if event_type == "reader_close" else real_send(event_type, fields)

            sender.send = lossy  # type: ignore[method-assign]
            with rep.reader(read_ts=time.time_ns() // 1_000 - 5_000_000, label="lost-close"):
                pass
            sender.send = real_send  # type: ignore[method-assign]

            def r1_open() -> int | None:
                st = get(base + "/api/v1/clusters/c2") if "c2" in [c["cluster"] for c in get(base + "/api/v1/clusters")["clusters"]] else None
                nodes = {n["node"]: n for n in (st or {}).get("nodes", [])}
                return nodes["r1"]["open"]["reader"] if "r1" in nodes and nodes["r1"].get("open") else None

            wait_for(lambda: r1_open() == 1, 60, "the job to hold the reader whose close was lost", job)
            wait_for(lambda: r1_open() == 0, 60, "the leak to be healed by the snapshot", job, every_s=0.5)
            kinds = [(a["kind"], a["state"]) for a in read_topic(broker.bootstrap, settings.alerts_topic, timeout_s=5)
                     if a["cluster"] == "c2"]
            assert kinds == [("leaked_hold", "raised"), ("leaked_hold", "cleared")], kinds
            requests = [d for d in read_topic(broker.bootstrap, settings.directives_topic, timeout_s=2)
                        if d.get("type") == "snapshot_request" and d["cluster"] == "c2"]
            assert requests and requests[0]["reason"] == "leaked_hold" and requests[0]["key"] == "c2/r1"
        finally:
            listener.close()
            rep.close()
        ends = topic_ends(broker.bootstrap, settings.events_topic)
        wait_for(lambda: caught_up(ckpt, ends), 120, "the job to finish the log", job)
    except BaseException:
        print(job.tail(80))
        raise
    finally:
        assert job.stop() == 0, job.tail()
    quiet = noisy_lines((tmp_path / "job.log").read_text(errors="replace"))
    assert quiet == [], f"Spark's noise in the job's log: {quiet[:5]}"
    v = verify(broker.bootstrap, settings, ckpt)
    assert v.directives["c1"][-1]["safe_ts"] == 7_000
