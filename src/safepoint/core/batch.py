"""One micro-batch through the two stages, as the job runs it: pure Python, no Spark.

The job packs its work instead of moving every message through Spark as its own row:

1. ``route`` (before the shuffle, one task per Kafka partition) parses and validates each
   message once and groups the messages of one batch by (cluster, bucket). A node's bucket is
   ``crc32(node) % buckets``; cluster events go to the bucket of node ``""``, where their
   cluster's version gates live. Messages that fail validation become their dead letters here
   and go to cluster ``""``.
2. ``stage_one_bucket`` (keyed by cluster and bucket) restores the bucket's nodes from one state
   value and applies each node's messages in offset order (``engine.apply_stage``), giving one
   ``Staged`` item per message and the batch's accounting counters.
3. ``stage_two`` (keyed by cluster) merges one cluster's staged items in log order
   (``merge_log_order``) and runs the cluster stage over them (``run_cluster``).

``streaming/processors.py`` only moves these values in and out of Spark rows; ``replay`` (the
per-message ``Engine``) is the reference the job is tested against.
"""

from __future__ import annotations

import heapq
import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

from safepoint.core.cluster import ClusterState
from safepoint.core.engine import APPLIED, DEADLETTERED, IGNORED, Position, StageOne, apply_stage, cluster_stage, parse_stage
from safepoint.core.events import DEADLETTER_CODES, is_node_event
from safepoint.core.node import NodeState, NodeUpdate
from safepoint.core.outputs import DEADLETTER, Output
from safepoint.core.policy import Policy
from safepoint.core.recovery import StartPlan
from safepoint.core.status import STATUS, cluster_status, node_status, status_key
from safepoint.errors import ConfigError

