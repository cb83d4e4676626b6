"""A Kafka source and sink for Spark Structured Streaming without the JVM connector.

Registered as the format ``safepoint_kafka``. Reading: one Spark partition per Kafka
partition, per-partition offsets kept in Spark's checkpoint (``{"<partition>": next_offset}``),
a ``maxOffsetsPerTrigger`` cap shared fairly over partitions, clients created lazily in the
process that uses them, consumers ``unassign()``ed after each read. Writing: rows with
``topic``, ``key``, ``value`` (strings) are produced by an idempotent producer; a failed
delivery fails the task so Spark retries it (at-least-once).

Options: ``bootstrap.servers`` (required), ``subscribe`` (the topic), ``startingOffsets``
(``earliest`` or ``latest``), ``maxOffsetsPerTrigger``, and any ``kafka.<librdkafka key>``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from safepoint.gcfreeze import freeze_once

__all__ = ["KafkaDataSource", "SOURCE_SCHEMA", "SINK_COLUMNS", "PACK_OPTION", "PACKED_SCHEMA", "plan_offsets"]

log = logging.getLogger(__name__)

SOURCE_SCHEMA = "topic string, partition int, offset long, timestamp long, key binary, value binary"
SINK_COLUMNS = ("topic", "key", "value")
PACK_OPTION = "safepoint.pack"
"""With ``safepoint.pack = true`` the source runs the fast path's router in its own read tasks
(``safepoint.streaming.packed.Router``, options ``safepoint.policy`` (JSON) and
``safepoint.buckets``) and returns packed rows: one Python hop per batch fewer than a separate
``mapInArrow`` (measured: about 1 s per 50,000-message batch on 2 cores)."""
PACKED_SCHEMA = "cluster string, bucket int, blob binary"
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

# Clients live per Python worker process, keyed by their configuration; never pickled.
_CONSUMERS: dict[str, Any] = {}
_PRODUCERS: dict[str, Any] = {}


def _packing(options: Mapping[str, str]) -> bool:
    """Whether the source runs the fast path's router (``safepoint.pack = true``)."""
    return options.get(PACK_OPTION, "").lower() == "true"


def _client_conf(options: Mapping[str, str]) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": options["bootstrap.servers"]}
    for k, v in options.items():
        if k.startswith("kafka."):
            conf[k[len("kafka.") :]] = v
    return conf


def _consumer(options: Mapping[str, str]) -> Any:
    from confluent_kafka import Consumer

    # Refetch only when fewer than this many messages are queued (librdkafka's default is 100,000):
    # a read task stops at its planned end offset, so prefetching far beyond it is waste, and a
    # broker that answers a fetch at the log end at once (the embedded one) would make the client
    # spin a core while the task converts its rows. Overridable as kafka.queued.min.messages.
    conf = {"queued.min.messages": 10_000, **_client_conf(options)}
    conf.update(
        {
            "group.id": "safepoint-source-unused",  # assign() only: no group membership
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "receive.message.max.bytes": 1_000_000_000,  # the embedded broker ignores fetch limits
            "fetch.wait.max.ms": 50,
        }
    )
    tag = json.dumps(conf, sort_keys=True)
    consumer = _CONSUMERS.get(tag)
    if consumer is None:
        consumer = _CONSUMERS[tag] = Consumer(conf)
    return consumer


