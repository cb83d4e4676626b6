"""How far a node's clock is from the log's: the offset of its newest event, and the ``clock_skew`` alert.

Leases, TTLs and windows run on the *log's* time, never a node's: every message has a log time
(``log_ms``: the broker's append time of its record on an events topic kept with
``message.timestamp.type = LogAppendTime``; the line's own ``log_ms`` in a replay file; the
event's ``wall_ms`` where the log has no time of its own), and a cluster's time is the largest log
time of its node events. A node's ``wall_ms`` still dates what the node itself reports (when a
reader opened, its pressure on its own clock), so a wrong clock there only shifts the node's own
ages.

``ClockWatch`` is the node's part that watches the difference: the offset ``wall_ms - log_ms`` of
its newest event (its clock's error, less the delivery delay), and a band on its size. When the
offset stays beyond ``max_clock_skew_ms`` for ``clock_skew_window_ms`` of log time, the node stage
raises ``clock_skew`` (warning) naming the node and the offset; once it stays within for as long,
the alert clears. A single late delivery (a producer that waited out a broker outage) does not
raise it: the next message on time ends the breach. The node's holds count either way.
"""

from __future__ import annotations

from typing import Any

from safepoint.core.bands import Band, BandSpec, band_step
from safepoint.core.event_records import Event
from safepoint.core.ids import join_id
from safepoint.core.policy import Policy
from safepoint.core.signals import AlertChange, alert_change

__all__ = ["ClockWatch", "log_time"]

_NEVER = 1 << 62
"""The band's critical level is never reached: one level, warning."""
_specs: dict[tuple[int, int], BandSpec] = {}


def log_time(event: Event) -> int:
    """An event's log time: its ``log_ms`` (set where the message was read), else its ``wall_ms``."""
    log: int | None = event.get("log_ms")
    return event["wall_ms"] if log is None else log


def _spec(policy: Policy) -> BandSpec:
    key = (policy.max_clock_skew_ms, policy.clock_skew_window_ms)
    spec = _specs.get(key)
    if spec is None:
        spec = _specs[key] = BandSpec(key[0], key[0], _NEVER, _NEVER, key[1], key[1])
    return spec


class ClockWatch:
    """A node's clock offset against the log and its skew band. Stored as ``[offset]`` or
    ``[offset, band]`` (a band that is not quiet); absent: no event yet, or offset 0 and quiet."""

    __slots__ = ("node", "offset", "band", "calm")

    def __init__(self, node: str, stored: list[Any] | None = None) -> None:
        self.node = node
        self.offset: int | None = None
        """``wall_ms - log_ms`` of the node's newest applied event (None: none yet)."""
        self.band = Band()
        if stored:
            self.offset = stored[0]
            if len(stored) > 1:
                self.band = Band.from_json(stored[1])
        self.calm = self.band.quiet
        """The band is quiet (normal, nothing breaching): kept with it, read on every event's shortcut."""

    def to_stored(self) -> list[Any] | None:
        if self.band.quiet:
            return None if not self.offset else [self.offset]
        return [self.offset, self.band.to_json()]

    def still(self, wall: int, log: int, policy: Policy) -> bool:
        """``take`` of an event at ``wall`` read at ``log`` would only set the offset: no limit, or a
        quiet band and an offset within the limit (``band_step``'s own test for a quiet band that
        stays quiet). ``take`` begins with it, and the node's shortcut asks it."""
        skew = policy.max_clock_skew_ms
        return not skew or (self.calm and abs(wall - log) < skew)

    def take(self, wall: int, log: int, policy: Policy) -> AlertChange | None:
        """One applied event of the node: its offset; the alert raised or cleared when the band moves."""
        offset = self.offset = wall - log
        if self.still(wall, log, policy):
            return None
        moved = band_step(self.band, _spec(policy), log, abs(offset))
        self.calm = self.band.quiet
        if moved is None:
            return None
        old, new, since = moved
        way = "ahead of" if offset > 0 else "behind"
        if new > old:
            state = "raised"
            detail = (f"node {self.node}'s clock is {abs(offset) / 1000:.1f} s {way} the log's time (its wall_ms "
                      f"against the broker's append time, beyond {policy.max_clock_skew_ms} ms for "
                      f"{policy.clock_skew_window_ms} ms): its holds still count; leases, TTLs and windows run on the "
                      "log's time, and the ages it reports follow its own clock")
        else:
            state = "cleared"
            detail = f"node {self.node}'s clock is within {policy.max_clock_skew_ms} ms of the log's time again"
        return alert_change(self.node, "clock_skew", join_id("clock_skew", self.node), state, "warning",
                            offset, policy.max_clock_skew_ms, since, detail)
