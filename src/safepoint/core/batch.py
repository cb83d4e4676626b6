"""One micro-batch as the job runs it: pure Python, no Spark.

1. ``route`` (before the shuffle, one task per Kafka partition) parses and validates each message
   once and groups the batch's messages by cluster, each as a ``Routed`` record: where it came
   from, its log time (``core/clock.py``: the record's broker time, set on the event as ``log_ms``)
   and the validated event, or its dead letter (those go to cluster ``""``).
2. ``run_batch`` (the one stateful operator, keyed by cluster) puts one cluster's messages in log
   order (``merge_log_order``) and runs ``engine.step`` on each, as ``replay`` does: the cluster's
   state from one stored value, each node's from its bucket's value (``BucketNodes``: a bucket is
   read when the batch first touches one of its nodes, and written back only if it was touched;
   within it, a node is decoded only when the batch looks it up).

``streaming/processors.py`` only moves these values in and out of Spark rows; ``replay`` (the
``Engine``) is the reference the job is tested against, and runs the same ``step``.
"""

from __future__ import annotations

import heapq
import json
import pickle
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

import msgspec

from safepoint.core.cluster import ClusterState
from safepoint.core.engine import APPLIED, DEADLETTERED, Outcome, Tally, step
from safepoint.core.events import DEADLETTER_CODES, Rejected, parse
from safepoint.core.gaps import GAP_PARTITION, Gap
from safepoint.core.node import NodeState
from safepoint.core.origin import EVENTS, MISROUTED, is_control, kafka_partition, misrouted, routed_partition
from safepoint.core.outputs import DEADLETTER, Output, dead_letter
from safepoint.core.policy import Policy
from safepoint.core.recovery import StartPlan
from safepoint.core.status import STATUS, cluster_status, node_status, status_key
from safepoint.errors import ConfigError

__all__ = [
    "IGNORE_REASONS",
    "METRICS",
    "BUCKET_STATE_VERSION",
    "BatchResult",
    "BucketNodes",
    "DeadLetterPayload",
    "Emitted",
    "Routed",
    "bucket_of",
    "route",
    "BatchRun",
    "run_batch",
    "merge_log_order",
    "pack_routed",
    "unpack_routed",
    "BY_NAME",
    "counts_of",
    "encode_bucket",
    "bucket_entries",
    "encode_cluster",
    "decode_cluster",
]

IGNORE_REASONS = ("duplicate", "older_seq", "stale_incarnation", "stale_version")
METRICS: tuple[str, ...] = (
    "consumed",
    "applied",
    "ignored",
    "deadlettered",
    *(f"ignored_{r}" for r in IGNORE_REASONS),
    *(f"deadlettered_{c}" for c in (*DEADLETTER_CODES, MISROUTED)),
)
"""The per-batch accounting counters (the query's observedMetrics["accounting"])."""

BUCKET_STATE_VERSION = 4
"""The layout of a bucket's stored value (see "the stored forms" below); 3: JSON text, still read. A
newer version than this one is refused."""


class DeadLetterPayload(NamedTuple):
    """A message the router turned into its dead letter."""

    key: str
    value: dict[str, Any]
    reason: str
    code: str


class Routed(NamedTuple):
    """One message of a micro-batch, from the router to its cluster's operator: where it came from,
    its log time (what partitions are merged by in log order; -1 for a dead letter) and the validated
    event, or its dead letter."""

    partition: int
    offset: int
    log_ms: int
    payload: dict[str, Any] | DeadLetterPayload


# msgspec decodes a Routed record by its fields' annotations; the compiled core (core/compiled.py)
# keeps a union's annotation only as ``type``, so the payload's is set here again as written above
Routed.__annotations__["payload"] = dict[str, Any] | DeadLetterPayload


def bucket_of(node: str, buckets: int) -> int:
    """A node's bucket: stable across processes and restarts (unlike ``hash``)."""
    return zlib.crc32(node.encode("utf-8")) % buckets


