"""The policy: every knob the core's decisions depend on, with the contract's defaults.

The same policy given to ``safepoint replay`` and ``safepoint run`` yields the same output
for the same event log. Time values are in the unit of the field they bound: ``*_ms`` in
wall-clock milliseconds (event time), ``retention`` in MVCC units.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["Policy"]

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Policy:
    """Decision parameters of the core. Frozen: a running job never changes its policy."""

    retention: int = 0
    """History every node keeps regardless of readers, in MVCC units (0: keep none)."""
    node_lease_ms: int = 30_000
    """A node whose last event is older than this, in cluster time, is stale."""
    directive_interval_ms: int = 0
    """Least cluster time between two compaction directives of one cluster (0: every advance)."""
    max_message_bytes: int = 1_048_576
    """Input messages larger than this go to the dead-letter topic."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                msg = f"policy key {f.name} must be an integer, got {value!r}"
                raise ValueError(msg)
            if value < 0:
                msg = f"policy key {f.name} must be >= 0, got {value}"
                raise ValueError(msg)
        if self.node_lease_ms == 0:
            msg = "policy key node_lease_ms must be > 0"
            raise ValueError(msg)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policy:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
