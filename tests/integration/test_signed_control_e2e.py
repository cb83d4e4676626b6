"""Only operators steer, through the real broker and the Spark job: with control keys set, the forged
release and pause a node could send (a plain producer on the events topic) are refused with a
critical alert while the operator's hold keeps protecting its ts and the safe point keeps moving
with the nodes; the CLI's signed actions apply and an unsigned one is refused; after a key
rotation (the job restarted with the new key and the old one) the hold set under the old key is
still there and the new key releases it; a holder's hold is released by a stranger only with --force,
which the outcome records; an action through the HTTP surface with a named token is signed by the job's
key and recorded with the token's name; with a node key secret, an event one node signs for another
is refused and alerted while the nodes' own signed beats move the safe point."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.service_hold import ServiceHold
from safepoint.core.signing import node_key, sign_node
from safepoint.devtools.broker import free_port

from kafka_util import read_topic
from tests_support import JOB_START_TIMEOUT_S, JobProcess, answers, get, job_env, job_flags, make_settings, send, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]  # on Apache Kafka (conftest.py)
OLD, NEW = "sp-ctl-old-3f9a1c", "sp-ctl-new-b27e40"


def test_forged_control_is_refused_and_a_rotation_loses_nothing(broker: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "signed", 1, node_lease_ms=60_000, trigger_ms=200)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    ckpt = tmp_path / "ckpt"
    seq = [0]

    node_secret: list[str] = []

    def start_job(keys: str) -> JobProcess:
        job = JobProcess(job_flags(settings, ckpt, http_port=port), tmp_path / "job.log",
                         env={"SAFEPOINT_CONTROL_KEYS": keys,  # secrets: no flag
                              "SAFEPOINT_ADMIN_TOKENS": "alice:tok-alice-91,bob:tok-bob-27",
                              **({"SAFEPOINT_NODE_KEY_SECRET": node_secret[0]} if node_secret else {})})
        wait_for(lambda: answers(base + "/healthz"), JOB_START_TIMEOUT_S, "the job's HTTP surface", job)
        return job

    def signed(ev: dict[str, Any], as_node: str | None = None) -> dict[str, Any]:
        if not node_secret:
            return ev
        key = node_key(node_secret[0], "c1", as_node or ev["node"])
        return {**ev, "sig": sign_node(ev, key)}

    def beat(wall: int, mvcc: int) -> None:
        seq[0] += 1
        send(broker.bootstrap, settings.events_topic, [
            (0, n, signed({"v": 1, "type": "heartbeat", "cluster": "c1", "node": n, "incarnation": 1, "seq": seq[0],
                           "wall_ms": wall, "mvcc_now": mvcc})) for n in ("n1", "n2")])

    def status() -> dict[str, Any]:
        try:
            return get(base + "/api/v1/clusters/c1")
        except OSError:
            return {}

    def cli(key: str | None, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**job_env(), **({"SAFEPOINT_CONTROL_KEYS": key} if key else {})}
        return subprocess.run([sys.executable, "-m", "safepoint.cli", *args, "--bootstrap", broker.bootstrap,
                               "--control-topic", settings.control_topic, "--status-topic", settings.status_topic],
                              capture_output=True, text=True, env=env, timeout=120, check=False)

    w = time.time_ns() // 1_000_000
    job = start_job(OLD)
    try:
        send(broker.bootstrap, settings.events_topic, [
            (0, "c1", {"v": 1, "type": "topology", "cluster": "c1", "version": 1, "wall_ms": w, "nodes": {"n1": [], "n2": []}})])
        beat(w, 1_000)
        wait_for(lambda: status().get("safe_ts") == 1_000, 120, "the first safe point", job)
        held = cli(OLD, "hold", "set", "c1", "backup", "--ts", "1500", "--ttl", "10m", "--label", "nightly backup")
        assert held.returncode == 0, held

        # forgeries: a plain producer on the events topic, as any node may write it (misrouted), and
        # one on the control topic without the key (a holder's credentials, a misconfigured ACL)
        forged = [(0, "c1", {"v": 1, "type": "service_release", "cluster": "c1", "holder": "backup", "wall_ms": w + 10}),
                  (0, "c1", {"v": 1, "type": "pause", "cluster": "c1", "reason": "forged", "wall_ms": w + 11,
                             "sig": "hmac-sha256:" + "0" * 64})]
        send(broker.bootstrap, settings.events_topic, forged)
        send(broker.bootstrap, settings.control_topic, forged)
        beat(w + 1_000, 5_000)
        wait_for(lambda: status().get("cluster_wall_ms") == w + 1_000, 60, "the job to apply the beat", job)
        st = status()
        assert st["safe_ts"] == 1_500 and not st["paused"], st
        assert st["control_ignored"] == {"misrouted": 2, "unsigned": 1, "bad_signature": 1}, st["control_ignored"]
        alerts = [a for a in read_topic(broker.bootstrap, settings.alerts_topic) if a.get("kind") == "control_refused"]
        assert alerts and alerts[0]["severity"] == "critical" and "service_release of backup" in alerts[0]["detail"]

        unsigned = cli(None, "pause", "c1", "--reason", "no key")
        assert unsigned.returncode == 1 and "unsigned" in unsigned.stdout + unsigned.stderr, unsigned
    finally:
        job.stop()

    node_secret.append("sp-node-secret-5d")  # and from now on each node signs its own events
    job = start_job(f"{NEW},{OLD}")  # the rotation: the job takes both, publishers move to the new key
    try:
        wait_for(lambda: any(h["holder"] == "backup" for h in status().get("service_holds", [])), 60,
                 "the hold set under the old key, after the restart", job)
        released = cli(NEW, "hold", "release", "c1", "backup")
        assert released.returncode == 0, released
        # n2 speaks for n1 (a reader of n1's far below, signed with n2's key): refused, and alerted
        seq[0] += 1
        send(broker.bootstrap, settings.events_topic, [
            (0, "n1", signed({"v": 1, "type": "reader_open", "cluster": "c1", "node": "n1", "incarnation": 1,
                              "seq": seq[0], "wall_ms": w + 1_500, "reader_id": "forged", "read_ts": 2_000}, "n2"))])
        beat(w + 2_000, 9_000)
        wait_for(lambda: status().get("safe_ts") == 9_000, 60, "the safe point past the released hold", job)
        refused = [a for a in read_topic(broker.bootstrap, settings.alerts_topic) if a.get("kind") == "node_event_refused"]
        assert refused and refused[0]["node"] == "n1" and refused[0]["severity"] == "critical", refused
        assert any(a["kind"] == "control_refused" for a in status()["alerts"]) is False, "cleared by a signed action"

        # a holder's hold has an owner: a release without its token is refused, an operator's --force applies
        hold = ServiceHold(broker.bootstrap, "c1", "cdc", 9_000, 600_000, label="changefeed", control_key=NEW,
                           control_topic=settings.control_topic, status_topic=settings.status_topic)
        hold.__enter__()
        hold._end_quietly()  # the holder dies: no renewal, no release
        stranger = cli(NEW, "hold", "release", "c1", "cdc")
        assert stranger.returncode == 1 and "not_owner" in stranger.stdout, stranger
        forced = cli(NEW, "hold", "release", "c1", "cdc", "--force")
        assert forced.returncode == 0 and "(forced)" in forced.stdout and "by force" in forced.stdout, forced

        # named admin tokens: the HTTP surface signs with the job's key and records who acted
        req = urllib.request.Request(base + "/api/v1/clusters/c1/pause", data=json.dumps({"reason": "restore"}).encode(),
                                     method="POST", headers={"Authorization": "Bearer tok-bob-27",
                                                             "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback
            aid = json.loads(resp.read())["action_id"]
        wait_for(lambda: any(a["id"] == aid for a in status().get("actions", [])), 60, "the pause's outcome", job)
        [action] = [a for a in status()["actions"] if a["id"] == aid]
        assert (action["outcome"], action["by"]) == ("applied", "bob") and status()["paused"], action
        log_text = (tmp_path / "job.log").read_text()
        assert "admin action by bob: pause of cluster c1" in log_text and "tok-bob-27" not in log_text
        assert OLD not in (tmp_path / "job.log").read_text() and NEW not in (tmp_path / "job.log").read_text()
    finally:
        job.stop()
