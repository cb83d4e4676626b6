"""Admission control of long snapshots on a node, following the pinned-bytes band the job sends it.

A long snapshot (a reader or transaction the database declares long, ``long=True``, or one whose
timestamp lies more than ``long_read_after`` MVCC units below ``mvcc_now``: a historical read)
pins history for a long time. Under pressure a node stops taking on more of them before it hurts:

* ``normal``: every snapshot is admitted;
* ``warning``: long snapshots are rate-limited (``long_per_s`` a second, a burst of as many, at
  least one): one over the rate raises ``AdmissionThrottled`` with ``retry_after_s``;
* ``critical``: long snapshots raise ``AdmissionRefused``.

In an **emergency** of the cluster (a critical node whose debt keeps growing: the compaction
directives say so, ``core/emergency.py``) admission tightens: long snapshots are refused in the
``warning`` band too. Short snapshots are never touched. The band comes from the job's ``band`` directives (a
``DirectiveListener`` with ``reporter=`` hands them over); a job that starts on empty state has
forgotten every band, so its recovery ``snapshot_request`` sets the band back to ``normal``.
Every throttle and refusal is counted; heartbeats carry the counts (``admission_throttled``,
``admission_refused``), so the job's status and metrics show them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from safepoint.errors import AdmissionRefused, AdmissionThrottled

__all__ = ["BANDS", "Admission"]

BANDS = ("normal", "warning", "critical")


class Admission:
    """One node's admission state: its band, the token bucket of long snapshots, the counts."""

    def __init__(self, node: str, long_per_s: float = 1.0, long_read_after: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not long_per_s > 0:
            msg = f"long_per_s must be > 0, got {long_per_s!r}"
            raise ValueError(msg)
        if long_read_after is not None and long_read_after < 0:
            msg = f"long_read_after must be >= 0 (MVCC units), got {long_read_after!r}"
            raise ValueError(msg)
        self.node = node
        self.long_per_s = float(long_per_s)
        self.long_read_after = long_read_after
        self._clock = clock
        self._lock = threading.Lock()
        self.band = "normal"
        self.emergency = False
        self._burst = max(1.0, self.long_per_s)
        self._tokens = self._burst
        self._stamp = clock()
        self.throttled = 0
        self.refused = 0

    def observe(self, band: str) -> None:
        """The job's newest band for this node (``normal``, ``warning``, ``critical``)."""
        if band not in BANDS:
            msg = f"unknown band {band!r}"
            raise ValueError(msg)
        with self._lock:
            if band != self.band and band == "warning":
                self._tokens, self._stamp = self._burst, self._clock()  # a fresh bucket on entering the band
            self.band = band

    def observe_emergency(self, active: bool) -> None:
        """The cluster's emergency, as the newest compaction directive says."""
        with self._lock:
            self.emergency = bool(active)

    def is_long(self, declared: bool, ts: int, mvcc_now: int | None) -> bool:
        """Declared long, or a historical read more than ``long_read_after`` below ``mvcc_now``."""
        if declared:
            return True
        return self.long_read_after is not None and mvcc_now is not None and mvcc_now - ts > self.long_read_after

    def admit(self, what: str, ident: str) -> None:
        """Admit one long snapshot or raise (the counts move)."""
        with self._lock:
            if self.band == "critical" or (self.band == "warning" and self.emergency):
                self.refused += 1
                why = ("the critical pinned-bytes band" if self.band == "critical"
                       else "the warning pinned-bytes band while its cluster is in emergency")
                msg = (f"{what} {ident} refused: node {self.node} is in {why}; long snapshots are refused until it "
                       "leaves it (short ones go on)")
                raise AdmissionRefused(msg, self.band)
            if self.band != "warning":
                return
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self.long_per_s)
            self._stamp = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            self.throttled += 1
            retry = (1.0 - self._tokens) / self.long_per_s
            msg = (f"{what} {ident} throttled: node {self.node} is in the warning pinned-bytes band; long snapshots "
                   f"are admitted at {self.long_per_s:g}/s: retry after {retry:.2f} s")
            raise AdmissionThrottled(msg, self.band, retry)
