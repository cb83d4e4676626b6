"""Idle means idle: every consumer of the project, once caught up on a topic that holds data, uses
a small share of a core, and so does the embedded broker serving it (a consumer that keeps
fetching there spins a core: the broker answers an empty fetch at once). So does one following a
topic that keeps growing (each fetch there brings a few records and the next follows at once:
the auditor following 300 events/s spun 43% of a core and the broker 40%).

Each consumer runs in a child process of its own, all of one test at once; their CPU time and
the broker's are read from the operating system over a few seconds once they have caught up.
The target is under 3% of a core; the assertion keeps a wide margin (10% a consumer) for a loaded
machine: this test catches a spinning consumer (40% and more), not a few percent. The broker
serves them all, so its bound is for the group: 15% for the five caught-up consumers, 30% while
the topics grow, where it also takes the test's writes (a clean-clone run measured 10.4% serving
the view alone with directives written)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import DIRECTIVES, Engine, Policy, Position
from safepoint.core.codec import encode
from safepoint.settings import load_settings

from kafka_util import produce, unique

pytestmark = pytest.mark.integration
MEASURE_S = 5.0
LIMIT = 0.10
BROKER_LIMIT = 0.15
GROWING_BROKER_LIMIT = 0.30

CONSUMERS = {
    "listener-confluent": """
from safepoint.connectors.listener import DirectiveListener
listener = DirectiveListener(B, "c1", topic=S.directives_topic, on_directive=lambda d: None).start()
while not listener.caught_up or listener.seq == 0:
    time.sleep(0.1)
""",
    "listener-kafka-python": """
from safepoint.connectors.listener import DirectiveListener
listener = DirectiveListener(B, "c1", topic=S.directives_topic, on_directive=lambda d: None, client="kafka-python").start()
while not listener.caught_up or listener.seq == 0:
    time.sleep(0.1)
""",
    "status-follower": """
from safepoint.ops.status_store import StatusStore
store = StatusStore()
store.follow(S.librdkafka(), S.status_topic)
while store.messages < 1:
    time.sleep(0.1)
""",
    "view": """
from safepoint.ops.view import LiveView
view = LiveView(S)
while view.count < 1:
    view.poll(0.5)
def loop():
    while True:
        view.poll(1.0)
threading.Thread(target=loop, daemon=True).start()
""",
    "service-hold": """
from safepoint.connectors.service_hold import ServiceHold
hold = ServiceHold(B, "c1", "backup", ts=5, ttl_ms=600_000, control_topic=S.control_topic, status_topic=S.status_topic,
                   outcome_timeout_s=1).__enter__()
""",
}


def directives(n: int) -> list[tuple[str, str]]:
    """``n`` heartbeats of one node through the core: the directives topic as the job writes it."""
    engine, out = Engine(Policy(directive_interval_ms=0)), []
    for i in range(n):
        beat = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n1", "incarnation": 1, "seq": i + 1,
                "wall_ms": 1_700_000_000_000 + 1_000 * i, "mvcc_now": 1_000 + i}
        out += [(o.key, encode(o.value)) for o in engine.process(encode(beat), Position("events", 0, i))
                if o.channel == DIRECTIVES]
    assert out
    return out


@pytest.fixture(scope="module")
def settings(broker: Any) -> Any:
    tag = unique("idle")
    s = load_settings(flags={"bootstrap": broker.bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.ctl",
                             "directives_topic": f"{tag}.d", "alerts_topic": f"{tag}.a", "deadletter_topic": f"{tag}.dl",
                             "status_topic": f"{tag}.status"}, environ={})
    ensure_topics(s.librdkafka(), topic_specs(s.topics(), 2, log_append_time=False))
    produce(broker.bootstrap, s.directives_topic, directives(50))
    produce(broker.bootstrap, s.alerts_topic, [("c1", encode({"v": 1, "type": "alert", "cluster": "c1", "id": "paused/-",
                                                              "kind": "paused", "state": "raised", "node": None}))])
    produce(broker.bootstrap, s.status_topic, [("%job", encode({"type": "job_status", "active": True}))])
    return s


FOLLOWERS = {
    "audit": """
