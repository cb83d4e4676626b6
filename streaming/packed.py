"""The fast path: the same two stages, with one row per group and batch instead of one per message.

The plain path (``processors.py``) moves every message through Spark as its own row: the JVM
parses an envelope, shuffles each row to its node's group, and hands it to Python cell by cell;
every node is a state key with its own round trips. Profiles showed that this per-row and
per-key machinery, not the rules, is where the time goes. The fast path keeps every rule and
every order and changes only the packaging:

1. ``Router`` (before the shuffle, one task per Kafka partition: inside the Python source's read
   tasks, or a ``mapInArrow`` after Spark's kafka source) parses and validates each message
   once, in Python, and packs the messages of each (cluster, bucket) of one Arrow batch into
   one row. A node's bucket is ``crc32(node) % node_buckets``; cluster
   events go to the bucket of node ``""``, where their cluster's version gates live. Messages
   that fail validation are turned into their dead letters here and go to cluster ``""``.
2. ``BucketProcessor`` (``transformWithState`` keyed by cluster and bucket) restores the
   bucket's nodes from one state value, runs ``apply_stage`` on each node's messages in offset
   order (exactly what ``NodeProcessor`` does per node), and emits one packed row with the
   stage-one results and the accounting counters of the batch.
3. ``PackedClusterProcessor`` (keyed by cluster) unpacks, merges the partitions in the same log
   order as the plain path (``merge_log_order``) and runs ``cluster_stage``.

Each stage is a pure function over plain Python values (``route``, ``stage_one_bucket``,
``stage_two``), so tests run them without Spark against the plain path and ``replay``. The packed
payloads live only inside one micro-batch (pickled tuples of the job's own values); state stays
JSON.
"""

from __future__ import annotations

import json
import pickle
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from safepoint.core.cluster import ClusterState
from safepoint.core.engine import APPLIED, DEADLETTERED, IGNORED, Position, StageOne, apply_stage, parse_stage
from safepoint.core.events import DEADLETTER_CODES, is_node_event
from safepoint.core.node import NodeState, NodeUpdate
from safepoint.core.outputs import DEADLETTER, Output
from safepoint.core.policy import Policy
from safepoint.core.recovery import StartPlan
from safepoint.errors import ConfigError
from safepoint.gcfreeze import freeze_once, paused
from safepoint.streaming.processors import ClusterProcessor, merge_log_order, run_cluster, stored_value

__all__ = [
    "IGNORE_REASONS",
    "METRICS",
    "Router",
    "BucketProcessor",
    "PackedClusterProcessor",
    "bucket_of",
    "route",
    "stage_one_bucket",
    "stage_two",
    "counts_of",
    "ROUTED_SCHEMA",
    "PACKED_ONE_SCHEMA",
]

IGNORE_REASONS = ("duplicate", "older_seq", "stale_incarnation", "stale_version")
METRICS: tuple[str, ...] = (
    "consumed",
    "applied",
    "ignored",
    "deadlettered",
    *(f"ignored_{r}" for r in IGNORE_REASONS),
    *(f"deadlettered_{c}" for c in DEADLETTER_CODES),
)
"""The per-batch accounting counters (the query's observedMetrics["accounting"]), both paths."""

STATE_VERSION = 1
PICKLE_PROTOCOL = 5

# A routed item: (node, offset, partition, event dict | dead-letter tuple)
# A stage-one item: (partition, offset, wall_ms, label, tag, data); tag u|e|d|i as in processors.py


def bucket_of(node: str, buckets: int) -> int:
    """A node's bucket: stable across processes and restarts (unlike ``hash``)."""
    return zlib.crc32(node.encode("utf-8")) % buckets


def route(
    rows: Iterable[tuple[int, int, bytes | None, bytes | None]], topic: str, policy: Policy, buckets: int
) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
    """Parse (partition, offset, key, value) messages and group them by (cluster, bucket)."""
    groups: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for partition, offset, key, value in rows:
        event = parse_stage(value, Position(topic, partition, offset, key), policy)
        if isinstance(event, StageOne):
            assert event.output is not None
            item: tuple[Any, ...] = ("", offset, partition, ("d", event.output.key, event.output.value, event.reason,
                                                              event.code))
            gkey = ("", 0)
        else:
            node = event["node"] if is_node_event(event) else ""
            item = (node, offset, partition, event)
            gkey = (event["cluster"], bucket_of(node, buckets))
        group = groups.get(gkey)
        if group is None:
            groups[gkey] = [item]
        else:
            group.append(item)
    return groups


def _encode(partition: int, offset: int, item: StageOne) -> tuple[Any, ...]:
    label = item.label
    if item.update is not None:
        return partition, offset, item.update.wall_ms, label, "u", item.update.to_json()
    if item.event is not None:
        return partition, offset, item.event["wall_ms"], label, "e", item.event
    return partition, offset, -1, label, "i", item.reason


