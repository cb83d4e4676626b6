"""The job's two stateful processors: thin adapters around the core's two stages.

``NodeProcessor`` (grouped by cluster and node) runs ``node_stage`` on a node's messages in
offset order and forwards one compact row per message. ``ClusterProcessor`` (grouped by
cluster) merges those rows in log order and runs ``cluster_stage``. Neither reimplements a
rule: they only sort, (de)serialize state and translate rows.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from safepoint.core.cluster import ClusterState
from safepoint.core.codec import encode
from safepoint.core.engine import Position, StageOne, cluster_stage, node_stage
from safepoint.core.node import NodeState, NodeUpdate
from safepoint.core.outputs import ALERTS, DEADLETTER, DIRECTIVES, Output
from safepoint.core.policy import Policy
from safepoint.core.recovery import StartPlan
from safepoint.gcfreeze import freeze_once

__all__ = ["NodeProcessor", "ClusterProcessor", "STAGE_ONE_SCHEMA", "OUTPUT_SCHEMA", "run_cluster", "stored_value"]

STAGE_ONE_SCHEMA = StructType(
    [
        StructField("cluster", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("wall_ms", LongType(), False),
        StructField("outcome", StringType(), False),
        StructField("payload", StringType(), False),
    ]
)
OUTPUT_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("key", StringType(), True),
        StructField("value", StringType(), False),
    ]
)
_STATE_SCHEMA = StructType([StructField("json", StringType(), False)])


def encode_stage_one(item: StageOne) -> tuple[int, str]:
    """(wall_ms, payload) of one stage-one result."""
    if item.output is not None:
        return -1, json.dumps(["d", item.output.key, item.output.value, item.reason])
    if item.update is not None:
        return item.update.wall_ms, json.dumps(["u", item.update.to_json()])
    if item.event is not None:
        return item.event["wall_ms"], json.dumps(["e", item.event])
    return -1, json.dumps(["i", item.reason])


def decode_stage_one(cluster: str, payload: str) -> StageOne:
    data = json.loads(payload)
    tag = data[0]
    if tag == "u":
        return StageOne(cluster=cluster, outcome="applied", update=NodeUpdate.from_json(data[1]))
    if tag == "e":
        return StageOne(cluster=cluster, outcome="applied", event=data[1])
    if tag == "d":
        return StageOne(cluster=cluster, outcome="deadlettered", reason=data[3], output=Output(DEADLETTER, data[1], data[2]))
    return StageOne(cluster=cluster, outcome="ignored", reason=data[1])


def run_cluster(
    cluster: str,
    state: ClusterState | None,
    entries: Iterable[tuple[int, int, str, StageOne]],
    policy: Policy,
    accounting: bool,
    start: StartPlan | None = None,
) -> tuple[ClusterState | None, bool, list[tuple[str | None, str, dict[str, Any]]]]:
    """The cluster stage over (partition, offset, label, stage-one result) in log order.

    Returns the state, whether it was touched, and the outputs as (channel, key, value); channel
    None is an accounting row. Both paths' cluster processors call this.
    """
    touched = False
    outputs: list[tuple[str | None, str, dict[str, Any]]] = []
    out: list[Output] = []
    for partition, offset, label, item in entries:
        if accounting:
            outputs.append((None, f"{partition}:{offset}", {"partition": partition, "offset": offset, "outcome": label}))
        if item.output is not None:
            out.append(item.output)  # a dead letter touches no state
        else:
            if state is None:
                state = start.new_cluster(cluster) if start is not None else ClusterState(cluster)
            cluster_stage(state, item, policy, out)
            touched = True
        for o in out:
            outputs.append((o.channel, o.key, o.value))
        out.clear()
    return state, touched, outputs


def stored_value(state: Any) -> str | None:
    """The JSON string a processor's value state holds, or None."""
    if not state.exists():
        return None
    value = state.get()
    assert value is not None
    return str(value[0])


def merge_log_order(
    rows: list[Any],
    position: Callable[[Any], Any] = itemgetter("partition", "offset"),
    partition: Callable[[Any], Any] = itemgetter("partition"),
    wall: Callable[[Any], Any] = itemgetter("wall_ms"),
) -> Iterator[Any]:
    """One batch's rows of a cluster in log order (both paths: rows by field name, the fast
    path's stage-one tuples by index through the getters).

    Each Kafka partition's rows keep their offset order; partitions are interleaved by the
    events' ``wall_ms`` (ties: lower partition first), which is deterministic for a batch and
    is the file order for a single-partition log.
    """
    rows = sorted(rows, key=position)
    runs = [list(g) for _, g in groupby(rows, key=partition)]
    if len(runs) == 1:
        return iter(runs[0])
    return heapq.merge(*runs, key=wall)


class NodeProcessor(StatefulProcessor):
    """Stage one: a node's holds and identity (grouping key: cluster, node)."""

    def __init__(self, policy: dict[str, Any], topic: str) -> None:
        self.policy_dict = policy
        self.topic = topic

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_once()
        self.policy = Policy.from_dict(self.policy_dict)
        self.state = handle.getValueState("nodes", _STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:  # noqa: N802, N803
        group_cluster = key[0]
        nodes: dict[tuple[str, str], NodeState] = {}
        gates: dict[str, dict[str, int]] = {}
        stored = stored_value(self.state)
        if stored is not None:
            data = json.loads(stored)
            for item in data["nodes"]:
                ns = NodeState.from_json(item)
                nodes[(ns.cluster, ns.node)] = ns
            gates = data["gates"]
        before = (len(nodes), json.dumps(gates, sort_keys=True))
        ordered = sorted(rows, key=lambda r: (r["offset"], r["partition"]))
        for row in ordered:
            pos = Position(self.topic, row["partition"], row["offset"], row["key"])
            item = node_stage(nodes, row["value"], pos, self.policy, gates)
            wall, payload = encode_stage_one(item)
            yield Row(
                cluster=item.cluster or group_cluster,
                partition=row["partition"],
                offset=row["offset"],
                wall_ms=wall,
                outcome=item.label,
                payload=payload,
            )
        if nodes or before != (0, "{}") or gates:
            self.state.update((json.dumps({"nodes": [ns.to_json() for ns in nodes.values()], "gates": gates}),))

    def close(self) -> None:
        pass


class ClusterProcessor(StatefulProcessor):
    """Stage two: the cluster's round, safe point, directives and alerts (grouping key: cluster)."""

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
        }

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: Any) -> Iterator[Row]:  # noqa: N802, N803
        cluster = key[0]
        stored = stored_value(self.state)
        state = ClusterState.from_json(json.loads(stored)) if stored is not None else None
        entries = (
            (row["partition"], row["offset"], row["outcome"], decode_stage_one(cluster, row["payload"]))
            for row in merge_log_order(list(rows))
        )
        state, touched, outputs = run_cluster(cluster, state, entries, self.policy, bool(self.accounting_topic), self.start)
        yield from self.emit(outputs)
        if state is not None and touched:
            self.state.update((json.dumps(state.to_json()),))

    def emit(self, outputs: list[tuple[str | None, str, dict[str, Any]]]) -> Iterator[Row]:
        """The sink's rows: channel None is an accounting row."""
        for channel, okey, ovalue in outputs:
            topic = self.accounting_topic if channel is None else self.channel_topic[channel]
            yield Row(topic=topic, key=okey, value=encode(ovalue))

    def close(self) -> None:
        pass