from safepoint.ops.audit import follow_and_audit
threading.Thread(target=lambda: follow_and_audit(S, alerts=False, out=open("/dev/null", "w")), daemon=True).start()
time.sleep(2)
""",  # follows the events topic
    "listener-confluent": CONSUMERS["listener-confluent"],  # these follow the directives topic
    "listener-kafka-python": CONSUMERS["listener-kafka-python"],
    "view": CONSUMERS["view"],
}
EVENTS_PER_S, DIRECTIVES_PER_S = 300, 10  # while the growing topics are measured


def child_code(settings: Any, body: str, ready: Any) -> str:
    return "\n".join([
        "import threading, time, sys",
        "from safepoint.settings import load_settings",
        f"S = load_settings(flags={{'bootstrap': {settings.bootstrap!r}, 'events_topic': {settings.events_topic!r}, "
        f"'control_topic': {settings.control_topic!r}, "
        f"'directives_topic': {settings.directives_topic!r}, 'alerts_topic': {settings.alerts_topic!r}, "
        f"'status_topic': {settings.status_topic!r}}}, environ={{}})",
        "B = S.bootstrap",
        body,
        f"open({str(ready)!r}, 'w').close()",
        "time.sleep(600)",
    ])


Children = dict[str, tuple[subprocess.Popen[bytes], Path]]


@contextmanager
def started(settings: Any, bodies: dict[str, str], tmp_path: Path) -> Iterator[Children]:
    """Each body in a child process of its own (with the file it creates once caught up); killed on exit."""
    children: Children = {}
    try:
        for kind, body in bodies.items():
            ready = tmp_path / f"{kind}.ready"
            children[kind] = (subprocess.Popen([sys.executable, "-c", child_code(settings, body, ready)],
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT), ready)
        yield children
    finally:
        for child, _ in children.values():
            child.kill()
            child.wait(10)


def measure(children: Children, broker: Any, broker_limit: float, during: Any = None) -> None:
    """Wait until every child is ready, then read each one's CPU and the broker's over ``MEASURE_S``
    (``during``: a callable writing to the topics meanwhile, in this process)."""
    deadline = time.monotonic() + 60
    for kind, (child, ready) in children.items():
        while not ready.exists():
            assert child.poll() is None, child.stdout.read().decode() if child.stdout else ""
            assert time.monotonic() < deadline, f"{kind} did not catch up"
            time.sleep(0.1)
    time.sleep(1.0)  # let the last fetches settle
    procs = {kind: psutil.Process(child.pid) for kind, (child, _) in children.items()}
    brk = psutil.Process(broker.proc.pid) if getattr(broker, "proc", None) is not None else None
    c0, b0 = {k: p.cpu_times() for k, p in procs.items()}, brk.cpu_times() if brk else None
    t0 = time.monotonic()
    if during is not None:
        during()
    else:
        time.sleep(MEASURE_S)
    took = time.monotonic() - t0
    c1, b1 = {k: p.cpu_times() for k, p in procs.items()}, brk.cpu_times() if brk else None
    used = {k: (c1[k].user + c1[k].system - c0[k].user - c0[k].system) / took for k in procs}
    print(", ".join(f"{k} {u:.1%}" for k, u in used.items()), end="")
    assert all(u < LIMIT for u in used.values()), f"of a core: {used}"
    if b0 is not None and b1 is not None:
        served = (b1.user + b1.system - b0.user - b0.system) / took
        print(f", broker {served:.1%}")
        assert served < broker_limit, f"serving {sorted(children)}, the broker used {served:.0%} of a core"


def test_consumers_of_growing_topics_stay_idle(settings: Any, broker: Any, tmp_path: Any) -> None:
    """The topics keep growing while the consumers are measured (all at once, each in its own
    process): they read in rounds, not in a spin."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    beat = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": "n9", "incarnation": 1, "mvcc_now": 5}
    later = json.loads(directives(60)[-1][1])

    def write() -> None:
        begun, sent = time.monotonic(), 0
        while time.monotonic() - begun < MEASURE_S:
            due = int((time.monotonic() - begun) * EVENTS_PER_S)
            for i in range(sent, due):
                producer.produce(settings.events_topic, key="n9", value=encode({**beat, "seq": i, "wall_ms": 1_700_000_000_000 + i}))
                if i % (EVENTS_PER_S // DIRECTIVES_PER_S) == 0:
                    producer.produce(settings.directives_topic, key="c1", value=encode({**later, "seq": later["seq"] + 1 + i}))
            sent = due
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(10)

    with started(settings, FOLLOWERS, tmp_path) as children:
        measure(children, broker, GROWING_BROKER_LIMIT, write)


def test_caught_up_consumers_stay_idle(settings: Any, broker: Any, tmp_path: Any) -> None:
    """Every consumer at once, each in its own process, on topics that hold data and stay still."""
    with started(settings, CONSUMERS, tmp_path) as children:
        measure(children, broker, BROKER_LIMIT)
