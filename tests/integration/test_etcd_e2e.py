"""safepoint drives a real etcd's compaction, end to end: Debian's etcd (three members on loopback),
the broker, the Spark job (the cluster's policy in revisions, from a ``[clusters.NAME]`` table) and
``safepoint agent etcd`` as processes, a writer going all along.

While compactions run every second, a paginated list at a revision held with ``RevisionHold``
never fails, not while the leader is killed and restarted, nor while the agent itself restarts, nor
when a stale directive that would compact everything arrives; a revision held with the CLI
(``safepoint hold set``) likewise; a hold below what etcd compacted is refused with the reason; and
once released, each held revision is compacted a few intervals later. Also: the agent refuses to
start beside etcd's own auto-compaction."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from safepoint.connectors.etcd_gateway import EtcdGateway, EtcdUnavailable, RevisionCompacted
from safepoint.connectors.etcd_holds import RevisionHold, paginate
from safepoint.devtools.broker import free_port

from doc_blocks import block
from etcd_util import EtcdCluster, _needs_etcd  # noqa: F401 - the module's tests need etcd
from tests_support import JOB_START_TIMEOUT_S, JobProcess, answers, get, job_env, job_flags, make_settings, wait_for

pytestmark = pytest.mark.integration
CLUSTER = "etcd-main"


def agent_cmd(endpoints: str, bootstrap: str, settings: Any, state: Path, *extra: str) -> list[str]:
    """The guide's command (docs/etcd.md), with this test's etcd, broker, topics and pace."""
    argv = shlex.split(block("docs/etcd.md", ".venv/bin/safepoint agent etcd").text)
    mine = {"--endpoints": endpoints, "--bootstrap": bootstrap, "--cluster": CLUSTER, "--state-dir": str(state)}
    assert argv[:3] == [".venv/bin/safepoint", "agent", "etcd"] and set(argv[3::2]) == set(mine), argv
    argv = [a if argv[i - 1] not in mine else mine[argv[i - 1]] for i, a in enumerate(argv)]
    return [sys.executable, "-m", "safepoint.cli", *argv[1:], "--events-topic", settings.events_topic,
            "--directives-topic", settings.directives_topic, "--compact-every", "1", "--heartbeat", "0.3",
            "--stats-file", str(state / "stats.json"), "--timeout", "2", *extra]


class Agent:
    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd, self.log = cmd, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=job_env())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def stats(self) -> dict[str, Any]:
        path = Path(self.cmd[self.cmd.index("--stats-file") + 1])
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


class Writer(threading.Thread):
    """Puts keys under /w/ all along (any member that answers), 100 a second at most."""

    def __init__(self, endpoints: str) -> None:
        super().__init__(daemon=True)
        self.etcd = EtcdGateway(endpoints, timeout_s=2)
        self.stop_ = threading.Event()
        self.puts = 0

    def run(self) -> None:
        while not self.stop_.is_set():
            try:
                self.etcd.put(f"/w/{self.puts % 50:03d}", f"v{self.puts}")
                self.puts += 1
            except EtcdUnavailable:
                pass
            self.stop_.wait(0.01)


def read_all(etcd: EtcdGateway, revision: int) -> int:
    """A slow paginated list of /w/ at ``revision`` (pages of 10); the keys it read."""
    n = 0
    for page in paginate(etcd, "/w/", revision=revision, page=10):
        n += len(page)
    return n


def test_the_agent_refuses_to_start_beside_etcds_own_auto_compaction(broker: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "etcd-auto", 1)
    etcd = EtcdCluster(tmp_path / "etcd", 1, ["--auto-compaction-mode", "periodic", "--auto-compaction-retention",
                                              "1h"]).start()
    try:
        cmd = agent_cmd(etcd.endpoints, broker.bootstrap, settings, tmp_path)
        refused = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), timeout=60, check=False)
        assert refused.returncode == 2, refused.stderr
        assert "etcd's own auto-compaction is on" in refused.stderr and "periodic 1h" in refused.stderr
        assert "--allow-auto-compaction" in refused.stderr
        allowed = subprocess.Popen([*cmd, "--allow-auto-compaction"], stderr=subprocess.PIPE, text=True, env=job_env())
        try:
            wait_for(lambda: (tmp_path / "stats.json").exists(), 60, "the allowed agent's first heartbeat")
        finally:
            allowed.terminate()
            _, err = allowed.communicate(timeout=30)
        assert "a held revision may be compacted under its reader" in err and allowed.returncode == 0
    finally:
        etcd.stop()


def test_held_revisions_stay_readable_while_compaction_goes_on_through_failures(broker: Any, tmp_path: Path) -> None:
    settings = make_settings(broker.bootstrap, "etcd", 1, node_lease_ms=10_000, trigger_ms=200)
    config = tmp_path / "safepoint.toml"
    # the guide's table, with half its retention: this test's writer is slower than the guide's 500/s
    table = block("docs/etcd.md", "[clusters.etcd-main]").text
    assert "retention = 1000" in table
    config.write_text(table.replace("retention = 1000", "retention = 500"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    job = JobProcess(job_flags(settings, tmp_path / "ckpt", http_port=port, config=str(config)), tmp_path / "job.log")
    etcd = EtcdCluster(tmp_path / "etcd", 3).start()
    state = tmp_path / "agent"
    state.mkdir()
    agent = Agent(agent_cmd(etcd.endpoints, broker.bootstrap, settings, state), tmp_path / "agent.log")
    writer = Writer(etcd.endpoints)
    etcd_client = EtcdGateway(etcd.endpoints, timeout_s=2)
    hold_kw = {"control_topic": settings.control_topic, "status_topic": settings.status_topic, "outcome_timeout_s": 60}

    def status() -> dict[str, Any]:
        try:
            return get(f"{base}/api/v1/clusters/{CLUSTER}")
        except OSError:
            return {}

    def compacted() -> int:
        return etcd_client.compacted_revision()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "safepoint.cli", *args, "--bootstrap", broker.bootstrap,
                               "--control-topic", settings.control_topic, "--status-topic", settings.status_topic],
                              capture_output=True, text=True, env=job_env(), timeout=120, check=False)

    try:
        writer.start()
        agent.start()
        wait_for(lambda: answers(base + "/healthz"), JOB_START_TIMEOUT_S, "the job's HTTP surface", job)
        wait_for(lambda: agent.stats().get("compactions", 0) >= 2, 120, "the agent's first compactions", job)
        # the job counts a compaction when a heartbeat's compacted_ts rises past the first it saw: a
        # heartbeat or a batch after the agent's own count
        wait_for(lambda: status().get("compactions", 0) >= 1, 60, "the job to count a compaction", job)
        st = status()
        assert st["mvcc_unit"] == "revision" and st["compacted_ts"] >= 1, st

        # 0. the guide's RevisionHold block, as a reader copies it (only the addresses, topics and prefix)
        code = block("docs/etcd.md", "from safepoint.connectors.etcd_holds import RevisionHold").text
        code = code.replace('"kafka:9092"', repr(broker.bootstrap)).replace('"http://127.0.0.1:2379"', repr(etcd.endpoints))
        code = code.replace('label="paginated list")', f'label="paginated list", control_topic={settings.control_topic!r}, '
                                                        f'status_topic={settings.status_topic!r})')
        code = code.replace('"/registry/pods/"', '"/w/"')
        assert settings.control_topic in code and "/w/" in code
        exec(compile(code, "docs/etcd.md", "exec"), {})  # noqa: S102 - the guide's block

        # 1. a paginated list at a held revision, slow, while compaction goes on and the leader is killed
        failures: list[str] = []
        with RevisionHold(broker.bootstrap, CLUSTER, "list-1", etcd.endpoints, ttl_ms=30_000, label="slow list",
                          **hold_kw) as hold:
            held = hold.revision
            assert held is not None
            read_all(hold.etcd, held)
            wait_for(lambda: compacted() >= held - 1, 60, "compaction up to the held revision", job)
            leader = etcd.leader()
            leader.kill()
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                try:
                    read_all(hold.etcd, held)
                except RevisionCompacted as exc:
                    failures.append(str(exc))
                except EtcdUnavailable:
                    pass  # the members are electing
                time.sleep(0.2)
            leader.start()
            etcd.wait_healthy()
            st = status()
            assert any(h["holder"] == "list-1" and h["label"] == "slow list" for h in st["service_holds"]), st
            assert compacted() <= held, "the held revision was compacted"
            assert read_all(hold.etcd, held) == 50

            # 2. the agent restarts while the revision is held; a stale directive arrives meanwhile
            before = agent.stats()
            agent.stop()
            p = Producer({"bootstrap.servers": broker.bootstrap})
            stale = {"v": 1, "type": "compaction", "cluster": CLUSTER, "seq": 1, "safe_ts": etcd_client.revision(),
                     "catalog_floor": None, "cluster_wall_ms": 0, "blocker": None, "basis": {}, "members": 1,
                     "positions": {}}
            p.produce(settings.directives_topic, key=CLUSTER, value=json.dumps(stale))
            assert p.flush(10) == 0
            agent.start()
            wait_for(lambda: agent.stats().get("heartbeats", 0) >= 3, 60, "the restarted agent's heartbeats", job)
            time.sleep(2)
            assert agent.stats()["directive_seq"] >= before["directive_seq"], "it took an older directive"
            assert compacted() <= held and read_all(hold.etcd, held) == 50, "the stale directive compacted"

            # 3. a hold below what etcd compacted is refused with the reason; one from the CLI protects
            below = cli("hold", "set", CLUSTER, "too-old", "--ts", "2", "--ttl", "1m")
            assert below.returncode == 1 and "below compacted_ts" in below.stdout + below.stderr, below
            cli_rev = etcd_client.revision()
            set_ = cli("hold", "set", CLUSTER, "backup", "--ts", str(cli_rev), "--ttl", "2m", "--label", "backup")
            assert set_.returncode == 0, set_
        assert not failures, failures[:3]
        # list-1 released: compaction passes it, up to the CLI's hold
        wait_for(lambda: compacted() > held, 60, "compaction past the released revision", job)
        time.sleep(2)
        assert compacted() <= cli_rev and read_all(etcd_client, cli_rev) == 50
        released = cli("hold", "release", CLUSTER, "backup")
        assert released.returncode == 0, released
        wait_for(lambda: compacted() > cli_rev, 60, "compaction past the CLI's released revision", job)
        wait_for(lambda: status().get("compacted_ts", 0) > cli_rev, 30, "the status to say the compaction", job)
        wait_for(lambda: status().get("compactions", 0) >= 3, 30, "the job to count the compactions", job)
        metrics = get_text(base + "/metrics")
        assert f'safepoint_compactions_total{{cluster="{CLUSTER}"}}' in metrics
        assert agent.stats()["foreign_compactions"] == 0, agent.tail()
    finally:
        writer.stop_.set()
        agent.stop()
        job.stop()
        etcd.stop()
        etcd_client.close()


def get_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        return resp.read().decode()


def test_a_held_watch_moves_its_hold_as_it_consumes_events(broker: Any, tmp_path: Path) -> None:
    """``HeldWatch``: after the events of revision r were handed out, the hold moves to r + 1 (what a
    resumed watch needs): a watcher that fell behind pins only what it has not consumed yet."""
    from safepoint.connectors.etcd_holds import HeldWatch, prefix_end
    from safepoint.connectors.service_hold import ServiceHold

    from kafka_util import read_topic

    settings = make_settings(broker.bootstrap, "etcd-watch", 1)
    etcd = EtcdCluster(tmp_path / "etcd", 1).start()
    g = EtcdGateway(etcd.endpoints)
    try:
        start = g.put("/x/000", "a")
        for i in range(1, 30):
            g.put(f"/x/{i:03d}", "b")
        later = threading.Timer(1.0, lambda: [g.put(f"/x/{i:03d}", "c") for i in range(30, 35)])
        seen: list[int] = []
        with ServiceHold(broker.bootstrap, CLUSTER, "cdc", start, 30_000, label="changefeed",
                         control_topic=settings.control_topic, status_topic="") as hold:
            watch = HeldWatch(g, "/x/", prefix_end(b"/x/"), hold, advance_every_s=0)
            later.start()
            for event in watch:
                seen.append(int(event["kv"]["mod_revision"]))
                if len(seen) == 35:
                    break
        assert seen == list(range(start, start + 35))
        held = [e["ts"] for e in read_topic(broker.bootstrap, settings.control_topic)
                if e.get("type") == "service_hold" and e["holder"] == "cdc"]
        assert held[0] == start and start + 30 in held and held == sorted(held), held
        # the last event's response was never finished (the loop broke in it): not consumed, still held
        assert watch.advances >= 1 and watch.next_revision == start + 34
    finally:
        g.close()
        etcd.stop()


def test_the_agent_rides_out_etcd_and_the_broker_going_away(tmp_path: Path) -> None:
    """Every etcd member away: the agent says so once, publishes no heartbeat (the job would hold the
    safe point as the node goes stale) and resumes when etcd is back; its broker restarted: it goes on
    and follows the next directive. Directives come from the test, as the job would send them; the
    agent defragments after compacting (``--defrag-free-bytes``)."""
    from safepoint.devtools.broker import EmbeddedBroker

    from kafka_util import read_topic

    port = free_port()
    broker = EmbeddedBroker(port=port, data_dir=str(tmp_path / "broker")).start()
    settings = make_settings(broker.bootstrap, "etcd-faults", 1)
    etcd = EtcdCluster(tmp_path / "etcd", 1).start()
    g = EtcdGateway(etcd.endpoints, timeout_s=1)
    state = tmp_path / "agent"
    state.mkdir()
    agent = Agent(agent_cmd(etcd.endpoints, broker.bootstrap, settings, state, "--defrag-free-bytes", "1"),
                  tmp_path / "agent.log")
    seq = 0

    def directive(safe_ts: int) -> None:
        nonlocal seq
        seq += 1
        p = Producer({"bootstrap.servers": broker.bootstrap})
        p.produce(settings.directives_topic, key=CLUSTER, value=json.dumps({
            "v": 1, "type": "compaction", "cluster": CLUSTER, "seq": seq, "safe_ts": safe_ts, "catalog_floor": None,
            "cluster_wall_ms": 0, "blocker": None, "basis": {}}))
        assert p.flush(10) == 0

    try:
        for i in range(200):
            g.put(f"/k/{i % 7}", "x" * 2_000)
        agent.start()
        wait_for(lambda: agent.stats().get("heartbeats", 0) >= 2, 60, "the agent's heartbeats")
        directive(100)
        wait_for(lambda: g.compacted_revision() == 100, 30, "a compaction at the directive's safe_ts")
        wait_for(lambda: agent.stats().get("defragmentations", 0) >= 1, 30, "a defragmentation after it")

        etcd.stop()
        beats = agent.stats()["heartbeats"]
        wait_for(lambda: agent.stats().get("etcd_failures", 0) >= 1 or "etcd cannot be read" in agent.tail(), 30,
                 "the agent to see etcd away")
        time.sleep(2)
        assert agent.stats()["heartbeats"] <= beats + 1, "heartbeats while etcd cannot be read"
        assert agent.tail().count("etcd cannot be read") == 1, "said once per outage"
        etcd.members[0].start()
        etcd.wait_healthy()
        wait_for(lambda: "etcd answers again" in agent.tail(), 60, "the agent to see etcd back")
        wait_for(lambda: agent.stats().get("heartbeats", 0) > beats + 2, 30, "heartbeats again")

        broker.stop()
        time.sleep(3)
        broker = EmbeddedBroker(port=port, data_dir=str(tmp_path / "broker")).start()
        directive(150)
        wait_for(lambda: g.compacted_revision() == 150, 60, "a compaction after the broker came back")
        beats = agent.stats()["heartbeats"]
        wait_for(lambda: any(e.get("type") == "heartbeat" and e.get("compacted_ts") == 150
                             for e in read_topic(broker.bootstrap, settings.events_topic, timeout_s=3)), 30,
                 "a heartbeat that says the compaction")
        assert agent.proc is not None and agent.proc.poll() is None, agent.tail()
    finally:
        agent.stop()
        etcd.stop()
        broker.stop()
        g.close()
