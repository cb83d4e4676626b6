"""``ServiceHold``: a backup's, a changefeed's or a migration's pin on a cluster's history.

    with ServiceHold("kafka:9092", cluster="c1", holder="backup-nightly", ts=snapshot_ts,
                     ttl_ms=600_000, label="full backup to s3") as hold:
        run_the_backup()          # the safe point stays at or below snapshot_ts meanwhile
        hold.check()              # raises HoldLost if the job refused or expired the hold

On entry it publishes a ``service_hold`` event (through ``connectors/actions.py``, with an
``action_id``), waits for the broker's acknowledgement (a hold the job never saw protects
nothing) and then for the job's outcome in the cluster's status (``outcome_timeout_s``): a hold
the job refuses raises ``HoldRefused`` (its ``ts`` lies below a bound already sent: that history
may be compacted). A thread renews it every ``ttl_ms / 3`` and watches the outcome of every
renewal: when the job refuses or expires the hold, ``lost`` holds the outcome, ``on_lost`` is
called with it (from the thread) and ``check()`` raises ``HoldLost``. A process that dies stops
renewing, and the job drops the hold one TTL of cluster time later with an alert. On exit it
publishes ``service_release``. ``advance(ts)`` moves the hold forward (a changefeed's progress).
Take the ``ts`` from a reader the database protects, or from ``DirectiveListener.safe_ts`` or later.

The hold has an owner: the digest of ``owner_token`` (a fresh one unless given) rides on every set
and renewal, the token on the release, so no other publisher renews, moves or releases it without
an operator's ``force`` (``core/control.py``).

With ``control_key`` every event of the hold is signed with it (the cluster's ``control_keys``:
``core/signing.py``); a job that has keys refuses unsigned ones.

Without a status topic (``status_topic=""``, or a job that runs without one) nothing reports an
outcome: the hold is published and renewed as before, and ``outcomes_available`` is False.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from safepoint.connectors.actions import LOST, ActionOutcomes, ActionRefused, ControlPublisher
from safepoint.core.signing import owner_digest
from safepoint.errors import SafepointError

if TYPE_CHECKING:
    from safepoint.settings import Settings

__all__ = ["HoldLost", "HoldRefused", "ServiceHold"]

log = logging.getLogger(__name__)


class HoldRefused(ActionRefused):
    """The job refused the service hold (``outcome`` says why)."""


class HoldLost(SafepointError):
    """The job no longer holds the service hold: a renewal or move was refused, or it expired."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__(f"service hold {outcome.get('holder')} {outcome.get('outcome')}: {outcome.get('detail')}")
        self.outcome = outcome