def route(rows: Iterable[tuple[int, int, bytes | None, bytes | None, int | None]], topic: str, policy: Policy,
          gaps: Iterable[Gap] = (), origin: str = EVENTS) -> dict[str, list[Routed]]:
    """Parse (partition, offset, key, value, broker time) messages of ``topic`` (its ``origin``:
    ``core/origin.py``) and group them by cluster (dead letters: ""), each at its routed partition,
    a misrouted event marked. Each event's ``log_ms`` is set to its record's broker time (None: the
    topic keeps the producers' times, and the event's own ``wall_ms`` stands in): whatever the message itself says.
    Each cluster's group starts with a record of every gap of the topic the source has found so far
    (``gaps``; ``core/gaps.py``): its operator takes the ones it has not seen before its messages."""
    groups: dict[str, list[Routed]] = {}
    heads = [Routed(GAP_PARTITION, g.id, -1, g.to_json()) for g in gaps]
    limit = policy.max_message_bytes
    for partition, offset, key, value, broker_ms in rows:
        event = parse(value, limit)
        routed = routed_partition(origin, partition)
        if isinstance(event, Rejected):
            out = dead_letter(event.error, value, key, topic, partition, offset)
            item = Routed(routed, offset, -1, DeadLetterPayload(out.key, out.value, event.error, event.code))
            cluster = ""
        else:
            log = event["log_ms"] = event["wall_ms"] if broker_ms is None else broker_ms
            misrouted(event, origin, value, key, topic, partition, offset)
            item = Routed(routed, offset, log, event)
            cluster = event["cluster"]
        group = groups.get(cluster)
        if group is None:
            groups[cluster] = [*heads, item] if heads and cluster else [item]
        else:
            group.append(item)
    return groups


_PACK = msgspec.msgpack.Encoder()
"""MessagePack for the router's hand-off and the stored forms (below)."""
_UNPACK = msgspec.msgpack.Decoder()
_UNPACK_ROUTED = msgspec.msgpack.Decoder(list[Routed])
_PICKLED = b"\x80"
"""The first byte of a pickle (protocol 2 and later); a MessagePack array never starts with it."""


def pack_routed(items: list[Routed]) -> bytes:
    """One cluster's ``Routed`` records as the router hands them to the operator, within one
    micro-batch: MessagePack (about 15 times faster to write than a pickle and 2.5 times faster to
    read back as ``Routed`` records), or a pickle where MessagePack cannot carry a value as it is
    (a number with a fraction, kept as its own type by the parser, an integer beyond 64 bits, text
    with a lone surrogate)."""
    try:
        return _PACK.encode(items)
    except (TypeError, OverflowError, UnicodeEncodeError):
        return pickle.dumps(items, 5)


def unpack_routed(blob: bytes) -> list[Routed]:
    """The records of ``pack_routed``'s value."""
    if blob[:1] == _PICKLED:
        records: list[Routed] = pickle.loads(blob)  # noqa: S301 - packed by this query's router
        return records
    return _UNPACK_ROUTED.decode(blob)


BY_NAME = (itemgetter("partition", "offset"), itemgetter("partition"), itemgetter("log_ms"))
"""``merge_log_order``'s getters for rows with named fields: ``merge_log_order(rows, *BY_NAME)``."""


def merge_log_order(
    rows: list[Any],
    position: Callable[[Any], Any] = itemgetter(0, 1),
    partition: Callable[[Any], Any] = itemgetter(0),
    wall: Callable[[Any], Any] = itemgetter(2),
) -> Iterator[Any]:
    """One batch's rows of a cluster in log order (``Routed`` records by default; other rows through
    the getters, e.g. ``*BY_NAME`` for dicts).

    Each Kafka partition's rows keep their offset order; partitions are interleaved by the
    messages' log time (ties: lower partition first), which is deterministic for a batch and
    is the file order for a single-partition log.
    """
    rows = sorted(rows, key=position)
    runs = [list(g) for _, g in groupby(rows, key=partition)]
    if len(runs) == 1:
        return iter(runs[0])
    return heapq.merge(*runs, key=wall)


def counts_of(tally: Tally) -> dict[str, int]:
    """The accounting counters of the messages' outcomes: ``consumed``, each result, and each result
    with its why (``ignored_duplicate``)."""
    c: Counter[str] = Counter()
    for result, why, n in tally.by_result():
        c["consumed"] += n
        c[result.value] += n
        if result is not APPLIED:
            c[f"{result.value}_{why}"] += n
    return {m: c.get(m, 0) for m in METRICS}


