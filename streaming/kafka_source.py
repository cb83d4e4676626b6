"""The source half of the ``safepoint_kafka`` format: Kafka into Spark Structured Streaming without the JVM connector.

Registered as the format ``safepoint_kafka``. Reading: one Spark partition per Kafka
partition, per-partition offsets kept in Spark's checkpoint (``{"<partition>": next_offset}``),
a ``maxOffsetsPerTrigger`` cap shared fairly over partitions, clients created lazily in the
process that uses them, consumers ``unassign()``ed after each read. Writing is the sink's
(``kafka_sink.py``). The job registers a subclass that routes and packs in the read tasks
(``streaming/source.py``).

Options: ``bootstrap.servers`` (required), ``subscribe`` (the topic), ``controlTopic`` (a second topic
read with it: its partition ``p`` is keyed ``control_partition(p)``, a negative number, in offsets
and gaps: ``core/origin.py``), ``startingOffsets``
(``earliest`` or ``latest``), ``maxOffsetsPerTrigger``, ``maxOffsetsFirstTrigger`` (the cap of the
first micro-batch the query plans after it starts or restarts, when lower: a start on a backlog
answers after a small batch, whose time is mostly the JVM's and the workers' warming up; 0, the
default: no cap of its own), ``minRowsPerTask`` (a read task takes at
least this many messages before the batch is split over more tasks, one Kafka partition at most
per task; 0, the default: one task per Kafka partition with messages), and any
``kafka.<librdkafka key>``.

Columns: ``topic``, ``partition``, ``offset``, ``timestamp`` (the record's time when the broker set
it, ``LogAppendTime``, in ms; null when the topic keeps the producers' times), ``key``, ``value``.

Gaps (``core/gaps.py``). Whenever it plans a batch, the reader compares where it stands in each
partition with the partition's first and last offsets: offsets it had not read that are gone
(``lost``: retention, deleted records, a truncation), a partition that ends below where it stands
(``gone_back``: the topic made again; it is read again from its new start), a changed partition
count (``partitions``), and a topic made again under the job: its id changed (Apache Kafka gives each
topic one), or, on a broker without topic ids, the record the job last fingerprinted there is no
longer the one it read (``prints``, below), so the topic is read again from its start (``gone_back``).
Each gap is logged, numbered (an id that only grows) and kept in the offset
the checkpoint records (``{"<partition>": offset, ..., "gaps": [...]}``, the newest ``GAPS_KEPT``; a
gap of the control topic says ``"control": true``),
so every read task of every later batch hands the list on (``gaps_of``) and the job's operator
gives each cluster the ones it has not taken yet. A record deleted after the batch was planned
fails the read task with that message; the batch runs again and then takes it as a gap.

Fingerprints (``PRINTS`` in the offset): for each partition, one record the job has read, as
``[offset, timestamp type, timestamp, crc32 of key and value]``: the last record of the first batch
that read the partition, taken again every ``PRINT_EVERY_S`` (the last of the batch then planned). At the first plan of a run and every
``PRINT_EVERY_S`` after, each print whose offset the partition still holds is read again; another
record there, or none, means the topic was made again and filled past where the job stood, which its
offsets alone cannot tell (the embedded broker gives no topic ids). It costs one fetch of one record a
partition every few seconds, and it cannot tell a topic made again whose record at that offset has the
same key, value and timestamp (a log written twice, byte for byte, timestamps included), nor one made
again while the fingerprinted record has since been removed by retention (then the offsets and the
rest of the log are all it has).
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from safepoint.connectors.kafka.clients import GROUP_AUTHORIZATION_FAILED, PARTITION_EOF, watermarks
from safepoint.connectors.kafka.topics import TIMESTAMP_LOG_APPEND_TIME
from safepoint.core.batch import header_cluster
from safepoint.core.gaps import Gap
from safepoint.core.origin import control_partition, is_control, kafka_partition
from safepoint.gcfreeze import freeze_once
from safepoint.streaming.kafka_sink import KafkaStreamWriter, client_conf

__all__ = ["GAPS", "KafkaDataSource", "KafkaReadTask", "KafkaStreamReader", "SOURCE_SCHEMA", "find_gaps", "gaps_of",
           "group_ranges", "partition_offsets", "plan_offsets"]

log = logging.getLogger(__name__)

SOURCE_SCHEMA = "topic string, partition int, offset long, timestamp long, key binary, value binary"
_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
_READ_CHUNK = 8192
_READ_TOGETHER = _READ_CHUNK
"""A read task's ranges of at most this many messages in all are assigned together and fetched in
one round (a small batch's, where each range read alone waited on its own first fetch); larger
ones are read one after the other, each streamed in chunks."""
GAPS = "gaps"
"""The key of the source offset's gap list (every other key is a partition number)."""
TOPIC_ID = "topic_id"
"""The key of the topic's id in the source offset (Kafka 2.8 and later give each topic one): another id
means the topic was deleted and made again, whatever its offsets say."""
CONTROL_TOPIC_ID = "control_topic_id"
"""The key of the control topic's id in the source offset."""
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"
"""The id a broker without topic ids reports (all zero): then only offsets below where the job stands tell."""
TOPIC_ID_EVERY_S = 5.0
PRINTS = "prints"
"""The key of the partitions' fingerprints in the source offset (routed partition -> [offset, timestamp
type, timestamp, crc32])."""
PRINT_EVERY_S = 5.0
"""How often the fingerprints are checked and taken again (and at a run's first plan)."""
LEADER_WAIT_S = 60.0
"""How long the source asks a partition's offsets again while its leader moves (a broker died: Kafka
elects another once the dead one's session ends, 9 s by default) before the batch fails."""
GAPS_KEPT = 64
"""The newest gaps the offset keeps: a cluster silent through more gaps than this takes them all as one
of every partition (see ``find_gaps``)."""

NOT_THE_PARTITIONS = (PARTITION_EOF, GROUP_AUTHORIZATION_FAILED)
"""Consumer errors that say nothing of the partition read: its end reached, and a broker with ACLs
refusing the lookup of the consumer's group (the source only assigns, never commits: its principal
needs no group ACL)."""

# Clients live per Python worker process, keyed by their configuration; never pickled.
_CONSUMERS: dict[str, Any] = {}
_ADMINS: dict[str, Any] = {}


def _consumer(options: Mapping[str, str]) -> Any:
    from confluent_kafka import Consumer

    # Refetch only when fewer than this many messages are queued (librdkafka's default is 100,000):
    # a read task stops at its planned end offset, so prefetching far beyond it is waste, and a
    # broker that answers a fetch at the log end at once (the embedded one) would make the client
    # spin a core while the task converts its rows. Overridable as kafka.queued.min.messages.
    # A read task's consumer is reassigned from range to range (and task to task): a prefetch of
    # the last range over those thresholds made librdkafka postpone the next range's first fetch
    # by fetch.queue.backoff.ms, 1 s by default (measured on the embedded broker, which answers a
    # fetch with everything after its offset: about 1 s before each range's first message after
    # the first, three of them in a batch 0 read by one task). Overridable as kafka.fetch.queue.backoff.ms.
    conf = {"queued.min.messages": 10_000, "fetch.queue.backoff.ms": 10, **client_conf(options)}
    conf.update(
        {
            "group.id": "safepoint-source-unused",  # assign() only: no group membership
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "receive.message.max.bytes": 1_000_000_000,  # the embedded broker ignores fetch limits
            # A range is read up to an end offset the broker already has, so a fetch waits on the
            # broker only once the range is done: Apache Kafka holds a fetch at a partition's end
            # for up to fetch.wait.max.ms, and the next range's first fetch waits behind it (one
            # fetch in flight per broker connection). With 50 ms each of a read task's ranges
            # waited so: a steady batch at 1,000 events/s on Apache Kafka took 380 ms (p50), with
            # 5 ms 268 ms, and the p99 event to directive 1.19 -> 0.77 s (safepoint bench --broker
            # kafka --phases latency, one run each). The embedded broker answers at once.
            "fetch.wait.max.ms": 5,
        }
    )
    tag = json.dumps(conf, sort_keys=True)
    consumer = _CONSUMERS.get(tag)
    if consumer is None:
        consumer = _CONSUMERS[tag] = Consumer(conf)
    return consumer


def partition_offsets(offsets: Mapping[str, Any]) -> dict[str, int]:
    """The per-partition offsets of a source offset (its gap list and topic ids left out), keyed by
    routed partition (the control topic's are negative: ``core/origin.py``)."""
    return {p: int(o) for p, o in offsets.items() if p.lstrip("-").isdigit()}


def partition_key(partition: int, control: bool) -> str:
    """The offset key of a Kafka partition of the subscribed topic, or of the control topic."""
    return str(control_partition(partition) if control else partition)


def of_topic(offsets: Mapping[str, Any], control: bool) -> dict[str, Any]:
    """One topic's entries of routed-partition keyed ``offsets``, keyed by Kafka partition."""
    return {str(kafka_partition(int(k))): v for k, v in offsets.items() if is_control(int(k)) == control}


def find_gaps(start: Mapping[str, int], marks: Mapping[str, tuple[int, int]], topic: str, last_id: int, now_ms: int,
              made_again: bool = False) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Where each partition's next batch begins, and the gaps found (``core/gaps.py``) between ``start``
    (the offsets after the last batch; {}: the first batch) and the partitions' (first, end) offsets
    ``marks``; ``made_again``: the topic's id changed, so every partition is read from its start again.
    Ids continue from ``last_id`` and follow the clock (``now_ms``), so they only grow."""
    begin: dict[str, int] = {}
    found: list[dict[str, Any]] = []

    def gap(partition: int, first: int, end: int, kind: str) -> None:
        gid = max(now_ms, last_id + 1) + len(found)
        found.append({"id": gid, "topic": topic, "partition": partition, "first": first, "end": end, "kind": kind,
                      "ms": now_ms})

    if start and set(start) != set(marks):
        gap(-1, -1, -1, "partitions")
    for p, (lo, hi) in sorted(marks.items(), key=lambda kv: int(kv[0])):
        s = start.get(p)
        if s is None:
            begin[p] = lo  # the first batch, or a partition added: from its start
        elif s < lo:
            gap(int(p), s, lo, "lost")
            begin[p] = lo
        elif s > hi or (made_again and s > lo):
            gap(int(p), s, lo, "gone_back")
            begin[p] = lo
        else:
            begin[p] = s
    return begin, found


def gaps_of(partition: InputPartition) -> list[dict[str, Any]]:
    """The gaps found so far in the topic a read task reads (``core/gaps.py``)."""
    return list(getattr(partition, "gaps", None) or [])


def plan_offsets(start: dict[str, int], latest: dict[str, int], max_rows: int | None) -> dict[str, int]:
    """End offsets for one batch: everything available, or at most ``max_rows`` shared fairly."""
    available = {p: max(0, latest[p] - start.get(p, 0)) for p in latest}
    end = {p: start.get(p, 0) for p in latest}
    if max_rows is None:
        return dict(latest)
    budget = max_rows
    pending = sorted((n, p) for p, n in available.items() if n > 0)
    while pending and budget > 0:
        share = max(1, budget // len(pending))
        nxt = []
        for n, p in pending:
            take = min(n, share, budget)
            end[p] += take
            budget -= take
            if n - take > 0:
                nxt.append((n - take, p))
            if budget == 0:
                break
        pending = nxt
    return end


class KafkaInputPartition(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int, gaps: list[dict[str, Any]] | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.gaps = gaps or []
        """The gaps found in the topic so far (``core/gaps.py``)."""


class KafkaReadTask(InputPartition):
    """Several partitions' ranges read one after the other by one task (``minRowsPerTask``)."""

    def __init__(self, ranges: list[KafkaInputPartition]) -> None:
        super().__init__(tuple(r.value for r in ranges))
        self.ranges = ranges
        self.gaps = ranges[0].gaps if ranges else []


def group_ranges(ranges: list[KafkaInputPartition], min_rows: int) -> list[InputPartition]:
    """``ranges`` as read tasks of at least ``min_rows`` messages each where the batch has that
    many (never more tasks than ranges); the largest ranges first, each to the task with the
    fewest messages so far, so the tasks come out about even."""
    total = sum(r.end - r.start for r in ranges)
    tasks = max(1, min(len(ranges), total // min_rows)) if min_rows > 0 else len(ranges)
    if tasks >= len(ranges):
        return list(ranges)
    bins: list[list[KafkaInputPartition]] = [[] for _ in range(tasks)]
    rows = [0] * tasks
    for r in sorted(ranges, key=lambda r: (r.start - r.end, r.partition)):
        i = rows.index(min(rows))
        bins[i].append(r)
        rows[i] += r.end - r.start
    out: list[InputPartition] = []
    for b in bins:
        b.sort(key=lambda r: r.partition)
        out.append(b[0] if len(b) == 1 else KafkaReadTask(b))
    return out


class _RangeRead:
    """One range's read: where it is, whether its first offset was checked, its rows so far (each
    ``(partition, offset, key, value, broker time, the cluster its headers name)``; the last only
    when ``headers`` is asked for: ``core.batch.header_cluster``)."""

    __slots__ = ("headers", "position", "range", "rows", "unchecked")

    def __init__(self, part: KafkaInputPartition, headers: bool = False) -> None:
        self.range = part
        self.position = part.start
        self.unchecked = True
        self.headers = headers
        self.rows: list[tuple[int, int, bytes | None, bytes | None, int | None, str | None]] = []

    def add(self, offset: int, log_ms: int | None, key: bytes | None, value: bytes | None, named: str | None) -> None:
        self.rows.append((self.range.partition, offset, key, value, log_ms, named))
        self.position = offset + 1

    def take(self) -> list[tuple[int, int, bytes | None, bytes | None, int | None, str | None]]:
        """The rows so far (and no rows after)."""
        rows, self.rows = self.rows, []
        return rows


def arrow_rows(topic: str, rows: list[tuple[int, int, bytes | None, bytes | None, int | None, str | None]]) -> pa.RecordBatch:
    """A range's rows as one Arrow batch of the source's schema."""
    partition, offset, key, value, log_ms, _named = zip(*rows, strict=True) if rows else ((),) * 6
    cols = ([topic] * len(rows), partition, offset, log_ms, key, value)
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, _ARROW_SCHEMA, strict=True)],
                                      schema=_ARROW_SCHEMA)