class ServiceHold:
    def __init__(self, bootstrap: str, cluster: str, holder: str, ts: int, ttl_ms: int, *, label: str | None = None,
                 control_topic: str = "safepoint.control", status_topic: str = "safepoint.status",
                 renew_every_s: float | None = None, client: str = "confluent", conf: dict[str, Any] | None = None,
                 ack_timeout_s: float = 15.0, outcome_timeout_s: float = 30.0,
                 on_lost: Callable[[dict[str, Any]], None] | None = None, control_key: str | None = None,
                 owner_token: str | None = None) -> None:
        if ttl_ms < 1:
            msg = f"ttl_ms must be at least 1, got {ttl_ms}"
            raise ValueError(msg)
        self.cluster, self.holder, self.ts, self.ttl_ms, self.label = cluster, holder, ts, ttl_ms, label
        self.owner_token = owner_token or secrets.token_hex(16)
        """The hold's owner token: its digest rides on every set, the token itself on the release (a
        process that takes over the hold after a restart passes it back as ``owner_token``)."""
        self.renew_every_s = renew_every_s if renew_every_s is not None else ttl_ms / 3000
        self.outcome_timeout_s = outcome_timeout_s
        self.on_lost = on_lost
        kafka = {"bootstrap.servers": bootstrap, **(conf or {})}
        self.publisher = ControlPublisher(kafka, control_topic, client=client, ack_timeout_s=ack_timeout_s,
                                          signer=(lambda _cluster: control_key) if control_key else None)
        self._kafka, self._status_topic = kafka, status_topic
        self.outcomes: ActionOutcomes | None = None
        self.renewals = 0
        self.failures = 0
        self.last_outcome: dict[str, Any] | None = None
        """The job's outcome of this hold's newest action it reported."""
        self.lost: dict[str, Any] | None = None
        """The outcome that ended the hold (refused or expired), or None while the job holds it."""
        self._mine: list[str] = []
        self._lock = threading.Lock()
        self._polling = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings, cluster: str, holder: str, ts: int, ttl_ms: int,
                      **kwargs: Any) -> ServiceHold:
        """A hold on the deployment ``settings`` describe: its bootstrap, control and status topics, Kafka
        client and the extra Kafka keys of its ``[kafka]`` table (SASL, TLS)."""
        conf = settings.librdkafka()
        conf.update(kwargs.pop("conf", None) or {})
        kwargs.setdefault("client", settings.client)
        kwargs.setdefault("control_topic", settings.control_topic)
        kwargs.setdefault("status_topic", settings.status_topic)
        return cls(conf.pop("bootstrap.servers"), cluster, holder, ts, ttl_ms, conf=conf, **kwargs)

    @property
    def outcomes_available(self) -> bool:
        return self.outcomes is not None and self.outcomes.available

    def _publish(self, kind: str) -> str:
        fields: dict[str, Any] = {"holder": self.holder}
        if kind == "service_hold":
            fields.update(ts=self.ts, ttl_ms=self.ttl_ms, label=self.label, owner=owner_digest(self.owner_token))
        else:
            fields["owner_token"] = self.owner_token
        event = ControlPublisher.event(kind, self.cluster, **fields)
        with self._lock:
            if self.outcomes is not None:
                self.outcomes.watch(event["action_id"])
            self._mine = [*self._mine[-15:], event["action_id"]]  # the newest actions' outcomes are watched
        return self.publisher.publish(event)

    def __enter__(self) -> ServiceHold:
        if self._status_topic:
            self.outcomes = ActionOutcomes(self._kafka, self._status_topic, self.cluster)  # before publishing
            if not self.outcomes.available:
                log.warning("service hold %s: the job's outcomes cannot be followed (%s); publishing without them",
                            self.holder, self.outcomes.why)
        aid = self._publish("service_hold")
        if self.outcomes_available:
            assert self.outcomes is not None
            outcome = self.outcomes.wait(aid, self.outcome_timeout_s)
            if outcome is None:
                log.warning("service hold %s: no outcome from the job within %.0f s (is it running?); renewing meanwhile",
                            self.holder, self.outcome_timeout_s)
            else:
                self.last_outcome = outcome
                if outcome["outcome"] in LOST:
                    self._end_quietly()
                    raise HoldRefused(outcome)
        self._thread = threading.Thread(target=self._renew, name=f"service-hold-{self.holder}", daemon=True)
        self._thread.start()
        return self

    def advance(self, ts: int) -> None:
        """Move the hold to ``ts`` (it only protects what is at or above it) and renew it now."""
        self.ts = ts
        self._publish("service_hold")

    def check(self) -> None:
        """Raise ``HoldLost`` if the job refused or expired this hold since it was set."""
        self._watch(0.0)
        if self.lost is not None:
            raise HoldLost(self.lost)

    def _watch(self, timeout_s: float) -> None:
        if self.outcomes is None:
            return
        with self._polling:  # check() and the renewal thread share one follower
            changed = self.outcomes.poll(timeout_s)
        with self._lock:
            mine = list(self._mine)
        newest = [o for o in changed if o["id"] in mine and o["type"] == "service_hold"]
        for outcome in newest:
            self.last_outcome = outcome
            if outcome["outcome"] in LOST and self.lost is None:
                self.lost = outcome
                log.error("service hold %s %s by the job: %s", self.holder, outcome["outcome"], outcome["detail"])
                if self.on_lost is not None:
                    self.on_lost(outcome)

    def _renew(self) -> None:
        next_renewal = self.renew_every_s
        while not self._stop.is_set():
            step = min(1.0, next_renewal)
            if self.outcomes_available:
                self._watch(step)
            elif self._stop.wait(step):
                break
            next_renewal -= step
            if next_renewal > 0 or self._stop.is_set():
                continue
            next_renewal = self.renew_every_s
            try:
                self._publish("service_hold")
                self.renewals += 1
            except Exception:  # keep trying: the TTL is the margin for a broker that is away for a while
                self.failures += 1
                log.warning("renewal of service hold %s failed; retrying in %.1f s", self.holder, self.renew_every_s,
                            exc_info=True)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _end_quietly(self) -> None:
        self._stop.set()
        if self.outcomes is not None:
            self.outcomes.close()

    def close(self) -> None:
        """Stop renewing and release the hold (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.publisher.ack_timeout_s)
        try:
            self._publish("service_release")
        finally:
            if self.outcomes is not None:
                self.outcomes.close()
