"""The job's Spark operators: thin adapters between Spark rows and the core's batch functions.

``Router`` runs before the shuffle (in the Python source's read tasks, or as a ``mapInArrow``
after Spark's kafka source) and calls ``core.batch.route``: one packed row per cluster and Arrow
batch. ``ClusterJob`` is the job's one stateful operator, keyed by cluster: it runs
``core.batch.BatchRun`` over the cluster's messages of the batch, with the cluster's state in a
value and its nodes' in a map of buckets (read and written only when the batch touches them), and
produces the outputs itself (``produce``): each is sent the moment the batch logic yields it, and
every delivery is confirmed when the task ends, before Spark commits its state. Behind Spark's
Kafka sink it returns them as (topic, key, value) rows instead. It also returns one row of the
batch's accounting counters; what it stores it keeps in its process too (``stored.KEPT``), for the
next batch to take as it is if the store gives back those very bytes. Neither holds a rule: they
unpack, read and write state values, and translate rows; the bytes are ``streaming/stored.py``'s. Packed rows (a cluster's ``Group``,
``pack_group``) live only inside one micro-batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from safepoint.core.batch import METRICS, BatchRun, Emitted, Group, admit, header_cluster, route_records
from safepoint.core.codec import encode
from safepoint.core.gaps import Gap
from safepoint.core.origin import CONTROL, EVENTS
from safepoint.core.outputs import ALERTS, DEADLETTER, DIRECTIVES
from safepoint.core.policy import Policies, Policy
from safepoint.core.recovery import StartPlan
from safepoint.core.status import STATUS
from safepoint.gcfreeze import freeze_once, paused
from safepoint.streaming.kafka_sink import Outbox
from safepoint.streaming.stored import (
    KEPT,
    pack_group,
    stored_cluster,
    stored_nodes,
    unpack_groups,
    written_buckets,
    written_cluster,
)

__all__ = ["Router", "origins", "ClusterJob", "ROUTED_SCHEMA", "OUTPUT_SCHEMA", "SINK_COLUMNS"]

ROUTED_SCHEMA = StructType([
    StructField("cluster", StringType(), True),
    StructField("blob", BinaryType(), True),
])
"""The router's rows: one per cluster and Arrow batch; ``blob`` packs a ``Group`` (``pack_group``)."""
SINK_COLUMNS = ("topic", "key", "value")
OUTPUT_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("key", StringType(), True),
        StructField("value", StringType(), False),
    ]
    + [StructField(m, LongType(), False) for m in METRICS]
)
"""``ClusterJob``'s rows: the sink's columns, then the accounting counters (0 on output rows; one
row per cluster and batch with an empty ``topic`` carries them, and is dropped before the sink)."""
_VALUE = StructType([StructField("value", BinaryType(), False)])
_BUCKET = StructType([StructField("bucket", IntegerType(), False)])
_NO_COUNTS = dict.fromkeys(METRICS, 0)


def unpack(rows: Iterator[Row]) -> Group:
    """The records of one cluster's packed rows."""
    return unpack_groups(row["blob"] for row in rows)


def origins(events_topic: str, control_topic: str | None) -> dict[str, str]:
    """The router's ``origins`` for a job reading ``events_topic`` and ``control_topic`` (if any)."""
    return {events_topic: EVENTS, **({control_topic: CONTROL} if control_topic else {})}


class Router:
    """Kafka rows in, one packed row per cluster and batch out (``core.batch.route_records``: a
    record whose ``safepoint-cluster`` header names its cluster goes through unread). ``origins``:
    each topic read -> its origin (``core/origin.py``: ``events`` or ``control``). Called on Arrow
    batches (a ``mapInArrow`` after Spark's kafka source: a batch with a ``topic`` column is routed
    by it, one without is of the one topic named; a ``headers`` column, Spark's, is read for the
    header), or by the Python source on its rows (``pack``)."""

    def __init__(self, policy: dict[str, Any], origins: Mapping[str, str], gaps: list[dict[str, Any]] | None = None) -> None:
        self.policy = policy
        self.origins = dict(origins)
        self.gaps = gaps or []
        """The gaps the source found so far (``core/gaps.py``), handed to every cluster."""
        self._policy: Policy | None = None

    def _ready(self) -> tuple[Policy, list[Gap]]:
        if self._policy is None:
            freeze_once()
            self._policy = Policies.from_dict(self.policy).default  # a message's size limit: before its cluster is known
        return self._policy, [Gap.of(g) for g in self.gaps]

    def _origin(self, topic: str) -> str:
        """``topic``'s origin; a topic the router was not given is refused."""
        origin = self.origins.get(topic)
        if origin is None:
            msg = f"the router reads {', '.join(self.origins)}, not {topic}"
            raise ValueError(msg)
        return origin

    def pack(self, topic: str, rows: list[tuple[int, int, bytes | None, bytes | None, int | None, str | None]]) -> Any:
        """One chunk of ``topic``'s rows (partition, offset, key, value, broker time, the cluster its
        header names) as packed rows: cluster, blob."""
        policy, gaps = self._ready()
        origin = self._origin(topic)
        with paused():
            groups = route_records(rows, topic, policy, gaps, origin)
            return _packed(groups)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        policy, gaps = self._ready()
        only = next(iter(self.origins)) if len(self.origins) == 1 else None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            with paused():
                cols = batch.to_pydict()
                heads = cols.get("headers")
                named = ([header_cluster((h["key"], h["value"]) for h in hs) if hs else None for hs in heads]
                         if heads is not None else [None] * batch.num_rows)
                rows = list(zip(cols["partition"], cols["offset"], cols["key"], cols["value"], cols["timestamp"], named,
                                strict=True))
                topics = cols.get("topic") or [only] * len(rows)
                groups: dict[str, Group] = {}
                seen = list(dict.fromkeys(topics))
                for topic in seen:
                    origin = self._origin(topic)
                    these = rows if len(seen) == 1 else [r for r, t in zip(rows, topics, strict=True) if t == topic]
                    for cluster, group in route_records(these, topic, policy, gaps, origin).items():
                        have = groups.get(cluster)
                        if have is None:
                            groups[cluster] = group
                        else:  # a gap twice: the operator takes it once
                            have.routed.extend(group.routed)
                            have.raw.extend(group.raw)
                packed = _packed(groups)
                del cols, rows, groups
            yield packed


