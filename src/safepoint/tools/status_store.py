"""The status as the job publishes it, followed from its compacted topic.

``StatusStore`` reads the status topic from its beginning (no consumer group: it never disturbs the
job or another viewer) and keeps the latest part of every key: ``cluster`` (the cluster stage's
part), ``cluster/node`` (a node's part) and ``_job`` (the job driver's progress). ``status(c)``
joins a cluster's parts with ``core/status.assemble``, the function ``replay --status`` uses.
For the dashboard it also keeps each cluster's recent safe point and lag, one point per cluster
part (at most ``history`` points).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from safepoint.core.status import assemble

__all__ = ["JOB_KEY", "StatusStore"]

JOB_KEY = "_job"
"""Key of the job driver's progress record in the status topic."""
log = logging.getLogger(__name__)


class StatusStore:
    def __init__(self, history: int = 600) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, dict[str, Any]]] = {}
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._history_len = history
        self.job: dict[str, Any] | None = None
        self.messages = 0
        self.bad = 0
        self.updated_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    # -- applying records ---------------------------------------------------------------------
    def apply(self, key: str, value: dict[str, Any] | None) -> None:
        """One record of the status topic (``value`` None: a tombstone, the key is dropped)."""
        with self._lock:
            self.messages += 1
            self.updated_at = time.monotonic()
            if key == JOB_KEY:
                self.job = value
                return
            cluster, _, node = key.partition("/")
            if node:
                nodes = self._nodes.setdefault(cluster, {})
                if value is None:
                    nodes.pop(node, None)
                else:
                    nodes[node] = value
                return
            if value is None:
                self._clusters.pop(cluster, None)
                return
            self._clusters[cluster] = value
            full = assemble(value, self._nodes.get(cluster, {}).values())
            points = self._history.setdefault(cluster, deque(maxlen=self._history_len))
            point = {"cluster_wall_ms": value.get("cluster_wall_ms"), "safe_ts": value.get("safe_ts"),
                     "lag": full["lag"], "aborted": value.get("round", {}).get("aborted")}
            if points and points[-1]["cluster_wall_ms"] == point["cluster_wall_ms"]:
                points[-1] = point
            else:
                points.append(point)

    def apply_raw(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            self.bad += 1
            return
        try:
            parsed = None if value is None else json.loads(value)
        except ValueError:
            self.bad += 1
            return
        name = key.decode("utf-8", "replace")
        want = "job_status" if name == JOB_KEY else "node_status" if "/" in name else "cluster_status"
        if parsed is not None and (not isinstance(parsed, dict) or parsed.get("type") != want):
            self.bad += 1  # not a record the job writes under this key: left out, counted (/healthz)
            return
        self.apply(name, parsed)

    # -- reading ------------------------------------------------------------------------------
    def clusters(self) -> list[str]:
        with self._lock:
            return sorted(self._clusters)

    def status(self, cluster: str) -> dict[str, Any] | None:
        with self._lock:
            part = self._clusters.get(cluster)
            if part is None:
                return None
            return assemble(part, list(self._nodes.get(cluster, {}).values()))

    def all(self) -> list[dict[str, Any]]:
        return [s for s in (self.status(c) for c in self.clusters()) if s is not None]

    def history(self, cluster: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._history.get(cluster, ()))

    # -- following the topic ------------------------------------------------------------------
    def follow(self, conf: dict[str, Any], topic: str, ready: Callable[[], None] | None = None) -> None:
        """Read ``topic`` from its beginning into this store in a daemon thread, until ``close``."""
        self._thread = threading.Thread(target=self._run, args=(conf, topic), name="status-follow", daemon=True)
        self._thread.start()

    def _run(self, conf: dict[str, Any], topic: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({**conf, "group.id": f"safepoint-status-{time.time_ns()}", "enable.auto.commit": False,
                             "receive.message.max.bytes": 1_000_000_000})
        try:
            assigned = False
            while not self._stop.is_set():
                if not assigned:
                    md = consumer.list_topics(topic, timeout=5).topics.get(topic)
                    if md is None or md.error is not None or not md.partitions:
                        self.error = f"status topic {topic} not found yet"
                        self._stop.wait(1.0)
                        continue
                    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(md.partitions)])
                    assigned, self.error = True, None
                for msg in consumer.consume(500, 0.2):
                    if msg.error() is None:
                        self.apply_raw(msg.key(), msg.value())
        except Exception as exc:  # keep the server answering; /healthz says why the status stopped
            self.error = f"reading the status topic failed: {exc}"
            log.exception("status follower stopped")
        finally:
            consumer.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