__all__ = [
    "IGNORE_REASONS",
    "METRICS",
    "BUCKET_STATE_VERSION",
    "Routed",
    "Staged",
    "bucket_of",
    "route",
    "stage_one_bucket",
    "stage_two",
    "run_cluster",
    "merge_log_order",
    "BY_NAME",
    "counts_of",
    "encode_staged",
    "decode_staged",
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
"""The per-batch accounting counters (the query's observedMetrics["accounting"])."""

BUCKET_STATE_VERSION = 2
"""The layout of a bucket's state value: {"v", "b": buckets, "nodes": [NodeState json], "gates"}.
Version 2 names the fields of each node's state (``NodeState.to_json``); version 1's short keys are
migrated when read. A newer version than this one is refused."""


class DeadLetterPayload(NamedTuple):
    """A message the router turned into its dead letter."""

    key: str
    value: dict[str, Any]
    reason: str
    code: str


class Routed(NamedTuple):
    """One routed message: its node ("" for cluster events), position, and the validated event or
    its dead letter."""

    node: str
    offset: int
    partition: int
    payload: dict[str, Any] | DeadLetterPayload


class Staged(NamedTuple):
    """One message after stage one, on its way to its cluster's round.

    ``tag`` says what ``data`` holds: ``u`` a node update (its JSON list), ``e`` a cluster event,
    ``d`` a dead letter (``DeadLetterPayload``), ``i`` the reason it was ignored, ``s`` a node's
    part of the status (``core/status.py``; position -1, after the node's events, not a message). ``wall_ms`` is
    what partitions are merged by (-1 for ignored messages and dead letters)."""

    partition: int
    offset: int
    wall_ms: int
    label: str
    tag: str
    data: Any


def bucket_of(node: str, buckets: int) -> int:
    """A node's bucket: stable across processes and restarts (unlike ``hash``)."""
    return zlib.crc32(node.encode("utf-8")) % buckets


def route(
    rows: Iterable[tuple[int, int, bytes | None, bytes | None]], topic: str, policy: Policy, buckets: int
) -> dict[tuple[str, int], list[Routed]]:
    """Parse (partition, offset, key, value) messages and group them by (cluster, bucket)."""
    groups: dict[tuple[str, int], list[Routed]] = {}
    for partition, offset, key, value in rows:
        event = parse_stage(value, Position(topic, partition, offset, key), policy)
        if isinstance(event, StageOne):
            assert event.output is not None and event.reason is not None and event.code is not None
            item = Routed("", offset, partition, DeadLetterPayload(event.output.key, event.output.value, event.reason,
                                                                   event.code))
            gkey = ("", 0)
        else:
            node = event["node"] if is_node_event(event) else ""
            item = Routed(node, offset, partition, event)
            gkey = (event["cluster"], bucket_of(node, buckets))
        group = groups.get(gkey)
        if group is None:
            groups[gkey] = [item]
        else:
            group.append(item)
    return groups


# -- the one codec of stage-one results ---------------------------------------------------


def encode_staged(partition: int, offset: int, item: StageOne) -> Staged:
    """A stage-one result as the value that travels to the cluster stage."""
    label = item.label
    if item.update is not None:
        return Staged(partition, offset, item.update.wall_ms, label, "u", item.update.to_json())
    if item.event is not None:
        return Staged(partition, offset, item.event["wall_ms"], label, "e", item.event)
    if item.output is not None:
        assert item.reason is not None and item.code is not None
        return Staged(partition, offset, -1, label, "d", DeadLetterPayload(item.output.key, item.output.value, item.reason,
                                                                           item.code))
    return Staged(partition, offset, -1, label, "i", item.reason)


def decode_staged(cluster: str, tag: str, data: Any) -> StageOne:
    """The stage-one result a ``Staged`` item carries."""
    if tag == "u":
        return StageOne(cluster=cluster, outcome=APPLIED, update=NodeUpdate.from_json(data))
    if tag == "e":
        return StageOne(cluster=cluster, outcome=APPLIED, event=data)
    if tag == "d":
        dl = DeadLetterPayload(*data)
        return StageOne(cluster=cluster, outcome=DEADLETTERED, reason=dl.reason, output=Output(DEADLETTER, dl.key, dl.value),
                        code=dl.code)
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


# -- stage one: the nodes of one (cluster, bucket) -------------------------------------------


def stage_one_bucket(
    stored: str | None, items: list[Routed], policy: Policy, buckets: int
) -> tuple[str | None, list[Staged], dict[str, int]]:
    """One bucket's batch: (new state or None to leave it, staged items, accounting counters)."""
    nodes: dict[tuple[str, str], NodeState] = {}
    gates: dict[str, dict[str, int]] = {}
    if stored is not None:
        data = json.loads(stored)
        if data.get("v", 1) > BUCKET_STATE_VERSION:
            msg = (f"this checkpoint's state was written by a newer safepoint (state version {data['v']}, this one "
                   f"reads up to {BUCKET_STATE_VERSION}): run that version, or start from a new checkpoint")
            raise ConfigError(msg)
        if data.get("b") != buckets:
            msg = (f"node_buckets is {buckets} but this checkpoint's state was written with {data.get('b')}: "
                   "keep the old value or start from a new checkpoint")
            raise ConfigError(msg)
        for raw in data["nodes"]:
            ns = NodeState.from_json(raw)
            nodes[(ns.cluster, ns.node)] = ns
        gates = data["gates"]
    items.sort(key=lambda it: (it[0], it[1], it[2]))  # each node's messages in offset order
    out: list[Staged] = []
    labels: list[str] = []
    for _node, offset, partition, payload in items:
        if isinstance(payload, tuple):  # a dead letter, decided by the router
            dl = DeadLetterPayload(*payload)
            staged = Staged(partition, offset, -1, f"{DEADLETTERED}:{dl.code}", "d", dl)
        else:
            staged = encode_staged(partition, offset, apply_stage(nodes, payload, policy, gates))
        out.append(staged)
        labels.append(staged.label)
    if policy.status_holds:  # each node this batch touched: its part of the status
        touched = {(p["cluster"], node) for node, _, _, p in items if node and not isinstance(p, tuple)}
        for key in sorted(touched):
            seen = nodes.get(key)
            if seen is not None:
                out.append(Staged(-1, -1, -1, "", "s", node_status(seen, policy)))
    new_state = None
    if nodes or gates:
        new_state = json.dumps({"v": BUCKET_STATE_VERSION, "b": buckets, "nodes": [ns.to_json() for ns in nodes.values()],
                                "gates": gates}, separators=(",", ":"))
    return new_state, out, counts_of(labels)


# -- stage two: one cluster's round over the batch ---------------------------------------------


BY_NAME = (itemgetter("partition", "offset"), itemgetter("partition"), itemgetter("wall_ms"))
"""``merge_log_order``'s getters for rows with named fields: ``merge_log_order(rows, *BY_NAME)``."""


def merge_log_order(
    rows: list[Any],
    position: Callable[[Any], Any] = itemgetter(0, 1),
    partition: Callable[[Any], Any] = itemgetter(0),
    wall: Callable[[Any], Any] = itemgetter(2),
) -> Iterator[Any]:
    """One batch's rows of a cluster in log order (``Staged`` items by default; other rows through
    the getters, e.g. ``*BY_NAME`` for dicts).

    Each Kafka partition's rows keep their offset order; partitions are interleaved by the
    events' ``wall_ms`` (ties: lower partition first), which is deterministic for a batch and
    is the file order for a single-partition log.
    """
    rows = sorted(rows, key=position)
    runs = [list(g) for _, g in groupby(rows, key=partition)]
    if len(runs) == 1:
        return iter(runs[0])
    return heapq.merge(*runs, key=wall)


Emitted = tuple[str | None, str, dict[str, Any]]
"""An output as (channel, key, value); channel None is an accounting row."""


def run_cluster(
    cluster: str,
    state: ClusterState | None,
    entries: Iterable[tuple[int, int, str, StageOne]],
    policy: Policy,
    accounting: bool,
    start: StartPlan | None = None,
) -> tuple[ClusterState | None, bool, list[Emitted]]:
    """The cluster stage over (partition, offset, label, stage-one result) in log order.

    Returns the state, whether it was touched, and the outputs.
    """
    touched = False
    outputs: list[Emitted] = []
    for partition, offset, label, item in entries:
        if accounting:
            outputs.append((None, f"{partition}:{offset}", {"partition": partition, "offset": offset, "outcome": label}))
        if item.output is not None:
            emitted = [item.output]  # a dead letter touches no state
        else:
            if state is None:
                state = ClusterState.starting(cluster, start)
            emitted = cluster_stage(state, item, policy, partition, offset).outputs
            touched = True
        outputs += [(o.channel, o.key, o.value) for o in emitted]
    return state, touched, outputs


def stage_two(
    cluster: str, stored: str | None, items: list[Staged], policy: Policy, accounting: bool,
    start: StartPlan | None = None,
) -> tuple[str | None, list[Emitted]]:
    """One cluster's batch of staged items: (new state or None to leave it, outputs)."""
    state = ClusterState.from_json(json.loads(stored)) if stored is not None else None
    parts = [s.data for s in items if s.tag == "s"]
    if parts:
        items = [s for s in items if s.tag != "s"]
    entries = ((s.partition, s.offset, s.label, decode_staged(cluster, s.tag, s.data)) for s in merge_log_order(items))
    state, touched, outputs = run_cluster(cluster, state, entries, policy, accounting, start)
    if policy.status_holds:
        outputs.extend((STATUS, status_key(cluster, p["node"]), p) for p in parts)
        if state is not None and touched:
            outputs.append((STATUS, status_key(cluster), cluster_status(state, policy)))
    new_state = json.dumps(state.to_json(), separators=(",", ":")) if state is not None and touched else None
    return new_state, outputs
