"""A broker of three dies under the job: Apache Kafka on three brokers (``safepoint broker --kafka --nodes
3``'s cluster), the project's topics with three replicas and ``min.insync.replicas=2``. The broker that
leads the directives partition (and an events partition) is SIGKILLed while three nodes open and close
readers: no directive passes a reader open when it arrives, every listener sees seq and safe_ts only move
forward, and directives go on coming from the two brokers left."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource

from safepoint.devtools.broker import free_port, wait_for_kafka
from safepoint.jars import KAFKA

from conftest import require_jars
from fault_nodes import ReaderNode, check_nodes, close_all, stop_all
from tests_support import QueryJob, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

NODES = ("n1", "n2", "n3")
PARTITIONS = 3


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``safepoint broker --kafka --nodes 3`` as a user runs it: its ready line gives the bootstrap
    addresses and each broker's pid."""
    require_jars(KAFKA)
    data = tmp_path_factory.mktemp("kafka3")
    proc = subprocess.Popen([sys.executable, "-m", "safepoint.cli", "broker", "--kafka", "--nodes", "3", "--port",
                             str(free_port()), "--data-dir", str(data)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        ready = re.search(r"safepoint broker ready bootstrap=(\S+) data_dir=\S+ pids=(\S+)", line)
        assert ready, line
        bootstrap, pids = ready.group(1), [int(p) for p in ready.group(2).split(",")]
        assert len(bootstrap.split(",")) == 3 and len(pids) == 3
        wait_for_kafka(bootstrap, 30)
        yield {"bootstrap": bootstrap, "pids": pids, "proc": proc}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> the broker id leading it ({} while no broker answers in time: one of the three is dead)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        description = admin.describe_topics(TopicCollection([topic]), request_timeout=5)[topic].result(10)
    except Exception:  # noqa: BLE001 - asked again by the caller
        return {}
    return {p.id: p.leader.id if p.leader is not None else -1 for p in description.partitions}


def test_directives_go_on_and_pass_no_open_reader_when_a_broker_of_three_dies(
        three: dict[str, Any], spark: Any, tmp_path: Path) -> None:
    bootstrap = three["bootstrap"]
    settings = make_settings(bootstrap, "failover", PARTITIONS, node_lease_ms=5_000, trigger_ms=300)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in (settings.events_topic, settings.directives_topic, settings.control_topic):
        description = admin.describe_topics(TopicCollection([topic]))[topic].result(10)
        assert {len(p.replicas) for p in description.partitions} == {3}, topic
        config = next(iter(admin.describe_configs([ConfigResource("topic", topic)]).values())).result(10)
        assert config["min.insync.replicas"].value == "2", topic

    nodes = [ReaderNode(bootstrap, name, settings.events_topic, settings.directives_topic) for name in NODES]
    job = QueryJob(spark, settings, tmp_path / "ckpt")
    try:
        for n in nodes:
            n.thread.start()
        wait_for(lambda: all(len(n.seen) >= 3 for n in nodes), 120, "three directives at every node", job)
        victim = leaders(bootstrap, settings.directives_topic)[0]
        assert victim in leaders(bootstrap, settings.events_topic).values(), "it leads an events partition too"
        killed_at = time.monotonic()
        pid = three["pids"][victim - 1]
        subprocess.run(["kill", "-9", str(pid)], check=True)
        wait_for(lambda: leaders(bootstrap, settings.directives_topic).get(0, victim) not in (victim, -1), 60,
                 "a new leader of the directives")
        # Counted from here, not from the kill: the admin's answer can come after the job has sent
        # directives through the new leader already (the broker's death is seen first by the controller).
        seq_at_leader = {n.name: n.last_seq() for n in nodes}
        wait_for(lambda: all(n.directives_since(killed_at) >= 5 and n.last_seq() >= seq_at_leader[n.name] + 3
                             for n in nodes), 120, "five directives at every node after the kill, three of them "
                 "after the new leader was seen", job)
        assert three["proc"].poll() is None, "safepoint broker goes on with two brokers"
    finally:
        stop_all(nodes)
        job.stop()
        close_all(nodes)

    check_nodes(nodes)
    assert all(n.last_seq() > seq_at_leader[n.name] for n in nodes)
