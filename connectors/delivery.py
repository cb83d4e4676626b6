"""Reading directives on a node and delivering them to its handler in a background thread.

``consumer_conf`` is the consumer a listener reads the compacted topic with. A handler that raises is retried every ``retry_backoff_s`` until it succeeds or a newer directive
supersedes the one it failed on: a node applies the newest safe point it can, never a stale one
after a newer one, and never skips the newest.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from safepoint.errors import ClientClosed, SafepointError

__all__ = ["RECEIVE_MESSAGE_MAX_BYTES", "consumer_conf", "deliver_until_stopped"]

log = logging.getLogger("safepoint.listener")

D = TypeVar("D")

RECEIVE_MESSAGE_MAX_BYTES = 1_000_000_000
"""The consumer's ``receive.message.max.bytes``: the embedded broker ignores fetch size limits and
may answer one fetch with the whole backlog (a directive's ``basis`` names every node)."""


def consumer_conf(bootstrap: str, client_id: str, logger: str, kafka_conf: Mapping[str, Any] | None) -> dict[str, Any]:
    """A consumer that reads a compacted topic from the beginning with ``assign()`` only."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        # librdkafka wants a group.id even for a consumer that only assign()s; it never joins
        # the group and never commits offsets.
        "group.id": f"{client_id}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
        "client.id": client_id,
        "logger": logging.getLogger(logger),
    }
    conf.update(kafka_conf or {})
    return conf


def deliver_until_stopped(
    poll: Callable[[float], D | None],
    handler: Callable[[D], object],
    stop: threading.Event,
    retry_backoff_s: float,
    on_failure: Callable[[D], None],
) -> None:
    """Poll and hand each new directive to ``handler`` until ``stop`` is set or the source closes.
    ``on_failure(directive)`` runs inside the ``except`` of a failed call (it may log the traceback)."""
    pending: D | None = None
    while not stop.is_set():
        try:
            newer = poll(0.2 if pending is None else retry_backoff_s)
        except ClientClosed:
            return
        except SafepointError as exc:
            log.warning("directive listener: %s; retrying", exc)
            stop.wait(retry_backoff_s)
            continue
        if newer is not None:
            pending = newer
        if pending is None:
            continue
        current = pending
        try:
            handler(current)
            pending = None
        except Exception:
            on_failure(current)
