"""Faults only containers give, on the project's images (testcontainers): three Kafka brokers, the job
(``safepoint run`` in its own container, its checkpoint a folder of the test) and ``safepoint serve`` on
a network of the test's own, three database nodes on the host opening and closing readers.

One test, each fault a subtest of it, under one job (one set of containers):

- **A partition**: the broker leading the directives partition (and an events partition) is cut off
  from the other brokers, from the job and from the nodes (``docker network disconnect``) for twice
  its session timeout while it runs on, then joined again.
- **A freeze**: the same broker frozen (``docker pause``) as long, then thawed: a leader that does not
  know it was replaced.

Each fault: no directive passes a reader open on its node, every listener sees seq and safe_ts only
move forward, directives go on from the majority side while the broker is away, the cluster heals
(every partition in sync on three brokers again), and the job's run is replay's: every event
accounted for once, its directives byte for byte (``tests_support.verify``). Against a job with
librdkafka's default timeouts (``clients.FAILOVER_CONF`` set back through the ``[kafka]`` table) it
fails: no directive for two minutes behind the partitioned leader, the job ended by the frozen one;
see docs/development.md ("Tests on containers")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from safepoint.streaming.java import C1_ONLY

from fault_nodes import ReaderNode, check_nodes, close_all, stop_all
from observers import missing_tool
from tests_support import (
    CATCH_UP_TIMEOUT_S,
    JOB_START_TIMEOUT_S,
    caught_up,
    get,
    job_flags,
    log_ends,
    make_settings,
    report,
    verify,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.docker]

NODES = ("n1", "n2", "n3")
PARTITIONS = 3
AWAY_S = 15.0
"""How long the broker stays away: well past Kafka's broker session timeout (9 s)."""


@pytest.fixture
def net() -> Iterator[Any]:
    from safepoint.devtools.containers import TestNetwork, images_missing, sweep

    why = images_missing()
    if why:
        missing_tool(why)
    sweep()
    with TestNetwork() as network:
        yield network


@pytest.fixture
def kafka(net: Any) -> Any:
    from safepoint.devtools.containers import KafkaCluster

    return KafkaCluster(net).start()


def served_seq(url: str) -> int:
    """The last directive's seq that serve shows for cluster c1 (0: none yet, or not answering)."""
    try:
        return int(get(f"{url}/api/v1/clusters/c1").get("seq") or 0)
    except Exception:  # noqa: BLE001 - not there yet: asked again
        return 0


def run_with_faults(kafka: Any, net: Any, tmp_path: Path, subtests: Any,
                    faults: list[tuple[str, Callable[[int], None], Callable[[int], None]]]) -> dict[str, dict[str, float]]:
    """The job, serve and three nodes; for each fault in turn, the broker then leading the directives
    partition sent ``away`` and ``back`` (a subtest each); then every check of the module's text over the
    whole run. Returns each fault's figures."""
    from safepoint.devtools.containers import JobContainer, ServeContainer

    settings = make_settings(kafka.bootstrap, "faults", PARTITIONS, node_lease_ms=30_000, trigger_ms=300)
    job = JobContainer(net, job_flags(settings, tmp_path / "unused", spark_master="local[2]"), tmp_path / "ckpt",
                       env={"PYSPARK_SUBMIT_ARGS": "--conf spark.sql.streaming.minBatchesToRetain=1000000 pyspark-shell",
                            "SPARK_SUBMIT_OPTS": C1_ONLY})  # the whole offset log (verify reads it); C1, as the suite's JVMs
    serve = ServeContainer(net, kafka.bootstrap, settings.status_topic)
    nodes: list[ReaderNode] = []
    figures: dict[str, dict[str, float]] = {}
    topics = (settings.events_topic, settings.directives_topic, settings.status_topic)
    try:
        started = time.monotonic()
        job.start()
        serve.start()
        nodes = [ReaderNode(kafka.bootstrap, name, settings.events_topic, settings.directives_topic) for name in NODES]
        for n in nodes:
            n.thread.start()
        wait_for(lambda: all(len(n.seen) >= 3 for n in nodes), JOB_START_TIMEOUT_S, "three directives at every node", job)
        figures["start"] = {"to_directives_s": time.monotonic() - started}
        for name, away, back in faults:
            with subtests.test(fault=name):
                victim = kafka.leaders(settings.directives_topic)[0]
                assert victim in kafka.leaders(settings.events_topic).values(), "it leads an events partition too"
                seq_before = {n.name: n.last_seq() for n in nodes}
                f = figures[name] = {"victim": victim}
                gone = time.monotonic()
                away(victim)
                try:
                    wait_for(lambda: kafka.leaders(settings.directives_topic).get(0, victim) not in (victim, -1), 60,  # noqa: B023
                             "a new leader of the directives partition on the majority side")
                    f["new_leader_s"] = time.monotonic() - gone
                    wait_for(lambda: all(n.directives_since(gone) >= 3 for n in nodes), 60,  # noqa: B023
                             "three directives at every node while the broker is away", job)
                    f["next_directive_s"] = max(min(t for t, _ in n.seen if t > gone) for n in nodes) - gone
                    time.sleep(max(0.0, AWAY_S - (time.monotonic() - gone)))
                finally:
                    back(victim)
                returned = time.monotonic()
                wait_for(lambda: all(kafka.in_sync(t) and all(len(r) == 3 for r in kafka.in_sync(t).values())
                                     for t in topics), 120, "every partition in sync on three brokers again")
                f["healed_s"] = time.monotonic() - returned
                wait_for(lambda: all(n.directives_since(returned) >= 3 for n in nodes), 90,  # noqa: B023
                         "three directives at every node once the broker is back", job)
                assert all(n.last_seq() > seq_before[n.name] for n in nodes)

        stop_all(nodes)
        close_all(nodes)
        ends = log_ends(kafka.bootstrap, settings)
        wait_for(lambda: caught_up(job.folder, ends), CATCH_UP_TIMEOUT_S, "the job to read the whole log", job)
        last = max(n.last_seq() for n in nodes)
        wait_for(lambda: served_seq(serve.url) >= last, 60, "serve to show the last directive")
        assert get(f"{serve.url}/healthz")["status"] == "ok"
        assert job.stop() == 0, job.tail()
    finally:
        stop_all(nodes)
        close_all(nodes)
        job.kill()
        serve.container.stop()

    with subtests.test(check="no directive passed an open reader; seq and safe_ts only forward"):
        check_nodes(nodes)
    with subtests.test(check="every event accounted for once; the directives replay's"):
        v = verify(kafka.bootstrap, settings, job.folder)
        assert v.directives["c1"], "the job made directives"
    for name, f in figures.items():
        report(name, **{k: round(x, 1) for k, x in f.items()})
    return figures


def test_a_broker_cut_off_then_frozen(kafka: Any, net: Any, tmp_path: Path, subtests: Any) -> None:
    """The partition and the freeze, each a subtest, one after the other under one job."""
    run_with_faults(kafka, net, tmp_path, subtests,
                    [("partition", kafka.cut_off, kafka.join), ("freeze", kafka.freeze, kafka.thaw)])
