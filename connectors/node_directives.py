"""The directives a job sends to one node, as its ``DirectiveListener`` answers them.

``expire`` names one reader or transaction of the node: handed to ``Reporter.expire`` (with
``reporter=``) and then to ``on_expire``. ``snapshot_request`` asks the node for its complete set
of holds (the job started on empty state): answered with ``Reporter.snapshot()``. Both share one
``seq`` per cluster. ``band`` tells the node its pinned-bytes band: handed to
``Reporter.observe_band`` (admission of long snapshots follows it, ``connectors/admission.py``); a
recovery ``snapshot_request`` (the job started on empty state and forgot every band) sets it
back to ``normal``. ``NodeDirectivesMixin`` holds these methods for ``DirectiveListener``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from safepoint.connectors.directive_models import ExpireDirective

if TYPE_CHECKING:
    from safepoint.connectors.reporter import Reporter

__all__ = ["NodeDirectivesMixin"]

log = logging.getLogger("safepoint.listener")


class NodeDirectivesMixin:
    """``DirectiveListener``'s handling of per-node directives (its reporter, node and counters)."""

    node: str | None
    _reporter: Reporter | None
    _on_expire: Callable[[ExpireDirective], Any] | None
    _counts: dict[str, int]
    _caught_up: bool
    _last_expire_seq: int
    _backlog_snapshot_request: bool
    _last_band_seq: int = 0
    _node_generation: str | None

    def _new_node_generation(self, generation: str | None) -> None:
        """Per-node directives of another generation (a job that started on empty state): their ``seq``
        starts again."""
        self._node_generation = generation
        self._last_expire_seq = 0
        self._last_band_seq = 0

    def _expire(self, expire: ExpireDirective) -> None:
        if expire.seq <= self._last_expire_seq:
            self._counts["repeats"] += 1
            return
        self._last_expire_seq = expire.seq
        if self.node is not None and expire.node != self.node:
            return
        reporter = self._reporter
        if reporter is not None and (expire.node != reporter.node or expire.cluster != reporter.cluster):
            reporter = None  # the listener was pointed at another node than its reporter's
        if reporter is not None and not self._caught_up and reporter.find(reader_id=expire.reader_id, tx_id=expire.tx_id) is None:
            self._counts["backlog_expires_skipped"] += 1
            log.debug(
                "directive listener: backlog expiry seq %d names %s, not open on this reporter (an earlier process); skipped",
                expire.seq,
                expire.reader_id or expire.tx_id,
            )
            return
        self._counts["expires_delivered"] += 1
        if reporter is not None:
            try:
                reporter.expire(expire)
            except Exception:
                self._counts["handler_failures"] += 1
                log.exception("directive listener: the reporter failed to apply expiry seq %d", expire.seq)
        if self._on_expire is None:
            if self._reporter is None:
                log.info("directive listener: expiry seq %d of %s not handled (no on_expire)", expire.seq, expire.raw)
            return
        try:
            self._on_expire(expire)
        except Exception:
            self._counts["handler_failures"] += 1
            log.exception("directive listener: on_expire failed for expiry seq %d", expire.seq)

    def _snapshot_request(self, obj: dict[str, Any]) -> None:
        """The job asks this node for its complete set of holds (it started on empty state).
        Per-node directives share one ``seq`` per cluster (expire and snapshot_request), but a
        request is answered even when its ``seq`` does not advance: a snapshot is always right to
        send, and a job that lost its directives topic too restarts the ``seq`` at 1."""
        self._last_expire_seq = max(self._last_expire_seq, obj["seq"])
        target = self._reporter.node if self._reporter is not None else self.node
        if target is None or obj["node"] != target:
            return
        if obj.get("reason") == "recovery" and self._reporter is not None and obj["seq"] > self._last_band_seq:
            self._last_band_seq = obj["seq"]  # the new job knows no band yet: it sends one on the next change
            self._reporter.observe_band("normal")
        if not self._caught_up:
            self._backlog_snapshot_request = True  # answered once the backlog is read
            return
        self._answer_snapshot_request()

    def _band(self, obj: dict[str, Any]) -> None:
        """The job's newest band for a node: this listener's reporter takes its own (newest seq wins)."""
        self._last_expire_seq = max(self._last_expire_seq, obj["seq"])
        reporter = self._reporter
        if reporter is None or obj["node"] != reporter.node or obj["seq"] <= self._last_band_seq:
            return
        self._last_band_seq = obj["seq"]
        reporter.observe_band(obj["band"])
        self._counts["bands"] += 1
        log.info("directive listener: node %s is in the %s pinned-bytes band", reporter.node, obj["band"])

    def _answer_snapshot_request(self) -> None:
        if self._reporter is None:
            log.info("directive listener: the job asks node %s for a snapshot; publish one (no reporter= given)", self.node)
            return
        try:
            self._reporter.snapshot()
        except Exception:
            self._counts["handler_failures"] += 1
            log.exception("directive listener: the reporter failed to publish the snapshot the job asked for")
            return
        self._counts["snapshot_requests"] += 1
        log.info("directive listener: the job asked node %s for a snapshot; published", self._reporter.node)
