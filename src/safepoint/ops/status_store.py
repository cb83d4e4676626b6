"""The status as the job publishes it, followed from its compacted topic.

``StatusStore`` reads the status topic from its beginning (no consumer group: it never disturbs the
job or another viewer) and keeps the latest part of every key: ``cluster`` (the cluster's own
part), ``cluster/node`` (a node's part), each name escaped as ``core/status.status_key`` writes
it, and ``%job`` (the job driver's progress). ``status(c)`` joins a cluster's parts with
``core/status.assemble``, the function ``replay --status`` uses. For the dashboard it also keeps
each cluster's recent safe point and lag, one point per cluster part (at most ``history`` points).

A record the job would not write under its key (not JSON, not its schema, another cluster's or
node's name than the key's) is skipped and counted by reason (``skipped``); the follower goes on.
The follower is **stalled** when its thread ended or it has not reached the broker for
``STALL_S`` seconds: ``stalled()`` says why, and ``/healthz`` reports it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from functools import cache
from typing import Any

import fastjsonschema

from safepoint.core.ids import split_id
from safepoint.core.status import assemble
from safepoint.schemas import load

__all__ = ["JOB_KEY", "STALL_S", "StatusStore"]

JOB_KEY = "%job"
"""Key of the job driver's progress record in the status topic (no escaped cluster name is ``%job``)."""
STALL_S = 30.0
"""A follower that has not reached the broker for this long is stalled."""
log = logging.getLogger(__name__)


@cache
def _validator(name: str) -> Any:
    schema = {k: v for k, v in load("outputs", name).items() if k != "$id"}  # its refs are local (#/definitions)
    return fastjsonschema.compile(schema)


def _problem(key: str, value: Any) -> str | None:
    """Why ``value`` is not a record the job writes under ``key`` (None: it is)."""
    if not isinstance(value, dict):
        return "not_an_object"
    if key == JOB_KEY:
        return None if value.get("type") == "job_status" else "wrong_type"
    parts = split_id(key)
    if len(parts) > 2:
        return "bad_key"
    want = "node_status" if len(parts) == 2 else "cluster_status"
    if value.get("type") != want:
        return "wrong_type"
    try:
        _validator(want)(value)
    except fastjsonschema.JsonSchemaException:
        return "invalid"
    if value["cluster"] != parts[0] or (len(parts) == 2 and value["node"] != parts[1]):
        return "key_mismatch"
    return None


class StatusStore:
    def __init__(self, history: int = 600, stall_s: float = STALL_S) -> None:
        self._lock = threading.Lock()
        self._clusters: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, dict[str, Any]]] = {}
        self._history: dict[str, deque[dict[str, Any]]] = {}
        self._history_len = history
        self.stall_s = stall_s
        self.job: dict[str, Any] | None = None
        self.messages = 0
        self.bad = 0
        self.skipped: dict[str, int] = {}
        """Records left out, by reason: not_json, not_an_object, wrong_type, invalid, key_mismatch, bad_key, no_key."""
        self.updated_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower: Any = None
        self._started: float | None = None
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
            cluster, node = (split_id(key) + [""])[:2]
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
        """One record as read from the topic; one the job would not write under ``key`` is skipped
        and counted (``skipped``, ``/healthz``), never applied."""
        if key is None:
            self._skip("no_key")
            return
        name = key.decode("utf-8", "replace")
        if value is None:
            if len(split_id(name)) <= 2:
                self.apply(name, None)
            return
        try:
            parsed = json.loads(value)
        except ValueError:
            self._skip("not_json")
            return
        problem = _problem(name, parsed)
        if problem is not None:
            self._skip(problem)
            return
        try:
            self.apply(name, parsed)
        except Exception:  # a record its schema admits but the join cannot use: left out, counted
            log.exception("status record under %r left out", name)
            self._skip("invalid")

    def _skip(self, reason: str) -> None:
        with self._lock:
            self.bad += 1
            self.skipped[reason] = self.skipped.get(reason, 0) + 1

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
    def follow(self, conf: dict[str, Any], topic: str) -> None:
        """Read ``topic`` from its beginning into this store in a daemon thread, until ``close``."""
        from safepoint.connectors.kafka.follow import TopicFollower

        self._follower = TopicFollower(conf, topic, client_id="safepoint-status")
        self._thread = threading.Thread(target=self._run, name="status-follow", daemon=True)
        self._started = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        follower = self._follower
        try:
            while not self._stop.is_set():
                for msg in follower.poll(0.5):
                    self.apply_raw(msg.key(), msg.value())
                self.error = follower.error
        except Exception as exc:  # not expected (poll and apply_raw keep their own errors): /healthz says stalled
            self.error = f"the status follower stopped: {exc}"
            log.exception("status follower stopped")
        finally:
            follower.close()

    def stalled(self, now: float | None = None) -> str | None:
        """Why the follower is stalled (its thread ended, or no poll reached the broker for
        ``stall_s``), or None: following, or not asked to follow."""
        if self._thread is None or self._stop.is_set():
            return None
        if not self._thread.is_alive():
            return self.error or "the status follower stopped"
        last = self._follower.last_poll if self._follower is not None else None
        started = self._started if self._started is not None else time.monotonic()
        since = (now if now is not None else time.monotonic()) - (last if last is not None else started)
        if since > self.stall_s:
            return f"no read of the status topic for {since:.0f} s" + (f": {self.error}" if self.error else "")
        return None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