def _producer(options: Mapping[str, str]) -> Any:
    from confluent_kafka import Producer

    conf = _client_conf(options)
    conf.setdefault("enable.idempotence", True)
    conf.setdefault("linger.ms", 5)
    tag = json.dumps(conf, sort_keys=True)
    producer = _PRODUCERS.get(tag)
    if producer is None:
        producer = _PRODUCERS[tag] = Producer(conf)
    return producer


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
    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        # Spark hands a Python data source its options with lower-cased keys.
        self.options = {k.lower(): v for k, v in options.items()}
        if "bootstrap.servers" not in self.options or "subscribe" not in self.options:
            msg = "safepoint_kafka source needs options bootstrap.servers and subscribe"
            raise ValueError(msg)
        self.topic = self.options["subscribe"]
        self.starting = self.options.get("startingoffsets", "earliest")
        limit = self.options.get("maxoffsetspertrigger")
        self.max_rows = int(limit) if limit else None
        self.timeout_s = float(self.options.get("readtimeoutseconds", "120"))
        self.pack = _packing(self.options)
        if self.pack:
            try:
                json.loads(self.options["safepoint.policy"])
                if int(self.options["safepoint.buckets"]) < 1:
                    raise ValueError
            except (KeyError, ValueError) as exc:
                msg = (f"{PACK_OPTION}=true needs options safepoint.policy (the policy as JSON) and "
                       f"safepoint.buckets (an integer >= 1): {exc!r}")
                raise ValueError(msg) from exc

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def _watermarks(self) -> dict[str, tuple[int, int]]:
        from confluent_kafka import TopicPartition

        consumer = _consumer(self.options)
        md = consumer.list_topics(self.topic, timeout=30)
        topic = md.topics.get(self.topic)
        if topic is None or topic.error is not None:
            msg = f"topic {self.topic} is not available: {topic.error if topic else 'missing'}"
            raise RuntimeError(msg)
        marks = {}
        for p in sorted(topic.partitions):
            lo, hi = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30, cached=False)
            marks[str(p)] = (lo, hi)
        return marks

    def initialOffset(self) -> dict[str, int]:
        marks = self._watermarks()
        idx = 1 if self.starting == "latest" else 0
        return {p: m[idx] for p, m in marks.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        marks = self._watermarks()
        begin = {p: int(start.get(p, marks[p][0])) for p in marks}
        latest = {p: max(begin[p], m[1]) for p, m in marks.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan_offsets(begin, latest, max_rows)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return {p: m[1] for p, m in self._watermarks().items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for p in sorted(end, key=int):
            s, e = int(start.get(p, 0)), int(end[p])
            if e > s:
                parts.append(KafkaInputPartition(self.topic, int(p), s, e))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        freeze_once()
        if not self.pack:
            yield from self._read(partition)
            return
        from safepoint.streaming.packed import Router

        router = Router(json.loads(self.options["safepoint.policy"]), self.topic, int(self.options["safepoint.buckets"]))
        yield from router(b.select(["partition", "offset", "key", "value"]) for b in self._read(partition))

    def _read(self, partition: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import KafkaError, TopicPartition

        consumer = _consumer(self.options)
        tp = TopicPartition(partition.topic, partition.partition, partition.start)
        consumer.assign([tp])
        cols: list[list[Any]] = [[], [], [], [], [], []]
        deadline = time.monotonic() + self.timeout_s
        try:
            position = partition.start
            while position < partition.end:
                msgs = consumer.consume(num_messages=min(10_000, partition.end - position), timeout=0.5)
                if not msgs:
                    # gaps (compaction, transaction markers) end the range without a message
                    pos = consumer.position([TopicPartition(partition.topic, partition.partition)])[0].offset
                    if pos >= partition.end:
                        break
                    if time.monotonic() > deadline:
                        msg = (
                            f"reading {partition.topic}[{partition.partition}] offsets "
                            f"{partition.start}..{partition.end} stalled at {position}"
                        )
                        raise TimeoutError(msg)
                    continue
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        msg = f"Kafka error reading {partition.topic}[{partition.partition}]: {err}"
                        raise RuntimeError(msg)
                    off = m.offset()
                    if off >= partition.end:
                        position = partition.end
                        break
                    if off < position:
                        continue
                    ts_type, ts = m.timestamp()
                    cols[0].append(partition.topic)
                    cols[1].append(partition.partition)
                    cols[2].append(off)
                    cols[3].append(ts if ts_type else None)
                    cols[4].append(m.key())
                    cols[5].append(m.value())
                    position = off + 1
                if len(cols[2]) >= _READ_CHUNK:
                    yield pa.RecordBatch.from_arrays(
                        [pa.array(c, type=f.type) for c, f in zip(cols, _ARROW_SCHEMA, strict=True)], schema=_ARROW_SCHEMA
                    )
                    cols = [[], [], [], [], [], []]
                deadline = time.monotonic() + self.timeout_s
            if cols[2]:
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(cols, _ARROW_SCHEMA, strict=True)], schema=_ARROW_SCHEMA
                )
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


class KafkaWriterCommit(WriterCommitMessage):
    def __init__(self, count: int) -> None:
        self.count = count


_DELIVERY_POLL_S = 0.1
_MAX_PRODUCER_REBUILDS = 3


def _fatal(exc: BaseException) -> bool:
    """Whether the producer is dead for good (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER once a broker
    lost acknowledged data): it never sends again and must be rebuilt. confluent-kafka 2.16.1's
    ``flush()`` can raise ``SystemError`` in that state; ``poll()`` raises ``KafkaException``."""
    if isinstance(exc, SystemError):
        return True
    return _fatal_error(exc.args[0] if exc.args else None)


def _fatal_error(err: Any) -> bool:
    """A ``KafkaError`` that is fatal, or ``_FATAL`` (what a dead producer's ``produce()`` raises)."""
    from confluent_kafka import KafkaError

    return isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL)


class KafkaStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)
        # Spark lower-cases a Python data source's option keys
        self.flush_timeout_s = float(self.options.get("flushtimeoutseconds", self.options.get("flushTimeoutSeconds", "60")))

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        """Produce the task's rows and wait for every delivery (``poll()`` until the flush
        timeout, not ``flush()``). A fatal producer error drops the producer and sends again, on a
        new one, every row whose delivery was not confirmed (at most ``_MAX_PRODUCER_REBUILDS``
        times); any other failure fails the task so that Spark retries it."""
        freeze_once()
        from confluent_kafka import KafkaException

        rows = [(row["topic"], row["key"], row["value"]) for row in iterator]
        pending = list(range(len(rows)))
        rebuilds = 0
        while True:
            delivered: dict[int, Any] = {}  # row index -> delivery error (None: delivered)
            error: BaseException | None = None
            try:
                self._send(rows, pending, delivered)
            except (KafkaException, BufferError, SystemError) as exc:
                error = exc
            fatal = (error is not None and _fatal(error)) or any(_fatal_error(err) for err in delivered.values())
            if fatal and rebuilds < _MAX_PRODUCER_REBUILDS:
                _PRODUCERS.clear()  # the dead producer is never polled again: its late reports go nowhere
                rebuilds += 1
                pending = [i for i in pending if i not in delivered or delivered[i] is not None]
                log.warning("the Kafka producer failed fatally (%s); sending %d message(s) again on a new one",
                            error or "delivery error", len(pending))
                continue
            if error is not None:
                _PRODUCERS.clear()
                msg = f"producing to Kafka failed: {error}"
                raise RuntimeError(msg) from error
            failures = [f"{rows[i][0]}: {err}" for i, err in delivered.items() if err is not None]
            remaining = len(pending) - len(delivered)
            if remaining or failures:
                _PRODUCERS.clear()
                msg = f"{len(failures)} deliveries failed, {remaining} unflushed: {failures[:3]}"
                raise RuntimeError(msg)
            return KafkaWriterCommit(len(rows))

    def _send(self, rows: list[tuple[str, Any, Any]], pending: list[int], delivered: dict[int, Any]) -> None:
        """Produce ``rows[i]`` for each pending ``i`` in order, then poll until each has its
        delivery report in ``delivered`` or the flush timeout has passed."""
        producer = _producer(self.options)

        def report(i: int) -> Any:
            def on_delivery(err: Any, msg: Any) -> None:
                delivered[i] = err

            return on_delivery

        for i in pending:
            topic, key, value = rows[i]
            producer.produce(topic, value=value, key=key, on_delivery=report(i))
            producer.poll(0)
        deadline = time.monotonic() + self.flush_timeout_s
        while len(delivered) < len(pending) and time.monotonic() < deadline:
            producer.poll(_DELIVERY_POLL_S)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Each task flushed its own messages before reporting success."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("batch %s aborted; Spark will retry it (outputs may repeat: consumers dedupe by seq)", batchId)


class KafkaDataSource(DataSource):
    """``spark.dataSource.register(KafkaDataSource)`` then ``format("safepoint_kafka")``."""

    @classmethod
    def name(cls) -> str:
        return "safepoint_kafka"

    def schema(self) -> str:
        if _packing(self.options):
            return PACKED_SCHEMA
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return KafkaStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return KafkaStreamWriter(self.options)