def _decode(cluster: str, tag: str, data: Any) -> StageOne:
    if tag == "u":
        return StageOne(cluster=cluster, outcome=APPLIED, update=NodeUpdate.from_json(data))
    if tag == "e":
        return StageOne(cluster=cluster, outcome=APPLIED, event=data)
    if tag == "d":
        return StageOne(cluster=cluster, outcome=DEADLETTERED, reason=data[2], output=Output(DEADLETTER, data[0], data[1]),
                        code=data[3])
    return StageOne(cluster=cluster, outcome=IGNORED, reason=data)


def counts_of(labels: Iterable[str]) -> dict[str, int]:
    """The accounting counters of some final labels (applied, ignored:<why>, deadlettered:<class>)."""
    c: Counter[str] = Counter()
    for label in labels:
        c["consumed"] += 1
        if label == APPLIED:
            c["applied"] += 1
            continue
        outcome, _, why = label.partition(":")
        c[outcome] += 1
        c[f"{outcome}_{why}"] += 1
    return {m: c.get(m, 0) for m in METRICS}


def stage_one_bucket(
    stored: str | None, items: list[tuple[Any, ...]], policy: Policy, buckets: int
) -> tuple[str | None, list[tuple[Any, ...]], dict[str, int]]:
    """One bucket's batch: (new state or None to leave it, stage-one items, accounting counters)."""
    nodes: dict[tuple[str, str], NodeState] = {}
    gates: dict[str, dict[str, int]] = {}
    if stored is not None:
        data = json.loads(stored)
        if data.get("b") != buckets:
            msg = (f"node_buckets is {buckets} but this checkpoint's state was written with {data.get('b')}: "
                   "keep the old value or start from a new checkpoint")
            raise ConfigError(msg)
        for raw in data["nodes"]:
            ns = NodeState.from_json(raw)
            nodes[(ns.cluster, ns.node)] = ns
        gates = data["gates"]
    items.sort(key=lambda it: (it[0], it[1], it[2]))  # each node's messages in offset order
    out: list[tuple[Any, ...]] = []
    labels: list[str] = []
    for _node, offset, partition, payload in items:
        if isinstance(payload, tuple):  # a dead letter, decided by the router
            _tag, key, value, reason, code = payload
            label = f"{DEADLETTERED}:{code}"
            out.append((partition, offset, -1, label, "d", (key, value, reason, code)))
        else:
            stage = apply_stage(nodes, payload, policy, gates)
            enc = _encode(partition, offset, stage)
            label = enc[3]
            out.append(enc)
        labels.append(label)
    new_state = None
    if nodes or gates:
        new_state = json.dumps({"v": STATE_VERSION, "b": buckets, "nodes": [ns.to_json() for ns in nodes.values()],
                                "gates": gates}, separators=(",", ":"))
    return new_state, out, counts_of(labels)


def stage_two(
    cluster: str, stored: str | None, items: list[tuple[Any, ...]], policy: Policy, accounting: bool,
    start: StartPlan | None = None,
) -> tuple[str | None, list[tuple[str | None, str, dict[str, Any]]]]:
    """One cluster's batch of stage-one items: (new state or None to leave it, outputs)."""
    state = ClusterState.from_json(json.loads(stored)) if stored is not None else None
    ordered = merge_log_order(items, itemgetter(0, 1), itemgetter(0), itemgetter(2))
    entries = ((p, o, label, _decode(cluster, tag, data)) for p, o, _w, label, tag, data in ordered)
    state, touched, outputs = run_cluster(cluster, state, entries, policy, accounting, start)
    new_state = json.dumps(state.to_json(), separators=(",", ":")) if state is not None and touched else None
    return new_state, outputs


# -- Spark adapters ---------------------------------------------------------------------------


ROUTED_SCHEMA = StructType([
    StructField("cluster", StringType(), True),
    StructField("bucket", IntegerType(), True),
    StructField("blob", BinaryType(), True),
])
PACKED_ONE_SCHEMA = StructType(
    [StructField("cluster", StringType(), False), StructField("blob", BinaryType(), False)]
    + [StructField(m, LongType(), False) for m in METRICS]
)
_STATE_SCHEMA = StructType([StructField("json", StringType(), False)])


class Router:
    """Raw Kafka rows (Arrow batches) in, one packed row per (cluster, bucket) and batch out: the
    Python source runs it in its read tasks, and after Spark's kafka source it is a mapInArrow."""

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


def unpack(rows: Iterator[Row]) -> list[tuple[Any, ...]]:
    """The items of one group's packed rows."""
    items: list[tuple[Any, ...]] = []
    for row in rows:
        items.extend(pickle.loads(row["blob"]))  # noqa: S301 - packed by this query's previous operator
    return items


class BucketProcessor(StatefulProcessor):
    """Stage one of the fast path: the nodes of one (cluster, bucket)."""

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


class PackedClusterProcessor(ClusterProcessor):
    """Stage two of the fast path: one cluster's round over the packed stage-one results."""

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        with paused():
            new_state, outputs = stage_two(key[0], stored_value(self.state), unpack(rows), self.policy,
                                           bool(self.accounting_topic), self.start)
        yield from self.emit(outputs)
        if new_state is not None:
            self.state.update((new_state,))
