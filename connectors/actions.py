"""The operator's actions through the log: one publisher, and learning what the job did with them.

Every control event (``service_hold``, ``service_release``, ``pause``, ``resume``, ``gap_ack``) goes
to the control topic (``safepoint.control`` by default; ``core/origin.py``) keyed by its cluster, with an ``action_id`` of its own (a uuid4). The job applies
control events in log order and writes each action's outcome (``applied``, ``refused``,
``ignored``; ``expired`` once a hold it set ran out) in the cluster's status (``actions``).

* ``ControlPublisher`` builds, checks and publishes control events and waits for the broker's
  acknowledgement; the CLI, the HTTP API and ``ServiceHold`` all publish through it.
* ``ActionOutcomes`` follows the status topic from its end (start it before publishing) and
  answers the outcome of the actions it watches, idle when nothing new comes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from safepoint.connectors.kafka.producer import make_producer, producer_conf
from safepoint.core.codec import encode
from safepoint.core.ids import CLUSTER_HEADER, escape
from safepoint.core.signing import sign
from safepoint.errors import BrokerError, SafepointError

__all__ = ["LOST", "ActionOutcomes", "ActionRefused", "ControlPublisher", "new_action_id"]

log = logging.getLogger("safepoint.control")

LOST = ("refused", "expired")
"""Outcomes after which a hold the action set or moved does not protect anything (the CLI exits 1,
``ServiceHold`` raises or reports it lost)."""


class ActionRefused(SafepointError):
    """The job refused a control action (a service hold below a bound it already sent)."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__(f"{outcome.get('type')} {outcome.get('id')} refused: {outcome.get('detail')}")
        self.outcome = outcome


def new_action_id() -> str:
    return uuid.uuid4().hex


class ControlPublisher:
    """Publishes control events to ``control_topic`` (``client``: ``confluent`` or ``kafka-python``)."""

    def __init__(self, conf: Mapping[str, Any], control_topic: str, *, client: str = "confluent",
                 ack_timeout_s: float = 15.0, max_message_bytes: int = 1_000_000,
                 signer: Callable[[str], str | None] | None = None) -> None:
        """``signer(cluster)``: the control key that signs the cluster's events (``core/signing.py``),
        or None to publish them unsigned."""
        self.topic, self.ack_timeout_s, self.max_message_bytes = control_topic, ack_timeout_s, max_message_bytes
        self.signer = signer
        self.bootstrap = conf.get("bootstrap.servers")
        self.producer = make_producer(client, producer_conf({"message.timeout.ms": int(ack_timeout_s * 1000), **conf},
                                                            linger_ms=0))
        self._lock = threading.Lock()

    @staticmethod
    def event(kind: str, cluster: str, **fields: Any) -> dict[str, Any]:
        """A control event with a fresh ``action_id`` (``fields`` that are None are left out)."""
        return {"v": 1, "type": kind, "cluster": cluster, "wall_ms": time.time_ns() // 1_000_000,
                "action_id": new_action_id(), **{k: v for k, v in fields.items() if v is not None}}

    def publish(self, event: dict[str, Any]) -> str:
        """Check ``event`` against the contract, publish it and wait for the broker's
        acknowledgement; returns its ``action_id``. ``BrokerError`` when it was not acknowledged."""
        from safepoint.core.events import parse

        event.setdefault("action_id", new_action_id())
        key = self.signer(event["cluster"]) if self.signer is not None else None
        if key:
            event["sig"] = sign(event, key)
        value = encode(event)
        checked = parse(value, self.max_message_bytes)
        if not isinstance(checked, dict):
            msg = f"invalid {event.get('type')} event: {checked.error}"
            raise SafepointError(msg)
        errors: list[Any] = []
        with self._lock:
            self.producer.produce(self.topic, key=event["cluster"].encode(), value=value.encode(),
                                  headers=[(CLUSTER_HEADER, event["cluster"].encode())],
                                  on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
            left = self.producer.flush(self.ack_timeout_s)
        if left or errors:
            msg = (f"the {event['type']} event was not acknowledged by {self.bootstrap}: "
                   f"{[str(e) for e in errors] or 'timed out'}")
            raise BrokerError(msg)
        return str(event["action_id"])

    def close(self) -> None:
        with self._lock:
            self.producer.flush(self.ack_timeout_s)


class ActionOutcomes:
    """The outcomes of watched actions of ``cluster``, from the status topic as the job writes it
    from now on. ``available`` is False (and ``why`` says so) when the status topic cannot be
    read: the job runs without a status, or confluent-kafka is not installed."""

    def __init__(self, conf: Mapping[str, Any], status_topic: str, cluster: str, *, idle_s: float = 0.25) -> None:
        self.cluster, self.key = cluster, escape(cluster).encode()
        self.outcomes: dict[str, dict[str, Any]] = {}
        self._watched: set[str] = set()
        self._follower: Any = None
        self.why: str | None = None
        if not status_topic:
            self.why = "no status topic is configured"
            return
        try:
            from safepoint.connectors.kafka.follow import TopicFollower
        except ImportError:  # a node with kafka-python only
            self.why = "following the status topic needs confluent-kafka"
            return
        self._follower = TopicFollower(conf, status_topic, start="end", idle_s=idle_s, client_id="safepoint-outcomes")
        if not self._follower.open():
            self.why = self._follower.error
            self._follower.close()
            self._follower = None

    @property
    def available(self) -> bool:
        return self._follower is not None

    def watch(self, action_id: str) -> None:
        self._watched.add(action_id)

    def poll(self, timeout_s: float = 0.0) -> list[dict[str, Any]]:
        """Outcomes of watched actions that are new or changed since the last poll."""
        if self._follower is None:
            if timeout_s:
                time.sleep(timeout_s)
            return []
        changed: list[dict[str, Any]] = []
        for msg in self._follower.poll(timeout_s):
            if msg.key() != self.key or msg.value() is None:
                continue
            try:
                status = json.loads(msg.value())
                actions = status.get("actions") or [] if status.get("type") == "cluster_status" else []
                for a in actions:
                    aid = a.get("id")
                    if aid in self._watched and self.outcomes.get(aid) != a:
                        self.outcomes[aid] = a
                        changed.append(a)
            except (ValueError, AttributeError, TypeError):  # not a record of the job's: not ours to judge here
                continue
        return changed

    def wait(self, action_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The action's outcome, waiting up to ``timeout_s`` for the job to report it (None: not in time)."""
        self.watch(action_id)
        deadline = time.monotonic() + timeout_s
        while action_id not in self.outcomes:
            left = deadline - time.monotonic()
            if left <= 0 or self._follower is None:
                return None
            self.poll(min(0.5, left))
        return self.outcomes[action_id]

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
            self._follower = None
