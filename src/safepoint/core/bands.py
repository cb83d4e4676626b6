"""Pressure bands with hysteresis and debounce (NornicDB's MVCC lifecycle design, its pressure bands).

Three levels: 0 normal, 1 warning (NornicDB's "high"), 2 critical. Each level above normal has
an enter threshold and a lower exit threshold. A level is entered when the value has stayed at
or above its enter threshold for ``enter_ms`` (measured between samples, inclusive), and left
(one level down) when the value has stayed below its exit threshold for ``exit_ms``. A value
oscillating around a threshold therefore yields one raise and one clear, not a flap.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

__all__ = ["Band", "BandSpec", "band_step", "new_band", "LEVEL_NAMES"]

LEVEL_NAMES = ("normal", "warning", "critical")


@dataclass(slots=True, init=False)
class Band:
    """One pressure band's state. In the state store it is the list ``to_json`` gives (its fields in
    this order); a quiet band (normal, nothing breaching) is ``Band()`` and is left out."""

    level: int = 0
    """0 normal, 1 warning, 2 critical."""
    breach1: int | None = None
    """Since when the value has been at or above the warning enter threshold."""
    breach2: int | None = None
    """Since when the value has been at or above the critical enter threshold."""
    recover1: int | None = None
    """Since when the value has been below the warning exit threshold."""
    recover2: int | None = None
    """Since when the value has been below the critical exit threshold."""
    since: int | None = None
    """When the current level was entered (None at normal)."""

    def __init__(self, level: int = 0, breach1: int | None = None, breach2: int | None = None,
                 recover1: int | None = None, recover2: int | None = None, since: int | None = None) -> None:
        # written out (init=False): every node read from the store makes two, and the compiled core
        # compiles this one, where the dataclass's own __init__ would run as Python
        self.level = level
        self.breach1 = breach1
        self.breach2 = breach2
        self.recover1 = recover1
        self.recover2 = recover2
        self.since = since

    def to_json(self) -> list[Any]:
        return list(astuple(self))

    @classmethod
    def from_json(cls, data: list[Any] | None) -> Band:
        return cls(*data) if data else cls()

    @property
    def quiet(self) -> bool:
        """Normal with nothing breaching: in canonical form (``_canonical``) that is ``Band()``."""
        return self.level == 0 and self.breach1 is None and self.breach2 is None


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


def new_band() -> Band:
    return Band()


def band_step(state: Band, spec: BandSpec, t: int, value: int) -> tuple[int, int, int] | None:
    """Feed one sample at time ``t``. Returns (old level, new level, since) on a change.

    ``since`` is when the condition that caused the change began: the start of the sustained
    breach for a raise, of the sustained recovery for a lowering.
    """
    if state.quiet and value < spec.warning_enter and value < spec.critical_enter:
        return None  # normal and staying so, nothing breaching: the state is already canonical
    state.breach1 = _since(state.breach1, value >= spec.warning_enter, t)
    state.recover1 = _since(state.recover1, value < spec.warning_exit, t)
    state.breach2 = _since(state.breach2, value >= spec.critical_enter, t)
    state.recover2 = _since(state.recover2, value < spec.critical_exit, t)
    old = level = state.level
    since = None
    for up, began in ((2, state.breach2), (1, state.breach1)):
        if up > level and began is not None and t - began >= spec.enter_ms:
            level, since = up, began
            break
    else:
        while level > 0:
            began = state.recover1 if level == 1 else state.recover2
            if began is None or t - began < spec.exit_ms:
                break
            level, since = level - 1, began
    if level == old:
        _canonical(state)
        return None
    state.level = level
    state.since = t
    _canonical(state)
    assert since is not None
    return old, level, since


def _since(began: int | None, holds: bool, t: int) -> int | None:
    """When a condition that holds at ``t`` began (``t`` if it just did); None once it does not hold."""
    if not holds:
        return None
    return t if began is None else began


def _canonical(state: Band) -> None:
    """Clear the fields no later decision can read, so equal histories give equal states (and a
    quiet band is ``Band()``, which the node's state leaves out). At level L: the breach
    start of a level <= L is only read to raise above L, and is None again at any lowering (the
    value is then below that level's exit, so below its enter); the recovery start of a level > L
    is only read while at that level, and a raise to it happens at a sample at or above its enter,
    which resets it; ``level_since`` (when the current level was entered) means nothing at normal."""
    level = state.level
    if level >= 1:
        state.breach1 = None
    if level >= 2:
        state.breach2 = None
    if level < 1:
        state.recover1 = None
        state.since = None
    if level < 2:
        state.recover2 = None
