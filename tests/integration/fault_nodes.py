"""Database nodes for the fault tests: each a ``Reporter`` and its ``DirectiveListener``, opening and
closing readers in a thread, and the checks every fault must pass (``check_nodes``): every listener saw
``seq`` and ``safe_ts`` only move forward, and no directive passed a reader open on its node when it
arrived. Used by the broker faults on loopback (test_kafka_failover.py) and on containers
(test_container_faults.py, test_compose.py)."""

from __future__ import annotations

import random
import threading
import time

from safepoint.connectors.listener import Directive, DirectiveListener
from safepoint.connectors.reporter import Reporter


def mvcc() -> int:
    return time.time_ns() // 1_000  # one MVCC clock for the nodes: microseconds


class ReaderNode:
    """A database node: a reporter and its listener, opening and closing readers in a thread."""

    def __init__(self, bootstrap: str, name: str, events_topic: str, directives_topic: str, cluster: str = "c1",
                 heartbeat_interval_s: float = 0.3) -> None:
        self.name = name
        self.reporter = Reporter(bootstrap, name, mvcc_clock=mvcc, cluster=cluster, incarnation=1,
                                 heartbeat_interval_s=heartbeat_interval_s, topic=events_topic)
        self.seen: list[tuple[float, Directive]] = []
        self.listener = DirectiveListener(bootstrap, topic=directives_topic, cluster=cluster, reporter=self.reporter,
                                          on_directive=lambda d: self.seen.append((time.monotonic(), d))).start()
        self.readers: list[list[float]] = []
        """[read_ts, opened, closed or inf] of every reader, in monotonic seconds."""
        self.refused = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._work, daemon=True, name=f"node-{name}")

    def _work(self) -> None:
        rng = random.Random(self.name)
        while not self.stop.is_set():
            try:
                reader = self.reporter.reader(label="report").open()
            except Exception:  # noqa: BLE001 - refused below the safe point: counted, never the test's failure
                self.refused += 1
                self.stop.wait(0.1)
                continue
            entry = [float(reader.read_ts), time.monotonic(), float("inf")]
            self.readers.append(entry)
            self.stop.wait(rng.uniform(0.3, 2.0))
            entry[2] = time.monotonic()  # before the close leaves: it still holds until then
            reader.close()
            self.stop.wait(rng.uniform(0.0, 0.3))

    def directives_since(self, t: float) -> int:
        return sum(1 for arrived, _ in self.seen if arrived > t)

    def last_seq(self) -> int:
        return self.seen[-1][1].seq if self.seen else 0

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.listener.close()
        self.reporter.close()


def check_nodes(nodes: list[ReaderNode], min_readers: int = 30) -> None:
    """Every listener saw seq and safe_ts only move forward; no directive passed a reader open when it
    arrived (a reader counts from before its open was sent until after its close was)."""
    readers = [r for n in nodes for r in n.readers]
    for n in nodes:
        seqs = [d.seq for _, d in n.seen]
        safe = [d.safe_ts for _, d in n.seen]
        assert seqs == sorted(set(seqs)), f"{n.name}: seq went back or repeated: {seqs}"
        assert safe == sorted(safe), f"{n.name}: safe_ts went back: {safe}"
        for arrived, d in n.seen:
            passed = [r for r in readers if r[1] < arrived < r[2] and r[0] < d.safe_ts]
            assert not passed, f"{n.name}: directive seq {d.seq} safe_ts {d.safe_ts} passed open readers {passed[:3]}"
    assert len(readers) >= min_readers, f"the nodes opened {len(readers)} readers"


def stop_all(nodes: list[ReaderNode]) -> None:
    for n in nodes:
        n.stop.set()


def close_all(nodes: list[ReaderNode]) -> None:
    for n in nodes:
        n.close()


__all__ = ["ReaderNode", "check_nodes", "close_all", "mvcc", "stop_all"]
