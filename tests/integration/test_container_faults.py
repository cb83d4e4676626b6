"""Faults only containers give, on the project's images (testcontainers): three Kafka brokers, the job
(``safepoint run`` in its own container, its checkpoint a folder of the test) and ``safepoint serve`` on
a network of the test's own, three database nodes on the host opening and closing readers.

- **A partition**: the broker leading the directives partition (and an events partition) is cut off
  from the other brokers, from the job and from the nodes (``docker network disconnect``) for twice
  its session timeout while it runs on, then joined again.
- **A freeze**: the same broker frozen (``docker pause``) as long, then thawed: a leader that does not
  know it was replaced.

Each fault: no directive passes a reader open on its node, every listener sees seq and safe_ts only
move forward, directives go on from the majority side while the broker is away, the cluster heals
(every partition in sync on three brokers again), and the job's run is replay's: every event
accounted for once, its directives byte for byte (``tests_support.verify``). Against a listener that
takes any directive (no seq check) or a job whose sink drops what the broker does not confirm, these
fail; see docs/development.md ("Tests on containers") for the mutants tried."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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
AWAY_S = 20.0
"""How long the broker stays away: more than twice Kafka's broker session timeout (9 s)."""


@pytest.fixture(scope="module")
def net() -> Iterator[Any]:
    from safepoint.devtools.containers import TestNetwork, images_missing, sweep

    why = images_missing()
    if why:
        missing_tool(why)
    sweep()
    with TestNetwork() as network:
        yield network


@pytest.fixture(scope="module")
def kafka(net: Any) -> Any:
    from safepoint.devtools.containers import KafkaCluster

    return KafkaCluster(net).start()


def served_seq(url: str) -> int:
    """The last directive's seq that serve shows for cluster c1 (0: none yet, or not answering)."""
    try:
        return int(get(f"{url}/api/v1/clusters/c1").get("seq") or 0)
    except Exception:  # noqa: BLE001 - not there yet: asked again
        return 0


def run_with_a_fault(kafka: Any, net: Any, tmp_path: Path, prefix: str, away: Callable[[int], None],
                     back: Callable[[int], None]) -> dict[str, float]:
    """The job, serve and three nodes; the broker leading the directives partition sent ``away``, then
    ``back``; every check of the module's text. Returns the run's figures."""
    from safepoint.devtools.containers import JobContainer, ServeContainer

    settings = make_settings(kafka.bootstrap, prefix, PARTITIONS, node_lease_ms=30_000, trigger_ms=300)
    job = JobContainer(net, job_flags(settings, tmp_path / "unused", spark_master="local[2]"), tmp_path / "ckpt",
                       env={"PYSPARK_SUBMIT_ARGS": "--conf spark.sql.streaming.minBatchesToRetain=1000000 pyspark-shell"})
    serve = ServeContainer(net, kafka.bootstrap, settings.status_topic)
    nodes: list[ReaderNode] = []
    figures: dict[str, float] = {}
    try:
        started = time.monotonic()
        job.start()
        serve.start()
        nodes = [ReaderNode(kafka.bootstrap, name, settings.events_topic, settings.directives_topic) for name in NODES]
        for n in nodes:
            n.thread.start()
        wait_for(lambda: all(len(n.seen) >= 3 for n in nodes), JOB_START_TIMEOUT_S, "three directives at every node", job)
        figures["start_to_directives_s"] = time.monotonic() - started
        victim = kafka.leaders(settings.directives_topic)[0]
        assert victim in kafka.leaders(settings.events_topic).values(), "it leads an events partition too"

        gone = time.monotonic()
        away(victim)
        wait_for(lambda: kafka.leaders(settings.directives_topic).get(0, victim) not in (victim, -1), 60,
                 "a new leader of the directives partition on the majority side")
        figures["new_leader_s"] = time.monotonic() - gone
        wait_for(lambda: all(n.directives_since(gone) >= 3 for n in nodes), 90,
                 "three directives at every node while the broker is away", job)
        figures["next_directive_s"] = max(min(t for t, _ in n.seen if t > gone) for n in nodes) - gone
        time.sleep(max(0.0, AWAY_S - (time.monotonic() - gone)))
        back(victim)
        returned = time.monotonic()
        topics = (settings.events_topic, settings.directives_topic, settings.status_topic)
        wait_for(lambda: all(kafka.in_sync(t) and all(len(r) == 3 for r in kafka.in_sync(t).values()) for t in topics),
                 120, "every partition in sync on three brokers again")
        figures["healed_s"] = time.monotonic() - returned
        wait_for(lambda: all(n.directives_since(returned) >= 3 for n in nodes), 90,
                 "three directives at every node once the broker is back", job)

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

    check_nodes(nodes)
    v = verify(kafka.bootstrap, settings, job.folder)
    assert v.directives["c1"], "the job made directives"
    report(prefix, victim=victim, **{k: round(x, 1) for k, x in figures.items()},
           directives=len(v.directives["c1"]), messages=v.messages)
    return figures


def test_a_partitioned_broker(kafka: Any, net: Any, tmp_path: Path) -> None:
    run_with_a_fault(kafka, net, tmp_path, "partition", kafka.cut_off, kafka.join)


def test_a_frozen_broker(kafka: Any, net: Any, tmp_path: Path) -> None:
    run_with_a_fault(kafka, net, tmp_path, "freeze", kafka.freeze, kafka.thaw)
