"""``ServiceHold``: a backup's, a changefeed's or a migration's pin on a cluster's history.

    with ServiceHold("kafka:9092", cluster="c1", holder="backup-nightly", ts=snapshot_ts,
                     ttl_ms=600_000, label="full backup to s3"):
        run_the_backup()          # the safe point stays at or below snapshot_ts meanwhile

On entry it publishes a ``service_hold`` event and waits for the broker's acknowledgement (a
hold the job never saw protects nothing); a thread renews it every ``ttl_ms / 3`` (a process
that dies stops renewing, and the job drops the hold one TTL later with an alert); on exit it
publishes ``service_release``. ``advance(ts)`` moves the hold forward (a changefeed's progress).
The job refuses a hold below its current safe point (``service_hold_refused`` alert): take the
``ts`` from a reader the database protects, or from ``DirectiveListener.safe_ts`` or later.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from safepoint.connectors.producer import make_producer, producer_conf
from safepoint.core.codec import encode
from safepoint.errors import BrokerError

__all__ = ["ServiceHold"]

log = logging.getLogger(__name__)


class ServiceHold:
    def __init__(self, bootstrap: str, cluster: str, holder: str, ts: int, ttl_ms: int, *, label: str | None = None,
                 events_topic: str = "safepoint.events", renew_every_s: float | None = None, client: str = "confluent",
                 conf: dict[str, Any] | None = None, ack_timeout_s: float = 15.0) -> None:
        if ttl_ms < 1:
            msg = f"ttl_ms must be at least 1, got {ttl_ms}"
            raise ValueError(msg)
        self.cluster, self.holder, self.ts, self.ttl_ms, self.label = cluster, holder, ts, ttl_ms, label
        self.topic = events_topic
        self.renew_every_s = renew_every_s if renew_every_s is not None else ttl_ms / 3000
        self.ack_timeout_s = ack_timeout_s
        self.producer = make_producer(client, producer_conf({"bootstrap.servers": bootstrap, **(conf or {})}, linger_ms=0))
        self.renewals = 0
        self.failures = 0
        self._last_wall = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _wall(self) -> int:
        """The event's wall_ms, always above the last one sent (the job orders a holder's events by it)."""
        self._last_wall = max(time.time_ns() // 1_000_000, self._last_wall + 1)
        return self._last_wall

    def _publish(self, kind: str, wait: bool) -> None:
        with self._lock:
            event: dict[str, Any] = {"v": 1, "type": kind, "cluster": self.cluster, "wall_ms": self._wall(),
                                     "holder": self.holder}
            if kind == "service_hold":
                event.update(ts=self.ts, ttl_ms=self.ttl_ms, **({"label": self.label} if self.label else {}))
            errors: list[Any] = []
            self.producer.produce(self.topic, key=self.cluster.encode(), value=encode(event).encode(),
                                  on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
            if wait:
                left = self.producer.flush(self.ack_timeout_s)
                if left or errors:
                    msg = f"{kind} of {self.holder} was not acknowledged: {errors or 'timed out'}"
                    raise BrokerError(msg)
            else:
                self.producer.poll(0)

    def __enter__(self) -> ServiceHold:
        self._publish("service_hold", wait=True)
        self._thread = threading.Thread(target=self._renew, name=f"service-hold-{self.holder}", daemon=True)
        self._thread.start()
        return self

    def advance(self, ts: int) -> None:
        """Move the hold to ``ts`` (it only protects what is at or above it) and renew it now."""
        self.ts = ts
        self._publish("service_hold", wait=True)

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                self._publish("service_hold", wait=True)
                self.renewals += 1
            except Exception:  # keep trying: the TTL is the margin for a broker that is away for a while
                self.failures += 1
                log.warning("renewal of service hold %s failed; retrying in %.1f s", self.holder, self.renew_every_s,
                            exc_info=True)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop renewing and release the hold (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.ack_timeout_s)
        self._publish("service_release", wait=True)