class BucketNodes:
    """One cluster's node states, read bucket by bucket from stored values as a batch touches them
    (``engine.NodeSource``). ``load(bucket)`` gives a bucket's stored value or None. A bucket's nodes
    stay in their stored form until the batch looks one up, and the ones it did not are written back
    as they were read."""

    def __init__(self, cluster: str, buckets: int, load: Callable[[int], bytes | None]) -> None:
        self.cluster = cluster
        self.buckets = buckets
        self.load = load
        self.loaded: dict[int, dict[str, NodeState | list[Any]]] = {}
        """Each bucket read so far: its nodes by name, as a state once looked up, else as stored."""
        self.touched: dict[str, NodeState] = {}
        """The nodes this batch looked up, by name (their status goes out after the batch)."""

    def node(self, cluster: str, name: str) -> NodeState:
        state = self.touched.get(name)
        if state is not None:
            return state
        nodes = self._bucket(name)
        entry = nodes.get(name)
        if entry is None:
            state = NodeState(cluster, name)
        elif isinstance(entry, list):
            state = NodeState.from_stored(cluster, entry)
        else:
            state = entry
        nodes[name] = self.touched[name] = state
        return state

    def peek(self, cluster: str, name: str) -> NodeState | None:
        """The node's state if it has one; a node the batch has not looked up stays untouched."""
        state = self.touched.get(name)
        if state is not None:
            return state
        entry = self._bucket(name).get(name)
        return NodeState.from_stored(cluster, entry) if isinstance(entry, list) else entry

    def _bucket(self, name: str) -> dict[str, NodeState | list[Any]]:
        """The nodes of ``name``'s bucket, read from the store the first time."""
        bucket = bucket_of(name, self.buckets)
        nodes = self.loaded.get(bucket)
        if nodes is None:
            stored = self.load(bucket)
            nodes = self.loaded[bucket] = {} if stored is None else bucket_entries(stored, self.buckets)
        return nodes

    def dump(self) -> dict[int, bytes]:
        """The stored value of every bucket the batch touched."""
        touched = {bucket_of(name, self.buckets) for name in self.touched}
        return {b: encode_bucket(self.loaded[b].values(), self.buckets) for b in sorted(touched)}


# -- the stored forms -----------------------------------------------------------------------
#
# Binary (MessagePack): a bucket is [version, node_buckets, [each node's compact stored form
# (NodeState.to_stored: its fields by position)]]; a cluster is ClusterState.to_json's value.
# Values of state version 3 (JSON text, the first layout of one operator) are still read.


def encode_bucket(nodes: Iterable[NodeState | list[Any]], buckets: int) -> bytes:
    """A bucket's stored value: the states of its nodes, each in its compact form (a node given in
    that form already is written as it is)."""
    return _PACK.encode([BUCKET_STATE_VERSION, buckets, [ns if isinstance(ns, list) else ns.to_stored() for ns in nodes]])


def bucket_entries(stored: bytes, buckets: int) -> dict[str, NodeState | list[Any]]:
    """A bucket's nodes by name, each in its compact stored form (``NodeState.from_stored`` makes
    the state), or as a state where the value has the older layout (refused: another
    ``node_buckets``, a newer version)."""
    if stored[:1] == b"{":  # state version 3: JSON, each node by name
        data = json.loads(stored)
        version, written_with, nodes = data.get("v", 1), data.get("b"), data["nodes"]
    else:
        version, written_with, nodes = _UNPACK.decode(stored)
    if version > BUCKET_STATE_VERSION:
        msg = (f"this checkpoint's state was written by a newer safepoint (state version {version}, this one "
               f"reads up to {BUCKET_STATE_VERSION}): run that version, or start from a new checkpoint")
        raise ConfigError(msg)
    if written_with != buckets:
        msg = (f"node_buckets is {buckets} but this checkpoint's state was written with {written_with}: "
               "keep the old value or start from a new checkpoint")
        raise ConfigError(msg)
    if version < 4:
        return {raw["node"]: NodeState.from_json(raw) for raw in nodes}
    return {raw[0]: raw for raw in nodes}  # STORED_FIELDS begins with the node's name


def encode_cluster(state: ClusterState) -> bytes:
    """A cluster's stored value."""
    return _PACK.encode(state.to_json())


