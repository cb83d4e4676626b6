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

A topic that keeps growing (the events topic under a live cluster, directives ten a second) never
gives a poll that finds nothing: each fetch brings the few records written since the last, and
on the embedded broker the next fetch follows at once, so such a follower spun as much as an idle
one (measured: the auditor following 300 events/s took 43% of a core, the broker 40%). So a poll
that has read up to the ends the client's last fetch response carried (``marks``: no request
needed) pauses too, as if it had found nothing. The follower then reads a growing topic in
rounds of ``idle_s``: ask the ends, resume, read what is there (``backlog`` says how much, so the
read returns as soon as it has it), pause.
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

    def backlog(self, positions: Mapping[Any, int]) -> int:
        """Records known to be left to read: up to the ends asked last (0: none known)."""
        return sum(max(0, end - positions.get(p, 0)) for p, end in self._ends.items())

    def polled(self, got: bool, positions: Mapping[Any, int], pause: Callable[[], None],
               marks: Mapping[Any, int] | None = None) -> None:
        """After a poll: ``got`` whether it returned anything (a record or an end-of-partition);
        ``marks`` each partition's end as the client's last fetch response said it (no request),
        where the client knows them."""
        if got:
            self._empty = 0
            if not marks or any(positions.get(p, 0) < end for p, end in marks.items()):
                return
            self._ends = {**self._ends, **marks}  # read all there was: pause as after an empty poll
        else:
            self._empty += 1
            if self.behind(positions) and self._empty < self.patience:
                return
        pause()
        self.paused = True
        self._until = time.monotonic() + self.idle_s
        self._empty = 0

    def reset(self) -> None:
        """The consumer was rebuilt: it is not paused."""
        self.paused = False
        self._empty = 0