def _packed(groups: dict[str, Group]) -> Any:
    """One packed row per cluster, as Arrow (imported here: a worker daemon preloads this module, and
    pyarrow only where it starts no thread), nullable as the Python source's declared schema
    (``cluster string, blob binary``)."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array(list(groups), pa.string()), pa.array([pack_group(g) for g in groups.values()], pa.binary())],
        schema=pa.schema([("cluster", pa.string()), ("blob", pa.binary())]),
    )


class ClusterJob(StatefulProcessor):
    """One cluster's micro-batch through the core: its state a value, its nodes' a map of buckets."""

    def __init__(self, policy: dict[str, Any], buckets: int, topics: dict[str, str], accounting_topic: str = "",
                 start: dict[str, Any] | None = None, produce: dict[str, str] | None = None) -> None:
        self.policy_dict = policy
        self.buckets = buckets
        self.topics = topics
        self.accounting_topic = accounting_topic
        self.start_dict = start
        """``StartPlan.to_json()``: how clusters without state start (a start on empty state)."""
        self.produce = produce
        """The Kafka options (``bootstrap.servers``, ``kafka.*``) when the operator produces its
        outputs itself (the query's sink is then ``noop``); None: it returns them as rows."""
        self.scope = uuid.uuid4().hex
        """This query's states in a worker's ``KEPT`` (made once, on the driver: every task of the
        query has it, another query or a restarted one another)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_once()
        self.policies = Policies.from_dict(self.policy_dict)
        self.start = StartPlan.from_json(self.start_dict)
        self.cluster = handle.getValueState("cluster", _VALUE)
        self.nodes = handle.getMapState("nodes", _BUCKET, _VALUE)
        topics = self.topics
        self.channel_topic = {DIRECTIVES: topics["directives"], ALERTS: topics["alerts"],
                              DEADLETTER: topics["deadletter"], STATUS: topics.get("status", ""),
                              None: self.accounting_topic}
        self.outbox = Outbox(self.produce) if self.produce is not None else None
        self.read_topics = {EVENTS: topics.get("events", ""), CONTROL: topics.get("control", "")}
        """Each origin's topic, named by the dead letters of the messages parsed here (``admit``)."""

    def _bucket(self, bucket: int) -> bytes | None:
        value = self.nodes.getValue((bucket,))
        return None if value is None else bytes(value[0])

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        topics = self.channel_topic
        returned: list[Emitted] = []
        with paused():
            group = unpack(rows)
            items = group.routed
            if group.raw:  # parsed here, once: the router handed them through unread
                items += admit(key[0], group.raw, self.read_topics, self.policies.default,
                               typed=not self.policies.of(key[0]).node_key_secret)
            cluster, scope = key[0], self.scope
            stored = self.cluster.get()  # None when missing: no exists() round trip first
            nodes = stored_nodes(cluster, self.buckets, self._bucket, KEPT, scope)
            run = BatchRun(cluster, None if stored is None else stored_cluster(cluster, bytes(stored[0]), KEPT, scope),
                           nodes, items, self.policies.of(cluster), bool(self.accounting_topic), self.start)
            if self.outbox is not None:  # each output sent the moment the batch logic makes it
                send = self.outbox.send
                for channel, okey, ovalue in run.outputs():
                    send(topics[channel], okey, encode(ovalue))
            else:
                returned = list(run.outputs())
            del items, group
        result = run.result
        assert result is not None
        for bucket, value in written_buckets(nodes, result.buckets, self.buckets, KEPT, scope).items():
            self.nodes.updateValue((bucket,), (value,))
        if result.cluster is not None:
            self.cluster.update((written_cluster(result.cluster, KEPT, scope),))
        for channel, okey, ovalue in returned:  # none when the operator produced them itself
            yield Row(topic=topics[channel], key=okey, value=encode(ovalue), **_NO_COUNTS)
        yield Row(topic="", key=None, value="", **result.counts)

    def close(self) -> None:
        """At the end of the task, before Spark commits its state: with ``produce``, wait for the
        delivery of everything the task's clusters sent. A failure raises, the task fails and its
        state is not committed, so Spark runs the batch again (at-least-once, as the sink: what was
        sent before the failure is sent again)."""
        if self.outbox is not None:
            self.outbox.wait()