def _take(m: Any, by_key: dict[tuple[str, int], _RangeRead], not_deleted: Callable[[_RangeRead, int], None]) -> None:
    """One consumed message into its range's rows (an error raised, one past the range's end ends it,
    one before its position skipped)."""
    err = m.error()
    if err is not None:
        if err.code() in NOT_THE_PARTITIONS:
            return
        msg = f"Kafka error reading {m.topic()}[{m.partition()}]: {err}"
        raise RuntimeError(msg)
    read = by_key.get((m.topic(), m.partition()))
    if read is None:
        return
    off = m.offset()
    if read.unchecked:
        not_deleted(read, off)
    if off >= read.range.end:
        read.position = read.range.end
        return
    if off < read.position:
        return
    ts_type, ts = m.timestamp()
    read.add(off, ts if ts_type == TIMESTAMP_LOG_APPEND_TIME else None, m.key(), m.value(),
             header_cluster(m.headers()) if read.headers else None)


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        # Spark hands a Python data source its options with lower-cased keys.
        self.options = {k.lower(): v for k, v in options.items()}
        if "bootstrap.servers" not in self.options or "subscribe" not in self.options:
            msg = "safepoint_kafka source needs options bootstrap.servers and subscribe"
            raise ValueError(msg)
        self.topic = self.options["subscribe"]
        self.control_topic = self.options.get("controltopic") or None
        self.starting = self.options.get("startingoffsets", "earliest")
        limit = self.options.get("maxoffsetspertrigger")
        self.max_rows = int(limit) if limit else None
        first = int(self.options.get("maxoffsetsfirsttrigger", "0") or 0)
        if first < 0:
            msg = f"safepoint_kafka source option maxOffsetsFirstTrigger must be >= 0, got {first}"
            raise ValueError(msg)
        self.first_max_rows = first or None
        self._planned = False
        """Whether this reader planned a batch with messages yet (the first one takes ``first_max_rows``).
        Spark keeps one reader for the query's run, in its source runner process."""
        self.timeout_s = float(self.options.get("readtimeoutseconds", "120"))
        self.min_rows_per_task = int(self.options.get("minrowspertask", "0"))
        if self.min_rows_per_task < 0:
            msg = f"safepoint_kafka source option minRowsPerTask must be >= 0, got {self.min_rows_per_task}"
            raise ValueError(msg)
        self._id_checked: dict[str, float] = {}
        self._planned_on: tuple[dict[str, Any], dict[str, tuple[int, int]]] | None = None
        """(the end offset ``latestOffset`` planned last, the partitions' offsets it planned on):
        ``partitions`` of that very batch reads them again only when it is made anew (a run again)."""
        self._late: list[dict[str, Any]] = []
        """Gaps found when a batch's read tasks were made (``partitions``): the next offset records them."""
        self._printed_at: float | None = None
        """When the fingerprints were last checked and taken (None: not yet in this run)."""

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def topics(self) -> list[tuple[str, bool]]:
        """(topic, whether it is the control topic) of every topic read."""
        return [(self.topic, False)] + ([(self.control_topic, True)] if self.control_topic else [])

    def topic_of(self, key: str) -> tuple[str, int]:
        """The topic and Kafka partition of an offset key."""
        p = int(key)
        if is_control(p):
            assert self.control_topic is not None
            return self.control_topic, kafka_partition(p)
        return self.topic, p

    def _watermarks(self) -> dict[str, tuple[int, int]]:

        consumer = _consumer(self.options)
        marks = {}
        for name, control in self.topics():
            deadline = time.monotonic() + LEADER_WAIT_S
            while True:  # a broker stopping or starting may answer without the topic for a moment: waited out
                md = consumer.list_topics(name, timeout=30)
                topic = md.topics.get(name)
                if topic is not None and topic.error is None:
                    break
                if time.monotonic() >= deadline:
                    msg = f"topic {name} is not available: {topic.error if topic else 'missing'}"
                    raise RuntimeError(msg)
                time.sleep(0.2)
            for p in sorted(topic.partitions):  # a leader moving (a broker died) is waited out
                marks[partition_key(p, control)] = watermarks(consumer, name, p, LEADER_WAIT_S)
        return marks

    def initialOffset(self) -> dict[str, int]:
        marks = self._watermarks()
        idx = 1 if self.starting == "latest" else 0
        return {p: m[idx] for p, m in marks.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def _known_gaps(self, offsets: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The gaps an offset records, with those found since it was planned."""
        known = list(offsets.get(GAPS) or [])
        last = known[-1]["id"] if known else 0
        return known + [g for g in self._late if g["id"] > last]

    def _topic_id(self, topic: str, known: str | None) -> str | None:
        """``topic``'s id (None: the broker gives none), asked at most every ``TOPIC_ID_EVERY_S``
        while it stays ``known``."""
        now = time.monotonic()
        if known is not None and now - self._id_checked.get(topic, -TOPIC_ID_EVERY_S) < TOPIC_ID_EVERY_S:
            return known
        self._id_checked[topic] = now
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        try:
            conf = client_conf(self.options)
            tag = json.dumps(conf, sort_keys=True, default=str)
            admin = _ADMINS.get(tag)
            if admin is None:
                admin = _ADMINS[tag] = AdminClient(conf)
            description = admin.describe_topics(TopicCollection([topic]))[topic].result(10)
        except Exception:  # noqa: BLE001 - a broker without describe_topics: offsets alone tell
            return known
        tid = str(description.topic_id)
        return None if tid == NO_TOPIC_ID else tid

    def _print(self, key: str, offset: int) -> list[int] | None:
        """The fingerprint of the record at ``offset`` of the partition ``key``: [offset, timestamp type,
        timestamp, crc32 of key and value]; None when the partition holds no record there now."""
        from confluent_kafka import TopicPartition

        name, kp = self.topic_of(key)
        consumer = _consumer(self.options)
        consumer.assign([TopicPartition(name, kp, offset)])
        try:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                for m in consumer.consume(num_messages=1, timeout=0.5):
                    if m.error() is not None:
                        continue
                    if m.offset() != offset:
                        return None
                    ts_type, ts = m.timestamp()
                    return [offset, ts_type, ts, zlib.crc32(m.value() or b"", zlib.crc32(m.key() or b""))]
            return None
        finally:
            consumer.unassign()

    def _reprinted(self, start: Mapping[str, Any], marks: Mapping[str, tuple[int, int]]) -> tuple[set[bool], dict[str, Any]]:
        """Whether it is time, the topics (control or not) whose fingerprinted record changed, and the prints to
        keep: ({...}, prints) with every print still checkable, each read again."""
        prints = dict(start.get(PRINTS) or {})
        now = time.monotonic()
        if self._printed_at is not None and now - self._printed_at < PRINT_EVERY_S:
            return set(), prints
        self._printed_at = now
        changed: set[bool] = set()
        for key, was in sorted(prints.items()):
            lo, hi = marks.get(key, (0, 0))
            if not lo <= was[0] < hi:
                del prints[key]  # retention removed it (it cannot be read), or the partition ends below it (offsets tell)
                continue
            if self._print(key, was[0]) != was:
                changed.add(is_control(int(key)))
                log.warning("safepoint_kafka: %s[%s] offset %d is no longer the record the job read there: the topic was "
                            "made again", *self.topic_of(key), was[0])
        return changed, prints

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        marks = self._watermarks()
        known = self._known_gaps(start)
        last, now_ms = known[-1]["id"] if known else 0, int(time.time() * 1000)
        begin: dict[str, int] = {}
        found: list[dict[str, Any]] = []
        ids: dict[str, str] = {}
        due = self._printed_at is None or time.monotonic() - self._printed_at >= PRINT_EVERY_S
        changed, prints = self._reprinted(start, marks)
        for name, control in self.topics():  # each topic on its own; the gap ids one sequence
            id_key = CONTROL_TOPIC_ID if control else TOPIC_ID
            was = start.get(id_key)
            tid = self._topic_id(name, was)
            if tid is not None:
                ids[id_key] = tid
            b, f = find_gaps(of_topic(partition_offsets(start), control), of_topic(marks, control), name, last, now_ms,
                             made_again=(was is not None and tid is not None and tid != was) or control in changed)
            begin.update({partition_key(int(p), control): o for p, o in b.items()})
            for g in f:
                if control:
                    g["control"] = True
                last = g["id"]
            found += f
        for g in found:
            log.warning("safepoint_kafka: gap %s: %s; every node whose events were there must restate its holds",
                        g["id"], Gap.of(g).what())
        latest = {p: max(begin[p], m[1]) for p, m in marks.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if not self._planned and self.first_max_rows is not None:
            max_rows = self.first_max_rows if max_rows is None else min(max_rows, self.first_max_rows)
        planned = plan_offsets(begin, latest, max_rows)
        if planned != begin:
            self._planned = True
        end: dict[str, Any] = dict(planned)
        gaps = (known + found)[-GAPS_KEPT:]
        if gaps:
            end[GAPS] = gaps
        end.update(ids)
        prints = {k: v for k, v in prints.items() if is_control(int(k)) not in changed}
        # the last record this batch reads, in the offset the checkpoint keeps; only where the batch reads the
        # partition: an offset that changes without new records would make Spark run an empty batch
        for key, at in planned.items():
            if begin[key] < at and (key not in prints or (due and prints[key][0] < at - 1)):
                taken = self._print(key, at - 1)
                if taken is not None:
                    prints[key] = taken
        if prints:
            end[PRINTS] = prints
        self._planned_on = (end, marks)
        return end

    def reportLatestOffset(self) -> dict[str, int] | None:
        return {p: m[1] for p, m in self._watermarks().items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """The batch's read tasks: each partition from where the last batch ended, or past the gaps
        found since (``latestOffset``), or past records deleted since it was planned (found again
        here, when the batch is made or run again)."""
        first = partition_offsets(start)
        gaps = self._known_gaps(end)
        seen = max((g["id"] for g in start.get(GAPS) or []), default=0)
        for g in gaps:
            if g["id"] > seen and g["partition"] >= 0 and g["kind"] != "partitions":
                first[partition_key(g["partition"], bool(g.get("control")))] = g["end"]
        ends = partition_offsets(end)
        planned = self._planned_on
        # the batch just planned: its partitions' offsets of a moment ago (a record deleted since fails its
        # read task, and the batch made again finds it here); any other (a batch run again after a restart): now
        marks = planned[1] if planned is not None and planned[0] == end else self._watermarks() if ends else {}
        for p in sorted(ends, key=int):
            lo, hi = marks.get(p, (0, 0))
            s = first.get(p, lo)
            kind = "gone_back" if ends[p] > hi else "lost" if s < lo and s < ends[p] else None
            if kind is None:
                continue
            now_ms = int(time.time() * 1000)
            name, kp = self.topic_of(p)
            late = {"id": max(now_ms, (gaps[-1]["id"] if gaps else 0) + 1), "topic": name, "partition": kp,
                    "first": s, "end": lo, "kind": kind, "ms": now_ms, **({"control": True} if is_control(int(p)) else {})}
            log.warning("safepoint_kafka: gap %s: %s (found when the batch was made: after it was planned)", late["id"],
                        Gap.of(late).what())
            self._late.append(late)
            gaps.append(late)
            first[p] = lo
            if kind == "gone_back":
                ends[p] = min(ends[p], hi)  # a batch planned on the topic before it was made again: what is there
        parts: list[KafkaInputPartition] = []
        for p in sorted(ends, key=int):
            s, e = int(first.get(p, 0)), ends[p]
            if e > s:
                parts.append(KafkaInputPartition(*self.topic_of(p), s, e, gaps[-GAPS_KEPT:]))
        return group_ranges(parts, self.min_rows_per_task)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for topic, rows in self.read_rows(partition):
            yield arrow_rows(topic, rows)

    def read_rows(self, partition: InputPartition, headers: bool = False) -> Iterator[
            tuple[str, list[tuple[int, int, bytes | None, bytes | None, int | None, str | None]]]]:
        """A read task's messages as (topic, rows) chunks (``_RangeRead``'s rows; ``headers``: with the
        cluster each record's headers name)."""
        freeze_once()
        if isinstance(partition, KafkaReadTask):
            ranges = partition.ranges
        else:
            assert isinstance(partition, KafkaInputPartition)
            ranges = [partition]
        if len(ranges) > 1 and sum(r.end - r.start for r in ranges) <= _READ_TOGETHER:
            yield from self._read(ranges, headers)  # a small batch's ranges: one assignment, one fetch round for all
            return
        for r in ranges:
            yield from self._read([r], headers)

    def _read(self, ranges: list[KafkaInputPartition], headers: bool) -> Iterator[
            tuple[str, list[tuple[int, int, bytes | None, bytes | None, int | None, str | None]]]]:
        """The messages of ``ranges`` (each a partition's offsets), assigned together and read until
        each reaches its end; rows range by range in the task's order (a single range's in chunks of
        ``_READ_CHUNK`` as they come)."""
        from confluent_kafka import TopicPartition

        consumer = _consumer(self.options)
        reads = [_RangeRead(r, headers) for r in ranges]
        by_key = {(r.range.topic, r.range.partition): r for r in reads}
        streaming = len(reads) == 1

        def not_deleted(read: _RangeRead, seen: int) -> None:
            """The range's first offset seen is past its start: were the records before it deleted after the
            batch was planned (a marker of a transaction also takes an offset)? Asked once per range, and
            only then: a range that starts where it should costs no round trip."""
            if not read.unchecked or seen <= read.range.start:
                read.unchecked = False
                return
            read.unchecked = False
            part = read.range
            lo, _hi = watermarks(consumer, part.topic, part.partition, LEADER_WAIT_S)
            if lo > part.start:
                msg = (f"events lost while reading {part.topic}[{part.partition}]: offsets {part.start}.."
                       f"{lo - 1} were deleted after the batch was planned; the batch fails and, run again, takes them "
                       "as a gap (every node whose events were there must restate its holds)")
                raise RuntimeError(msg)

        consumer.assign([TopicPartition(r.range.topic, r.range.partition, r.range.start) for r in reads])
        deadline = time.monotonic() + self.timeout_s
        try:
            while pending := [r for r in reads if r.position < r.range.end]:
                left = sum(r.range.end - r.position for r in pending)
                msgs = consumer.consume(num_messages=min(10_000, left), timeout=0.5)
                if not msgs:
                    # gaps (compaction, transaction markers) end a range without a message
                    for r in pending:
                        pos = consumer.position([TopicPartition(r.range.topic, r.range.partition)])[0].offset
                        if pos >= r.range.end:
                            not_deleted(r, pos)
                            r.position = r.range.end
                    stalled = next((r for r in reads if r.position < r.range.end), None)
                    if stalled is not None and time.monotonic() > deadline:
                        part = stalled.range
                        msg = f"reading {part.topic}[{part.partition}] offsets {part.start}..{part.end} stalled at {stalled.position}"
                        raise TimeoutError(msg)
                    continue
                for m in msgs:
                    _take(m, by_key, not_deleted)
                if streaming and len(reads[0].rows) >= _READ_CHUNK:
                    yield reads[0].range.topic, reads[0].take()
                deadline = time.monotonic() + self.timeout_s
            for r in reads:
                if r.rows:
                    yield r.range.topic, r.take()
        finally:
            consumer.unassign()

    def commit(self, end: dict[str, int]) -> None:
        """Offsets live in Spark's checkpoint; nothing to commit to Kafka."""

    def stop(self) -> None:
        for consumer in _CONSUMERS.values():
            try:
                consumer.close()
            except Exception:  # noqa: BLE001, S110 - closing on shutdown, nothing to do
                pass
        _CONSUMERS.clear()


class KafkaDataSource(DataSource):
    """``spark.dataSource.register(KafkaDataSource)`` then ``format("safepoint_kafka")``."""

    @classmethod
    def name(cls) -> str:
        return "safepoint_kafka"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return KafkaStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return KafkaStreamWriter(self.options)
