"""Following topics without a consumer group, idle when caught up.

``TopicFollower`` reads every partition of one or more topics (from their beginning, or from
their end as it is when the follower starts) with ``assign()`` only, so it never disturbs the job
or another reader. Once caught up it drops its assignment and only asks for the end
offsets (``connectors/kafka/idle.py``): a caught-up follower costs next to nothing, even on the embedded broker.
A broker error is kept in ``error`` and the consumer is rebuilt where it stood; the caller's loop
goes on. ``read_to_end`` reads what the topics hold now and stops: the one way the project reads a
topic back (the job's seeds, ``hold list``, ``check-node``, the run checker).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from safepoint.connectors.kafka.clients import FAILOVER_CONF, RECEIVE_MESSAGE_MAX_BYTES, watermarks
from safepoint.connectors.kafka.idle import IdlePause

__all__ = ["TopicFollower", "read_to_end"]

log = logging.getLogger("safepoint.follow")

TP = tuple[str, int]


class TopicFollower:
    def __init__(self, conf: Mapping[str, Any], topics: str | Sequence[str],
                 start: Literal["beginning", "end"] = "beginning", idle_s: float = 0.25,
                 client_id: str = "safepoint-follow", eof: bool = False, partial: bool = False) -> None:
        """``partial``: read the topics that exist while looking again, every second, for those not
        made yet (for a screen, where each topic stands alone); without it nothing is read until
        every topic exists (for a reader that must see the topics together, such as the auditor)."""
        self.conf = {**FAILOVER_CONF, **conf, "group.id": f"{client_id}-{time.time_ns()}", "enable.auto.commit": False,
                     "enable.auto.offset.store": False, "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES,
                     "enable.partition.eof": eof,
                     "client.id": client_id, "logger": logging.getLogger("safepoint.follow.librdkafka")}
        self.topics = [topics] if isinstance(topics, str) else [t for t in topics if t]
        self.start = start
        self.error: str | None = None
        """Why the last poll could not read (no topic yet, a broker error); None once it reads."""
        self.partial = partial
        self.missing: list[str] = []
        """With ``partial``: the topics not made yet, looked for again every second."""
        self._looked = 0.0
        self._assigned = False
        """Whether the consumer has its assignment: until then every poll (at most once a second) looks
        for the topics again, whatever the consumer its first look made."""
        self.last_poll: float | None = None
        """``time.monotonic()`` of the last poll that reached the broker (read, or found nothing new)."""
        self._consumer: Any = None
        self._next: dict[TP, int] = {}
        """(topic, partition) -> the offset to read next; a negative one: from the first offset there is."""
        self._first: dict[TP, int] = {}
        """(topic, partition) -> its first offset, for those not read yet (asked with the ends)."""
        self._idle = IdlePause(idle_s)

    # -- assignment -------------------------------------------------------------------------
    def open(self) -> bool:
        """Assign now (a follower from the end starts at the end as it is now); False when a topic
        cannot be read yet (``error`` says why; ``poll`` tries again)."""
        try:
            return self._assign()
        except Exception as exc:  # noqa: BLE001 - kept in error, like a poll's
            self._rebuild(exc)
            return False

    def _assign(self) -> bool:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        if self._consumer is None:
            self._consumer = Consumer(self.conf)
        found: list[TP] = []
        missing: list[str] = []
        for topic in self.topics:
            md = self._consumer.list_topics(topic, timeout=5).topics.get(topic)
            self.last_poll = time.monotonic()  # the broker answered (a topic not made yet is no stall)
            if md is None or md.error is not None or not md.partitions:
                missing.append(topic)
                if not self.partial:
                    break
                continue
            found += [(topic, p) for p in sorted(md.partitions)]
        self._looked = time.monotonic()
        self.missing = missing if self.partial else []
        if missing and (not self.partial or not found):
            self.error = f"topic {missing[0]} not found yet"
            self._assigned = False
            return False
        for tp in found:
            if tp not in self._next:
                self._next[tp] = watermarks(self._consumer, *tp)[1] if self.start == "end" else OFFSET_BEGINNING
        self._consumer.assign([TopicPartition(t, p, self._next[(t, p)]) for t, p in found])
        self._idle.reset()
        self.error = None
        self._assigned = True
        return True

    def _rebuild(self, exc: BaseException) -> None:
        self.error = f"reading {', '.join(self.topics)} failed: {exc}"
        log.warning("following %s: %s; reconnecting", self.topics, exc)
        consumer, self._consumer = self._consumer, None
        self._assigned = False
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: S110 - a consumer that failed may fail to close too; it is dropped either way
                pass

    # -- the consumer calls IdlePause makes ---------------------------------------------------
    def _resume(self) -> None:
        """Assign again where it stood (pause and resume left librdkafka seconds late, or not
        fetching at all, after a resume on the embedded broker; an assignment fetches at once)."""
        from confluent_kafka import TopicPartition

        self._consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in self._next.items()])

    def _ends(self) -> dict[TP, int]:
        """Each partition's end offset, asked of the broker now (and the first offset of those not
        read yet, in the same answer)."""
        ends = {}
        for tp in self._next:
            first, ends[tp] = watermarks(self._consumer, *tp)
            if self._next[tp] < 0:
                self._first[tp] = first
        self.last_poll = time.monotonic()  # the broker answered
        return ends

    def _marks(self) -> dict[TP, int]:
        """Each partition's end as the last fetch response carried it (no request)."""
        from confluent_kafka import TopicPartition

        out = {}
        for tp in self._next:
            high = int(self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)[1])
            if high >= 0:
                out[tp] = high
        return out

    def _positions(self) -> dict[TP, int]:
        """What was read; before the first record of a partition, its first offset (compaction or
        retention may have moved it on: asked of the broker once, then with each ask of the ends)."""
        out = {}
        for tp, offset in self._next.items():
            if offset >= 0:
                out[tp] = offset
                continue
            first = self._first.get(tp)
            if first is None:
                first = self._first[tp] = watermarks(self._consumer, *tp)[0]
            out[tp] = first
        return out

    # -- reading ----------------------------------------------------------------------------
    def poll(self, timeout_s: float = 0.5, max_messages: int = 500) -> list[Any]:
        """The next messages (errors left out), or [] after waiting at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            if not self._assigned:
                wait = 1.0 - (time.monotonic() - self._looked)
                if wait > 0:  # looked less than a second ago: the topics are asked for at most once a second
                    time.sleep(min(wait, timeout_s))
                    return []
                if not self._assign():
                    time.sleep(min(1.0, timeout_s))
                    return []
            if self.missing and time.monotonic() - self._looked >= 1.0:
                self._assign()  # the topics made since are read too, the others where they stood
            positions = self._positions()
            go = self._idle.may_poll(self._ends, positions, self._resume)
            if go is not True:
                time.sleep(max(0.0, min(float(go), deadline - time.monotonic())))
                return []
            # what is known to be there: a read of exactly that returns once it has it, not after the wait
            want = min(max_messages, self._idle.backlog(positions)) or max_messages
            msgs = self._consumer.consume(want, max(0.0, min(0.2, deadline - time.monotonic())))
            self.last_poll = time.monotonic()
            out = []
            for m in msgs:
                if m.error() is None and m.partition() is not None and m.offset() is not None:
                    tp = (m.topic(), m.partition())
                    self._next[tp] = m.offset() + 1
                    self._first.pop(tp, None)
                    out.append(m)
            self._idle.polled(bool(msgs), self._positions(), self._consumer.unassign, self._marks())
            return out
        except Exception as exc:  # a broker away or a consumer in a bad state: rebuild it where it stood
            self._rebuild(exc)
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            return []

    def read_to_end(self, timeout_s: float = 60.0) -> Iterator[Any]:
        """Every message from where the follower stands up to the topics' ends as they are now,
        then stop (a follower made with ``eof=True`` also stops at a tail without records, such as
        a transaction marker). Nothing when a topic does not exist; ``TimeoutError`` when ``timeout_s`` pass
        without progress; a broker error is raised (``BrokerError``), not kept."""
        from confluent_kafka import KafkaError

        from safepoint.errors import BrokerError

        try:
            if not self._assigned and not self._assign():
                return
            ends = self._ends()
            positions = self._positions()
        except Exception as exc:
            msg = f"cannot read {', '.join(self.topics)} at {self.conf.get('bootstrap.servers')}: {exc}"
            raise BrokerError(msg) from exc
        left = {tp for tp, end in ends.items() if positions[tp] < end}
        deadline = time.monotonic() + timeout_s
        while left:
            if time.monotonic() > deadline:
                where = ", ".join(f"{t}[{p}] at {positions.get((t, p))} of {ends[(t, p)]}" for t, p in sorted(left))
                msg = f"reading stopped after {timeout_s:.0f} s without progress: {where}"
                raise TimeoutError(msg)
            msgs = self._consumer.consume(1000, 0.5)
            for m in msgs:
                tp = (m.topic(), m.partition())
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(tp)  # past the last record (a compacted or transactional tail)
                    continue
                offset = m.offset()
                if offset is None or tp not in ends or offset >= ends[tp]:
                    continue
                self._next[tp] = positions[tp] = offset + 1
                deadline = time.monotonic() + timeout_s
                if offset + 1 >= ends[tp]:
                    left.discard(tp)
                yield m

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._assigned = False


def read_to_end(conf: Mapping[str, Any], topic: str, timeout_s: float = 60.0,
                client_id: str = "safepoint-read") -> Iterator[Any]:
    """Every message ``topic`` holds now, from its first offset to its end (``TopicFollower.read_to_end``)."""
    follower = TopicFollower(conf, topic, "beginning", client_id=client_id, eof=True)
    try:
        yield from follower.read_to_end(timeout_s)
    finally:
        follower.close()
