"""Idle means idle: a caught-up consumer pauses and only asks for the end offsets.

A consumer that has read everything keeps sending fetch requests. A broker holds an empty fetch
for ``fetch.wait.max.ms`` before it answers, so that costs little on Apache Kafka; the embedded
broker answers at once, and a caught-up consumer there spins a core (and the broker another).
``IdlePause`` is the rule every reader of the project follows instead: after a poll that found
nothing while nothing seen is left unread, pause every assigned partition; while paused, ask the
broker for the partitions' end offsets once every ``idle_s`` (one request per partition, no
fetch); resume as soon as one has grown past what was read. New data is seen ``idle_s`` late at
most. The consumer calls are passed in, so that it serves confluent-kafka's consumer and the
kafka-python one alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["IdlePause"]

Ends = Callable[[], Mapping[Any, int]]
"""Each assigned partition's end offset, asked of the broker now."""


class IdlePause:
    def __init__(self, idle_s: float = 0.25, patience: int = 10) -> None:
        self.idle_s = idle_s
        self.patience = patience
        """Empty polls in a row after which the partitions pause even though an end offset seen
        is not read yet (an end past a transaction marker is never reached by a record)."""
        self.paused = False
        self._until = 0.0
        self._ends: dict[Any, int] = {}
        self._empty = 0

    def behind(self, positions: Mapping[Any, int]) -> bool:
        """An end offset seen lies past what was read."""
        return any(end > positions.get(p, 0) for p, end in self._ends.items())

    def may_poll(self, ends: Ends, positions: Mapping[Any, int], resume: Callable[[], None]) -> bool | float:
        """Before a poll: True to poll now (resumed if it was paused), else the seconds to wait
        before asking again (paused, nothing new)."""
        if not self.paused:
            return True
        left = self._until - time.monotonic()
        if left > 0:
            return left
        self._ends = dict(ends())
        if not self.behind(positions):
            self._until = time.monotonic() + self.idle_s
            return self.idle_s
        resume()
        self.paused = False
        self._empty = 0
        return True

    def polled(self, got: bool, positions: Mapping[Any, int], pause: Callable[[], None]) -> None:
        """After a poll: ``got`` whether it returned anything (a record or an end-of-partition)."""
        if got:
            self._empty = 0
            return
        self._empty += 1
        if not self.behind(positions) or self._empty >= self.patience:
            pause()
            self.paused = True
            self._until = time.monotonic() + self.idle_s
            self._empty = 0

    def reset(self) -> None:
        """The consumer was rebuilt: it is not paused."""
        self.paused = False
        self._empty = 0