def decode_cluster(stored: bytes) -> ClusterState:
    return ClusterState.from_json(json.loads(stored) if stored[:1] == b"{" else _UNPACK.decode(stored))


Emitted = tuple[str | None, str, dict[str, Any]]
"""An output as (channel, key, value); channel None is an accounting row."""


class BatchResult(NamedTuple):
    """One cluster's micro-batch: what it emits (``run_batch``; none from ``BatchRun``, which yields
    them), the labels' counters, and what to store (None: leave the cluster's value as it is;
    buckets: only those the batch touched)."""

    outputs: list[Emitted]
    counts: dict[str, int]
    cluster: bytes | None
    buckets: dict[int, bytes]


def accounting_row(partition: int, offset: int, label: str) -> Emitted:
    """A message's accounting record: its Kafka partition and offset (a control topic's with
    ``"control": true``, keyed ``control:<partition>:<offset>``) and its final label."""
    if is_control(partition):
        p = kafka_partition(partition)
        return None, f"control:{p}:{offset}", {"control": True, "partition": p, "offset": offset, "outcome": label}
    return None, f"{partition}:{offset}", {"partition": partition, "offset": offset, "outcome": label}


class BatchRun:
    """One cluster's messages of one micro-batch through ``step``, in log order (cluster ``""``
    holds the batch's dead letters). ``outputs()`` yields each output the moment a rule makes it (the
    operator sends it on at once); once they are all taken, ``result`` says what to store and the
    labels' counters. The core hands nothing to Kafka itself."""

    __slots__ = ("cluster", "stored", "nodes", "items", "policy", "accounting", "start", "result")

    def __init__(self, cluster: str, stored: bytes | None, nodes: BucketNodes, items: list[Routed], policy: Policy,
                 accounting: bool, start: StartPlan | None = None) -> None:
        self.cluster, self.stored, self.nodes, self.items = cluster, stored, nodes, items
        self.policy, self.accounting, self.start = policy, accounting, start
        self.result: BatchResult | None = None
        """Set when ``outputs()`` has run to its end (its ``outputs`` empty: they were yielded)."""

    def outputs(self) -> Iterator[Emitted]:
        cluster, nodes, policy = self.cluster, self.nodes, self.policy
        state = decode_cluster(self.stored) if self.stored is not None else None
        tally = Tally()
        touched = False
        gaps: dict[int, Gap] = {}
        for partition, offset, _log, payload in merge_log_order(self.items):
            if partition == GAP_PARTITION:  # the source's gaps, ahead of the batch's messages (core/gaps.py)
                assert isinstance(payload, dict)
                gap = Gap.of(payload)
                gaps[gap.id] = gap
                continue
            if isinstance(payload, DeadLetterPayload):
                outcome = Outcome(DEADLETTERED, payload.code, [Output(DEADLETTER, payload.key, payload.value)])
            else:
                if state is None or gaps:
                    fresh = state is None
                    if state is None:
                        state = ClusterState.starting(cluster, self.start)
                    for o in state.meet_gaps(sorted(gaps.values()), payload["log_ms"] if fresh else None, policy):
                        yield o.channel, o.key, o.value
                    gaps = {}
                    touched = True
                outcome = step(state, nodes, payload, policy, partition, offset)
                touched = True
            label = tally.add(outcome)
            if self.accounting:
                yield accounting_row(partition, offset, label)
            for o in outcome.outputs:
                yield o.channel, o.key, o.value
        if policy.status_holds and state is not None and touched:
            for name, ns in sorted(nodes.touched.items()):
                yield STATUS, status_key(cluster, name), node_status(ns, policy)
            yield STATUS, status_key(cluster), cluster_status(state, policy)
        new_state = encode_cluster(state) if state is not None and touched else None
        self.result = BatchResult([], counts_of(tally), new_state, nodes.dump())


def run_batch(cluster: str, stored: bytes | None, nodes: BucketNodes, items: list[Routed], policy: Policy,
              accounting: bool, start: StartPlan | None = None) -> BatchResult:
    """A ``BatchRun`` taken whole: its outputs collected in the result (tests, the bench)."""
    run = BatchRun(cluster, stored, nodes, items, policy, accounting, start)
    outputs = list(run.outputs())
    assert run.result is not None
    return run.result._replace(outputs=outputs)
