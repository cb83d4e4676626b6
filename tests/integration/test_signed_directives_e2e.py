"""What a node may trust, through the broker, the job and a real etcd (Debian's, on loopback) under
``safepoint agent etcd``: directives signed by the job (``directive_keys``) and verified by the agent and
a listener given the public key. Forged directives (unsigned, signed by a key nobody gave them, and
signed by the key rotated out) reach both, and neither acts on one; the job's next directive is acted
on. Then the job loses everything (its checkpoint and the directives topic): the agent, restarted on
its ``--state-dir``, compacts again at the new generation's first directive."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from safepoint.connectors.etcd_agent import STATE_FILE
from safepoint.connectors.etcd_gateway import EtcdGateway
from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.connectors.listener import DirectiveListener
from safepoint.core.signing import public_key_of, sign_directive

from etcd_util import EtcdCluster, _needs_etcd  # noqa: F401 - the module's tests need etcd
from kafka_util import produce, read_topic
from test_etcd_e2e import Agent, Writer
from tests_support import QueryJob, make_settings, wait_for

pytestmark = pytest.mark.integration

CLUSTER = "etcd-signed"
OLD, NEW, ROGUE = "a1" * 32, "b2" * 32, "c3" * 32


def agent_cmd(endpoints: str, bootstrap: str, settings: Any, state: Path, key: str) -> list[str]:
    return [sys.executable, "-m", "safepoint.cli", "agent", "etcd", "--endpoints", endpoints, "--bootstrap", bootstrap,
            "--cluster", CLUSTER, "--state-dir", str(state), "--events-topic", settings.events_topic,
            "--directives-topic", settings.directives_topic, "--directive-key", key, "--compact-every", "1",
            "--heartbeat", "0.3", "--stats-file", str(state / "stats.json"), "--timeout", "2"]


def forged(seq: int, safe_ts: int, key: str | None, generation: str | None) -> tuple[str, dict[str, Any]]:
    value: dict[str, Any] = {"v": 1, "type": "compaction", "cluster": CLUSTER, "seq": seq, "safe_ts": safe_ts,
                             "catalog_floor": None, "cluster_wall_ms": int(time.time() * 1000), "blocker": None,
                             "basis": {}, **({"generation": generation} if generation else {})}
    if key is not None:
        value["sig"] = sign_directive(value, key)
    return CLUSTER, value


def newest(bootstrap: str, topic: str) -> dict[str, Any]:
    return [d for d in read_topic(bootstrap, topic, 2) if d["type"] == "compaction" and d["cluster"] == CLUSTER][-1]


def test_forged_directives_are_never_acted_on_and_a_job_that_lost_everything_is_taken_up(
        broker: Any, spark: Any, tmp_path: Path) -> None:
    # the job signs with NEW; OLD was its key before a rotation and is given to nobody any more
    settings = make_settings(broker.bootstrap, "signed", 1, node_lease_ms=10_000, trigger_ms=200, retention=50,
                             directive_keys=NEW)
    etcd = EtcdCluster(tmp_path / "etcd", 1).start()
    state = tmp_path / "agent"
    state.mkdir()
    cmd = agent_cmd(etcd.endpoints, broker.bootstrap, settings, state, public_key_of(NEW))
    agent = Agent(cmd, tmp_path / "agent.log")
    writer = Writer(etcd.endpoints)
    gateway = EtcdGateway(etcd.endpoints, timeout_s=2)
    listener = DirectiveListener(broker.bootstrap, CLUSTER, topic=settings.directives_topic,
                                 directive_key=public_key_of(NEW))
    job = QueryJob(spark, settings, tmp_path / "ckpt")
    try:
        writer.start()
        agent.start()
        wait_for(lambda: agent.stats().get("compactions", 0) >= 2, 120, "the agent's first compactions", job)
        first = newest(broker.bootstrap, settings.directives_topic)
        assert first["sig"].startswith("ed25519:") and first["generation"], first
        # three forgeries, each claiming everything may go: unsigned, a stranger's key, the key rotated out
        produce(broker.bootstrap, settings.directives_topic,
                [forged(10**6, 10**9, None, first["generation"]), forged(10**6 + 1, 10**9, ROGUE, first["generation"]),
                 forged(10**6 + 2, 10**9, OLD, first["generation"])])
        wait_for(lambda: agent.stats().get("unsigned_directives", 0) >= 1
                 and agent.stats().get("badly_signed_directives", 0) >= 2, 30, "the agent to refuse the three", job)
        got = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and listener.stats().unsigned + listener.stats().bad_signatures < 3:
            got = listener.poll(0.5) or got
        stats = listener.stats()
        assert (stats.unsigned, stats.bad_signatures) == (1, 2), stats
        assert listener.seq < 10**6 and (listener.safe_ts or 0) < 10**9
        assert agent.stats()["directive_seq"] < 10**6
        # the job's next directives are acted on; nothing ever went past what the job allowed
        before = agent.stats()["compactions"]
        wait_for(lambda: agent.stats()["compactions"] >= before + 2, 60, "compactions at the job's next directives", job)
        # the revision first, then the directives: the agent compacted at a directive the topic holds by
        # then (read the other way round, one the job made while the topic was read counted as passed)
        compacted_now = gateway.compacted_revision()
        allowed = newest(broker.bootstrap, settings.directives_topic)
        assert compacted_now <= allowed["safe_ts"] < 10**9
        assert allowed["seq"] > first["seq"] and agent.stats()["directive_seq"] >= first["seq"]
        acted = json.loads((state / STATE_FILE).read_text())
        assert acted["generation"] == first["generation"] and acted["seq"] >= first["seq"], acted
        job.stop()
        agent.stop()
        # as after weeks of that job: the state dir says the agent acted at seq 1,000,000, which a new job
        # numbering from 1 would not reach for weeks
        (state / STATE_FILE).write_text(json.dumps({**acted, "seq": 10**6}))

        # the job loses everything: its checkpoint and the directives topic. It starts on empty state, in a new
        # generation, numbering from 1; the agent, restarted on its state dir, which says it acted at a high seq
        compacted = gateway.compacted_revision()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for fut in admin.delete_topics([settings.directives_topic], operation_timeout=10).values():
            fut.result(10)
        wait_for(lambda: settings.directives_topic not in admin.list_topics(timeout=10).topics, 20, "the topic deleted")
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 1, log_append_time=False))
        agent = Agent(cmd, tmp_path / "agent-2.log")
        agent.start()
        job = QueryJob(spark, settings, tmp_path / "ckpt-new")
        wait_for(lambda: bool([d for d in read_topic(broker.bootstrap, settings.directives_topic, 2)
                               if d["type"] == "compaction"]), 120, "the new job's first directive", job)
        renewed = [d for d in read_topic(broker.bootstrap, settings.directives_topic, 2) if d["type"] == "compaction"]
        assert {d["generation"] for d in renewed} != {first["generation"]} and renewed[0]["seq"] == 1, renewed[0]
        wait_for(lambda: gateway.compacted_revision() > compacted, 60, "a compaction at the new generation's directives",
                 job)
        assert gateway.compacted_revision() <= newest(broker.bootstrap, settings.directives_topic)["safe_ts"]
        taken = json.loads((state / STATE_FILE).read_text())
        assert taken["generation"] == renewed[0]["generation"] != acted["generation"], (taken, acted)
    finally:
        writer.stop_.set()
        listener.close()
        agent.stop()
        job.stop()
        etcd.stop()
