"""Pressure bands with hysteresis and debounce (NornicDB's MVCC lifecycle design, its pressure bands).

Three levels: 0 normal, 1 warning (NornicDB's "high"), 2 critical. Each level above normal has
an enter threshold and a lower exit threshold. A level is entered when the value has stayed at
or above its enter threshold for ``enter_ms`` (measured between samples, inclusive), and left
(one level down) when the value has stayed below its exit threshold for ``exit_ms``. A value
oscillating around a threshold therefore yields one raise and one clear, not a flap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BandSpec", "band_step", "new_band", "LEVEL_NAMES"]

LEVEL_NAMES = ("normal", "warning", "critical")
# state: [level, breach_since_1, breach_since_2, recover_since_1, recover_since_2, level_since]
B_LEVEL, B_BREACH1, B_BREACH2, B_RECOVER1, B_RECOVER2, B_SINCE = range(6)


@dataclass(frozen=True, slots=True)
class BandSpec:
    warning_enter: int
    warning_exit: int
    critical_enter: int
    critical_exit: int
    enter_ms: int
    exit_ms: int

    def enter(self, level: int) -> int:
        return self.warning_enter if level == 1 else self.critical_enter

    def exit(self, level: int) -> int:
        return self.warning_exit if level == 1 else self.critical_exit


def new_band() -> list[Any]:
    return [0, None, None, None, None, None]


def band_step(state: list[Any], spec: BandSpec, t: int, value: int) -> tuple[int, int, int] | None:
    """Feed one sample at time ``t``. Returns (old level, new level, since) on a change.

    ``since`` is when the condition that caused the change began: the start of the sustained
    breach for a raise, of the sustained recovery for a lowering.
    """
    if (
        state[B_LEVEL] == 0
        and state[B_BREACH1] is None
        and state[B_BREACH2] is None
        and value < spec.warning_enter
        and value < spec.critical_enter
    ):
        return None  # normal and staying so, nothing breaching: the state is already canonical
    for lvl, b_idx, r_idx in ((1, B_BREACH1, B_RECOVER1), (2, B_BREACH2, B_RECOVER2)):
        if value >= spec.enter(lvl):
            if state[b_idx] is None:
                state[b_idx] = t
        else:
            state[b_idx] = None
        if value < spec.exit(lvl):
            if state[r_idx] is None:
                state[r_idx] = t
        else:
            state[r_idx] = None
    old = level = state[B_LEVEL]
    since = None
    for up, b_idx in ((2, B_BREACH2), (1, B_BREACH1)):
        began = state[b_idx]
        if up > level and began is not None and t - began >= spec.enter_ms:
            level, since = up, began
            break
    else:
        while level > 0:
            began = state[B_RECOVER1 if level == 1 else B_RECOVER2]
            if began is None or t - began < spec.exit_ms:
                break
            level, since = level - 1, began
    if level == old:
        _canonical(state)
        return None
    state[B_LEVEL] = level
    state[B_SINCE] = t
    _canonical(state)
    assert since is not None
    return old, level, since


def _canonical(state: list[Any]) -> None:
    """Clear the fields no later decision can read, so equal histories give equal states (and a
    quiet band is ``new_band()``, which the node's state leaves out). At level L: the breach
    start of a level <= L is only read to raise above L, and is None again at any lowering (the
    value is then below that level's exit, so below its enter); the recovery start of a level > L
    is only read while at that level, and a raise to it happens at a sample at or above its enter,
    which resets it; ``level_since`` (when the current level was entered) means nothing at normal."""
    level = state[B_LEVEL]
    if level >= 1:
        state[B_BREACH1] = None
    if level >= 2:
        state[B_BREACH2] = None
    if level < 1:
        state[B_RECOVER1] = None
        state[B_SINCE] = None
    if level < 2:
        state[B_RECOVER2] = None
