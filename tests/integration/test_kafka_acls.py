"""The security page's ACL table on Apache Kafka with SASL (SCRAM-SHA-512) and Kafka's own authorizer, on
loopback: each role's principal gets what ``safepoint acls ROLE PRINCIPAL --apply`` grants. A node's
principal cannot write the control or the directives topic (its write fails with an authorization error
and nothing reaches the job), while the job's, an operator's and a holder's principals do their work.
The node client, the job, the CLI and both agents take their SASL settings from the ``[kafka]`` table of
their TOML file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer

from safepoint.cli import main as cli
from safepoint.connectors.kafka.follow import read_to_end
from safepoint.connectors.kafka.topics import ensure_topics, topic_ends, topic_specs
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.reporter import Reporter
from safepoint.connectors.service_hold import ServiceHold
from safepoint.devtools.apache_kafka import ADMIN_USER, ApacheKafka
from safepoint.errors import BrokerError
from safepoint.jars import KAFKA
from safepoint.settings import Settings, load_settings
from safepoint.streaming.driver import prepare_topics

from conftest import require_jars
from etcd_util import EtcdCluster, _needs_etcd  # noqa: F401 - the agents' tests need etcd
from kafka_util import topic_flags, unique
from pg_util import _needs_postgres  # noqa: F401 - and PostgreSQL
from tests_support import QueryJob, job_env, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

ROLES = ("job", "node", "agent", "operator", "holder")


@pytest.fixture(scope="module")
def secured() -> Iterator[ApacheKafka]:
    require_jars(KAFKA)
    kafka = ApacheKafka(users={role: f"{role}-secret" for role in ROLES}).start()
    try:
        yield kafka
    finally:
        kafka.cleanup()


def config_file(folder: Path, kafka: ApacheKafka, user: tuple[str, str], topics: dict[str, str]) -> Path:
    """A TOML file of settings for one principal: the deployment's topics and its ``[kafka]`` table."""
    conf = kafka.client_conf(user)
    lines = [f'bootstrap = "{conf.pop("bootstrap.servers")}"', *(f'{k} = "{v}"' for k, v in topics.items()),
             "node_lease_ms = 5000", "", "[kafka]", *(f'"{k}" = "{v}"' for k, v in conf.items())]
    path = folder / f"{user[0]}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def as_user(path: Path) -> Settings:
    return load_settings(str(path), {}, environ={})


def write_fails(conf: dict[str, Any], topic: str, value: dict[str, Any]) -> str | None:
    """Produce one record as ``conf``'s principal: the delivery error's name (None: it was written)."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "enable.idempotence": False, "message.timeout.ms": 10_000})
    producer.produce(topic, key="c1", value=json.dumps(value), on_delivery=lambda err, _m: errors.append(err))
    producer.flush(20)
    return errors[0].name() if errors and errors[0] is not None else None


def test_each_principal_does_its_work_and_a_node_cannot_steer(secured: ApacheKafka, spark: Any, tmp_path: Path,
                                                              pg: Any) -> None:
    tag = unique("acl")
    topics = {k: v for k, v in topic_flags(tag, "status").items()}
    files = {role: config_file(tmp_path, secured, (role, f"{role}-secret"), topics) for role in ROLES}
    files["admin"] = config_file(tmp_path, secured, ADMIN_USER, topics)
    job, admin = as_user(files["job"]), as_user(files["admin"])

    # the job's principal may not create topics: said plainly, then made by an administrator
    with pytest.raises(BrokerError, match="refused it to job.*CREATE"):
        prepare_topics(job)
    ensure_topics(admin.librdkafka(), topic_specs(admin.topics(), 2))
    for role in ROLES:
        assert cli(["acls", role, f"User:{role}", "--apply", "--config", str(files["admin"])]) == 0

    node = as_user(files["node"])
    reporter = Reporter.from_settings(node, "n1", mvcc_clock=lambda: time.time_ns() // 1000, cluster="c1",
                                      incarnation=1, heartbeat_interval_s=0.3)
    listener = DirectiveListener.from_settings(node, reporter=reporter)
    query = QueryJob(spark, job, tmp_path / "ckpt")
    agents: list[subprocess.Popen[bytes]] = []
    etcd = EtcdCluster(tmp_path / "etcd").start()
    try:
        wait_for(lambda: listener.poll(0.5) is not None, 120, "a directive at the node, through SASL", query)

        # a node's principal can write neither the control nor the directives topic, and nothing reaches the job
        forged = {"v": 1, "type": "pause", "cluster": "c1", "wall_ms": int(time.time() * 1000), "action_id": "forged"}
        ends = {job.control_topic: topic_ends(admin.librdkafka(), job.control_topic)}
        assert write_fails(node.librdkafka(), job.control_topic, forged) == "TOPIC_AUTHORIZATION_FAILED"
        directive = {"v": 1, "type": "compaction", "cluster": "c1", "seq": 10**9, "safe_ts": 10**18}
        assert write_fails(node.librdkafka(), job.directives_topic, directive) == "TOPIC_AUTHORIZATION_FAILED"
        assert topic_ends(admin.librdkafka(), job.control_topic) == ends[job.control_topic]
        written = [json.loads(m.value()) for m in read_to_end(admin.librdkafka(), job.directives_topic, 10)]
        assert written and not [d for d in written if d.get("safe_ts") == 10**18], "the forged directive is not there"

        # an operator pauses and resumes through the CLI, each waiting for the job's outcome
        assert cli(["pause", "c1", "--reason", "maintenance", "--config", str(files["operator"])]) == 0
        assert cli(["resume", "c1", "--config", str(files["operator"])]) == 0
        # a holder's service hold is taken by the job
        holder = as_user(files["holder"])
        at = time.time_ns() // 1000 + 60_000_000  # the nodes' MVCC time in a minute: above the safe point
        with ServiceHold.from_settings(holder, "c1", "backup", ts=at, ttl_ms=60_000) as hold:
            wait_for(lambda: hold.last_outcome is not None and hold.last_outcome["outcome"] == "applied", 30,
                     "the hold applied", query)
            hold.check()

        # both agents publish with their principal's [kafka] table and read their directives
        stats = {name: tmp_path / f"{name}.json" for name in ("etcd", "postgres")}
        for name, argv in (("etcd", ["--endpoints", etcd.endpoints, "--cluster", "c-etcd", "--heartbeat", "0.3"]),
                           ("postgres", ["--dsn", pg.dsn(), "--cluster", "c-pg", "--node", "pg1", "--poll", "0.3"])):
            with (tmp_path / f"{name}.log").open("ab") as log:
                agents.append(subprocess.Popen([sys.executable, "-m", "safepoint.cli", "agent", name, *argv, "--config",
                                                str(files["agent"]), "--stats-file", str(stats[name])],
                                               stdout=log, stderr=subprocess.STDOUT, env=job_env()))

        def took_a_directive(name: str) -> bool:
            try:
                return int(json.loads(stats[name].read_text()).get("directive_seq") or 0) > 0
            except (OSError, ValueError):
                return False

        for name in stats:
            wait_for(lambda name=name: took_a_directive(name), 90, f"the {name} agent's first directive", query)
    finally:
        for proc in agents:
            proc.terminate()
            proc.wait(30)
        etcd.stop()
        listener.close()
        reporter.close()
        query.stop()
