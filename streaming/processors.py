"""The job's Spark operators: thin adapters between Spark rows and the core's batch functions.

``Router`` runs before the shuffle (in the Python source's read tasks, or as a ``mapInArrow``
after Spark's kafka source) and calls ``core.batch.route``; ``BucketProcessor`` (keyed by cluster
and node bucket) calls ``stage_one_bucket``; ``ClusterProcessor`` (keyed by cluster) calls
``stage_two`` and turns its outputs into the sink's (topic, key, value) rows. None of them holds a
rule: they unpickle, restore and save state values, and translate rows. The packed payloads
between operators live only inside one micro-batch (pickled ``Routed``/``Staged`` tuples); state
stays JSON.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from safepoint.core.batch import METRICS, route, stage_one_bucket, stage_two
from safepoint.core.codec import encode
from safepoint.core.outputs import ALERTS, DEADLETTER, DIRECTIVES
from safepoint.core.policy import Policy
from safepoint.core.recovery import StartPlan
from safepoint.core.status import STATUS
from safepoint.gcfreeze import freeze_once, paused

__all__ = ["Router", "BucketProcessor", "ClusterProcessor", "ROUTED_SCHEMA", "STAGED_SCHEMA", "OUTPUT_SCHEMA",
           "stored_value"]

PICKLE_PROTOCOL = 5

ROUTED_SCHEMA = StructType([
    StructField("cluster", StringType(), True),
    StructField("bucket", IntegerType(), True),
    StructField("blob", BinaryType(), True),
])
"""The router's rows: one per (cluster, bucket) and Arrow batch; ``blob`` pickles ``Routed`` items."""
STAGED_SCHEMA = StructType(
    [StructField("cluster", StringType(), False), StructField("blob", BinaryType(), False)]
    + [StructField(m, LongType(), False) for m in METRICS]
)
"""Stage one's rows: one per (cluster, bucket) and batch; ``blob`` pickles ``Staged`` items, and the
accounting counters ride along as columns (observed by the query)."""
OUTPUT_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("key", StringType(), True),
        StructField("value", StringType(), False),
    ]
)
_STATE_SCHEMA = StructType([StructField("json", StringType(), False)])


def stored_value(state: Any) -> str | None:
    """The JSON string a processor's value state holds, or None."""
    if not state.exists():
        return None
    value = state.get()
    assert value is not None
    return str(value[0])


def unpack(rows: Iterator[Row]) -> list[Any]:
    """The items of one group's packed rows."""
    items: list[Any] = []
    for row in rows:
        items.extend(pickle.loads(row["blob"]))  # noqa: S301 - packed by this query's previous operator
    return items


class Router:
    """Raw Kafka rows (Arrow batches) in, one packed row per (cluster, bucket) and batch out."""

    def __init__(self, policy: dict[str, Any], topic: str, buckets: int) -> None:
        self.policy = policy
        self.topic = topic
        self.buckets = buckets

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        freeze_once()
        policy = Policy.from_dict(self.policy)
        # nullable, as the Python source's declared schema (``cluster string, bucket int, blob binary``)
        schema = pa.schema([("cluster", pa.string()), ("bucket", pa.int32()), ("blob", pa.binary())])
        for batch in batches:
            if batch.num_rows == 0:
                continue
            with paused():
                cols = batch.to_pydict()
                rows = zip(cols["partition"], cols["offset"], cols["key"], cols["value"], strict=True)
                groups = route(rows, self.topic, policy, self.buckets)
                packed = pa.RecordBatch.from_arrays(
                    [
                        pa.array([c for c, _ in groups], pa.string()),
                        pa.array([b for _, b in groups], pa.int32()),
                        pa.array([pickle.dumps(g, PICKLE_PROTOCOL) for g in groups.values()], pa.binary()),
                    ],
                    schema=schema,
                )
                del cols, rows, groups
            yield packed


class BucketProcessor(StatefulProcessor):
    """Stage one: the nodes of one (cluster, bucket)."""

    def __init__(self, policy: dict[str, Any], buckets: int) -> None:
        self.policy_dict = policy
        self.buckets = buckets

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_once()
        self.policy = Policy.from_dict(self.policy_dict)
        self.state = handle.getValueState("bucket", _STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        with paused():
            new_state, out, counts = stage_one_bucket(stored_value(self.state), unpack(rows), self.policy, self.buckets)
            blob = pickle.dumps(out, PICKLE_PROTOCOL)
            del out
        if new_state is not None:
            self.state.update((new_state,))
        yield Row(cluster=key[0], blob=blob, **counts)

    def close(self) -> None:
        pass


class ClusterProcessor(StatefulProcessor):
    """Stage two: one cluster's round, safe point, directives and alerts over the staged items."""

    def __init__(self, policy: dict[str, Any], topics: dict[str, str], accounting_topic: str = "",
                 start: dict[str, Any] | None = None) -> None:
        self.policy_dict = policy
        self.topics = topics
        self.accounting_topic = accounting_topic
        self.start_dict = start
        """``StartPlan.to_json()``: how clusters without state start (a start on empty state)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_once()
        self.policy = Policy.from_dict(self.policy_dict)
        self.start = StartPlan.from_json(self.start_dict)
        self.state = handle.getValueState("cluster", _STATE_SCHEMA)
        self.channel_topic = {
            DIRECTIVES: self.topics["directives"],
            ALERTS: self.topics["alerts"],
            DEADLETTER: self.topics["deadletter"],
            STATUS: self.topics.get("status", ""),
        }

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        with paused():
            new_state, outputs = stage_two(key[0], stored_value(self.state), unpack(rows), self.policy,
                                           bool(self.accounting_topic), self.start)
        for channel, okey, ovalue in outputs:
            topic = self.accounting_topic if channel is None else self.channel_topic[channel]
            yield Row(topic=topic, key=okey, value=encode(ovalue))
        if new_state is not None:
            self.state.update((new_state,))

    def close(self) -> None:
        pass
