"""Following a topic without a consumer group, idle when caught up.

``TopicFollower`` reads every partition of a topic (from its beginning, or from its end as it is
when the follower starts) with ``assign()`` only, so it never disturbs the job or another reader.
Once a poll finds nothing new, it pauses its partitions and only asks the broker for their end
offsets, one request per partition every ``idle_s``, until one has grown: a caught-up follower
costs next to nothing, even on a broker that answers an empty fetch at once instead of holding it
(the embedded one does, and a consumer that keeps fetching there spins a core). A broker error is
kept in ``error`` and the consumer is rebuilt where it stood; the caller's loop goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["TopicFollower"]

log = logging.getLogger("safepoint.follow")


class TopicFollower:
    def __init__(self, conf: Mapping[str, Any], topic: str, start: Literal["beginning", "end"] = "beginning",
                 idle_s: float = 0.25, client_id: str = "safepoint-follow") -> None:
        self.conf = {**conf, "group.id": f"{client_id}-{time.time_ns()}", "enable.auto.commit": False,
                     "enable.auto.offset.store": False, "receive.message.max.bytes": 1_000_000_000,
                     "client.id": client_id, "logger": logging.getLogger("safepoint.follow.librdkafka")}
        self.topic, self.start, self.idle_s = topic, start, idle_s
        self.error: str | None = None
        """Why the last poll could not read (no topic yet, a broker error); None once it reads."""
        self.last_poll: float | None = None
        """``time.monotonic()`` of the last poll that reached the broker (read, or found nothing new)."""
        self._consumer: Any = None
        self._next: dict[int, int] = {}
        """partition -> the offset to read next (known once the partition was assigned)."""
        self._assigned: list[int] = []
        self._paused_until: float | None = None
        self._target: dict[int, int] = {}
        """partition -> the end offset last seen: not caught up (not paused) before it is read."""
        self._empty = 0

    # -- assignment -------------------------------------------------------------------------
    def open(self) -> bool:
        """Assign now (a follower from the end starts at the end as it is now); False when the
        topic cannot be read yet (``error`` says why; ``poll`` tries again)."""
        try:
            return self._assign()
        except Exception as exc:  # noqa: BLE001 - kept in error, like a poll's
            self._rebuild(exc)
            return False

    def _assign(self) -> bool:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        if self._consumer is None:
            self._consumer = Consumer(self.conf)
        md = self._consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
        if md is None or md.error is not None or not md.partitions:
            self.error = f"topic {self.topic} not found yet"
            return False
        parts = sorted(md.partitions)
        if not self._next:
            for p in parts:
                if self.start == "end":
                    self._next[p] = int(self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5)[1])
                else:
                    self._next[p] = OFFSET_BEGINNING
        self._consumer.assign([TopicPartition(self.topic, p, self._next.get(p, OFFSET_BEGINNING)) for p in parts])
        self._assigned = parts
        self.error = None
        return True

    def _rebuild(self, exc: BaseException) -> None:
        self.error = f"reading {self.topic} failed: {exc}"
        log.warning("following %s: %s; reconnecting", self.topic, exc)
        consumer, self._consumer, self._paused_until = self._consumer, None, None
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: S110 - a consumer that failed may fail to close too; it is dropped either way
                pass

    # -- reading ----------------------------------------------------------------------------
    def poll(self, timeout_s: float = 0.5, max_messages: int = 500) -> list[Any]:
        """The next messages (errors left out), or [] after waiting at most ``timeout_s``."""
        from confluent_kafka import TopicPartition

        deadline = time.monotonic() + timeout_s
        try:
            if self._consumer is None or not self._next:
                if not self._assign():
                    time.sleep(min(1.0, timeout_s))
                    return []
            if self._paused_until is not None:
                wait = self._paused_until - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
                    if time.monotonic() < self._paused_until:
                        return []
                for p in self._assigned:
                    self._target[p] = int(self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5,
                                                                               cached=False)[1])
                self.last_poll = time.monotonic()
                if not self._behind():
                    self._paused_until = time.monotonic() + self.idle_s
                    return []
                self._consumer.resume([TopicPartition(self.topic, p) for p in self._assigned])
                self._paused_until = None
            msgs = self._consumer.consume(max_messages, max(0.0, min(0.2, deadline - time.monotonic())))
            self.last_poll = time.monotonic()
            out = []
            for m in msgs:
                if m.error() is None and m.partition() is not None and m.offset() is not None:
                    self._next[m.partition()] = m.offset() + 1
                    out.append(m)
            self._empty = 0 if msgs else self._empty + 1
            # caught up: pause, unless an end offset seen is not read yet (a fetch after a resume takes a
            # moment); a few empty polls in a row pause anyway (an end past a transaction marker is never read)
            if not msgs and (not self._behind() or self._empty >= 10):
                self._consumer.pause([TopicPartition(self.topic, p) for p in self._assigned])
                self._paused_until = time.monotonic() + self.idle_s
                self._empty = 0
            return out
        except Exception as exc:  # a broker away or a consumer in a bad state: rebuild it where it stood
            self._rebuild(exc)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            return []

    def _behind(self) -> bool:
        from confluent_kafka import TopicPartition

        return any(self._target.get(p, 0) > self._position(p, TopicPartition) for p in self._assigned)

    def _position(self, partition: int, tp: Any) -> int:
        offset = self._next.get(partition, 0)
        if offset >= 0:
            return offset
        # nothing read yet (OFFSET_BEGINNING): the partition's first offset, which compaction may have moved on
        return int(self._consumer.get_watermark_offsets(tp(self.topic, partition), timeout=5, cached=False)[0])

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
