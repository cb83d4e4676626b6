"""One micro-batch as the job runs it: pure Python, no Spark.

1. ``route_records`` (before the shuffle, one task per Kafka partition) groups the batch's messages
   by cluster. A message whose record names its cluster in the ``safepoint-cluster`` header
   (``CLUSTER_HEADER``: what the node clients send) goes through as it came, a ``Raw`` record, and
   is parsed once, by its cluster's operator (``admit``: a hold's opening or closing is decoded as a
   struct, ``Typed``, and parsed into a map only if the quiet path does not take it). One without
   the header (an older client, a cluster event from a tool of its own) is parsed and validated
   here, as ``route`` does, into a ``Routed`` record: where it came from, its log time
   (``core/clock.py``: the record's broker time, set on the event as ``log_ms``) and the validated
   event, or its dead letter (those go to cluster ``""``). Either way a message gives the same
   outcome and, if it is refused, the same dead letter; only an event whose header names another
   cluster than its own is refused for that.
2. ``run_batch`` (the one stateful operator, keyed by cluster) puts one cluster's messages in log
   order (``merge_log_order``) and runs ``engine.step`` on each, as ``replay`` does: the cluster's
   state, and each node's from its bucket (``BucketNodes``: a bucket is read when the batch first
   touches one of its nodes, and written back only if it was touched; within it, a node is made a
   state only when the batch looks it up).

No bytes here: ``streaming/stored.py`` packs the router's records and reads and writes the stored
forms, and ``streaming/processors.py`` moves them in and out of Spark rows; ``replay`` (the
``Engine``) is the reference the job is tested against, and runs the same ``step``.
"""

from __future__ import annotations

import heapq
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple, cast

from safepoint.core.cluster import ClusterState
from safepoint.core.engine import APPLIED, DEADLETTERED, Outcome, Tally, step, step_typed
from safepoint.core.event_records import Event
from safepoint.core.event_structs import HoldEvent
from safepoint.core.events import DEADLETTER_CODES, Rejected, parse, typed_event
from safepoint.core.gaps import GAP_PARTITION, Gap
from safepoint.core.ids import CLUSTER_HEADER
from safepoint.core.node import NodeState
from safepoint.core.origin import CONTROL, EVENTS, MISROUTED, is_control, kafka_partition, misrouted, routed_partition
from safepoint.core.outputs import DEADLETTER, Output, dead_letter
from safepoint.core.policy import Policy
from safepoint.core.recovery import StartPlan
from safepoint.core.status import STATUS, cluster_status, node_status, status_key

__all__ = [
    "IGNORE_REASONS",
    "METRICS",
    "BatchResult",
    "BucketNodes",
    "CLUSTER_HEADER",
    "Group",
    "Raw",
    "admit",
    "header_cluster",
    "DeadLetterPayload",
    "Emitted",
    "Routed",
    "Typed",
    "untyped",
    "bucket_of",
    "route",
    "route_records",
    "BatchRun",
    "run_batch",
    "merge_log_order",
    "BY_NAME",
    "counts_of",
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

class DeadLetterPayload(NamedTuple):
    """A message the router turned into its dead letter."""

    key: str
    value: dict[str, Any]
    reason: str
    code: str


class Routed(NamedTuple):
    """One message of a micro-batch, from the router to its cluster's operator: where it came from,
    its log time (what partitions are merged by in log order; -1 for a dead letter) and the validated
    event, or its dead letter (or, at ``GAP_PARTITION``, a gap the source found: ``Gap.to_json``)."""

    partition: int
    offset: int
    log_ms: int
    payload: Event | DeadLetterPayload | dict[str, Any] | Typed


# msgspec (streaming/stored.py unpack_group) decodes a Routed record by its fields' annotations: the
# compiled core (core/compiled.py) keeps a union's annotation only as ``type``, and msgspec decodes no
# union of several TypedDicts; an event record is the map itself, so the payload is read as a map
# (an event, or a gap's) or a dead letter
Routed.__annotations__["payload"] = dict[str, Any] | DeadLetterPayload


class Raw(NamedTuple):
    """A message handed to its cluster's operator as it came (its record named the cluster in
    ``CLUSTER_HEADER``): its routed partition, offset, the record's broker time (None: the topic
    keeps the producers' times), key and value. ``admit`` parses it."""

    partition: int
    offset: int
    broker_ms: int | None
    key: bytes | None
    value: bytes | None


class Group(NamedTuple):
    """One cluster's messages of a micro-batch from the router: the ones it parsed (and the source's
    gaps) and the ones it handed through unread."""

    routed: list[Routed]
    raw: list[Raw]


# as Routed's above: the compiled core keeps a union's annotation only as ``type``
Raw.__annotations__.update(broker_ms=int | None, key=bytes | None, value=bytes | None)


class Typed(NamedTuple):
    """A hold's opening or closing that came unread, decoded by ``admit`` as a struct (``typed_event``:
    sure of it, and of the cluster its header named) and offered to the quiet path as it is
    (``step_typed``). The message, its topic and the router's size limit are kept for the full path,
    which parses it (``untyped``). Never stored: it lives in the operator's batch only."""

    event: HoldEvent
    raw: Raw
    topic: str
    limit: int


def header_cluster(headers: Iterable[tuple[str, bytes | None]] | None) -> str | None:
    """The cluster a record's headers name (``CLUSTER_HEADER``), or None: no such header, an empty
    one, or one that is not UTF-8 (the value decides, parsed before the shuffle)."""
    if not headers:
        return None
    for name, value in headers:
        if name == CLUSTER_HEADER and value:
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None
    return None


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
        cluster, item = _parsed(routed_partition(origin, partition), offset, key, value, broker_ms, topic, limit, origin)
        group = groups.get(cluster)
        if group is None:
            groups[cluster] = [*heads, item] if heads and cluster else [item]
        else:
            group.append(item)
    return groups


def route_records(rows: Iterable[tuple[int, int, bytes | None, bytes | None, int | None, str | None]], topic: str,
                  policy: Policy, gaps: Iterable[Gap] = (), origin: str = EVENTS) -> dict[str, Group]:
    """``route`` for messages with the cluster their record's header names (the sixth field;
    ``header_cluster``): those go through unread, as ``Raw`` records of the named cluster's group, the
    others are parsed as ``route`` parses them. Each cluster's group has the gaps' records first."""
    groups: dict[str, Group] = {}
    heads = [Routed(GAP_PARTITION, g.id, -1, g.to_json()) for g in gaps]
    limit = policy.max_message_bytes
    for partition, offset, key, value, broker_ms, named in rows:
        routed = routed_partition(origin, partition)
        if named is not None:
            group = groups.get(named)
            if group is None:
                group = groups[named] = Group(list(heads), [])
            group.raw.append(Raw(routed, offset, broker_ms, key, value))
            continue
        cluster, item = _parsed(routed, offset, key, value, broker_ms, topic, limit, origin)
        group = groups.get(cluster)
        if group is None:
            group = groups[cluster] = Group([*heads, item] if heads and cluster else [item], [])
        else:
            group.routed.append(item)
    return groups


def _parsed(routed: int, offset: int, key: bytes | None, value: bytes | None, broker_ms: int | None, topic: str,
            limit: int, origin: str, cluster: str | None = None) -> tuple[str, Routed]:
    """One message parsed and validated: its cluster ("" for a dead letter) and its record. With
    ``cluster`` (the one its record's header named), an event of another cluster is refused."""
    event = parse(value, limit)
    if not isinstance(event, Rejected) and cluster is not None and event["cluster"] != cluster:
        event = Rejected(f"invalid header {CLUSTER_HEADER}: it names cluster {cluster!r}, the event's cluster is "
                         f"{event['cluster']!r}")
    if isinstance(event, Rejected):
        out = dead_letter(event.error, value, key, topic, kafka_partition(routed), offset)
        return "", Routed(routed, offset, -1, DeadLetterPayload(out.key, out.value, event.error, event.code))
    log = event["log_ms"] = event["wall_ms"] if broker_ms is None else broker_ms
    misrouted(event, origin, value, key, topic, kafka_partition(routed), offset)
    return event["cluster"], Routed(routed, offset, log, event)


def admit(cluster: str, raw: Iterable[Raw], topics: Mapping[str, str], policy: Policy,
          typed: bool = True) -> list[Routed]:
    """The operator's half of ``route_records``: ``cluster``'s messages that came unread, parsed and
    validated as ``route`` would have (the same records, the same dead letters), an event whose
    header named another cluster than its own refused. ``topics``: each origin's topic name (the
    dead letters name it); ``policy``: the one whose ``max_message_bytes`` the router applies.

    With ``typed``, a hold's opening or closing on the events topic is decoded as a struct instead
    (``Typed``, at the same log time), and parsed only if the quiet path does not take it
    (``untyped``): the same outcome either way (False where it would be parsed anyway: a cluster
    that checks signatures)."""
    limit = policy.max_message_bytes
    events = topics[EVENTS]
    out: list[Routed] = []
    for item in raw:
        partition, offset, broker_ms, key, value = item
        if is_control(partition):
            out.append(_parsed(partition, offset, key, value, broker_ms, topics[CONTROL], limit, CONTROL, cluster)[1])
            continue
        event = typed_event(value, limit) if typed else None
        if event is not None and event.cluster == cluster:
            out.append(Routed(partition, offset, event.wall_ms if broker_ms is None else broker_ms,
                              Typed(event, item, events, limit)))
        else:
            out.append(_parsed(partition, offset, key, value, broker_ms, events, limit, EVENTS, cluster)[1])
    return out


def untyped(cluster: str, typed: Typed) -> Routed:
    """A ``Typed`` record as ``admit`` without ``typed`` would have made it: parsed and validated."""
    raw = typed.raw
    return _parsed(raw.partition, raw.offset, raw.key, raw.value, raw.broker_ms, typed.topic, typed.limit, EVENTS,
                   cluster)[1]


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
    """One cluster's node states, read bucket by bucket from the store as a batch touches them
    (``engine.NodeSource``). ``load(bucket)`` gives a bucket's nodes by name, each as a state or in
    its compact stored form (``NodeState.to_stored``), or None (``streaming/stored.py`` reads them
    from bytes). A bucket's nodes stay in their stored form until the batch looks one up, and the
    ones it did not are written back as they were read."""

    def __init__(self, cluster: str, buckets: int,
                 load: Callable[[int], dict[str, NodeState | list[Any]] | None]) -> None:
        self.cluster = cluster
        self.buckets = buckets
        self.load = load
        self.loaded: dict[int, dict[str, NodeState | list[Any]]] = {}
        """Each bucket read so far: its nodes by name, as a state once looked up, else as stored."""
        self.touched: dict[str, NodeState] = {}
        """The nodes this batch looked up, by name (their status goes out after the batch)."""
        self.written: dict[str, list[Any]] = {}
        """The stored form of each node that ``load`` gave as a state (one an earlier batch in this
        process wrote and kept): what it is written as again while the batch does not look it up."""

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
            nodes = self.loaded[bucket] = {} if stored is None else stored
        return nodes

    def dump(self) -> dict[int, list[NodeState | list[Any]]]:
        """The nodes of every bucket the batch touched, to be stored (each a state it looked up, or
        in the stored form it was read or last written in)."""
        touched, written = self.touched, self.written
        buckets = {bucket_of(name, self.buckets) for name in touched}
        return {b: [written[name] if name not in touched and name in written else entry
                    for name, entry in self.loaded[b].items()] for b in sorted(buckets)}


Emitted = tuple[str | None, str, dict[str, Any]]
"""An output as (channel, key, value); channel None is an accounting row."""


class BatchResult(NamedTuple):
    """One cluster's micro-batch: what it emits (``run_batch``; none from ``BatchRun``, which yields
    them), the labels' counters, and what to store (``cluster`` None: leave the cluster's value as
    it is; ``buckets``: the nodes of only those the batch touched, ``BucketNodes.dump``)."""

    outputs: list[Emitted]
    counts: dict[str, int]
    cluster: ClusterState | None
    buckets: dict[int, list[NodeState | list[Any]]]


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

    __slots__ = ("cluster", "state", "nodes", "items", "policy", "accounting", "start", "result")

    def __init__(self, cluster: str, state: ClusterState | None, nodes: BucketNodes, items: list[Routed],
                 policy: Policy, accounting: bool, start: StartPlan | None = None) -> None:
        """``state``: the cluster's as stored (None: none yet)."""
        self.cluster, self.state, self.nodes, self.items = cluster, state, nodes, items
        self.policy, self.accounting, self.start = policy, accounting, start
        self.result: BatchResult | None = None
        """Set when ``outputs()`` has run to its end (its ``outputs`` empty: they were yielded)."""

    def outputs(self) -> Iterator[Emitted]:
        cluster, nodes, policy = self.cluster, self.nodes, self.policy
        state = self.state
        tally = Tally()
        touched = False
        gaps: dict[int, Gap] = {}
        for partition, offset, log, payload in merge_log_order(self.items):
            if partition == GAP_PARTITION:  # the source's gaps, ahead of the batch's messages (core/gaps.py)
                assert isinstance(payload, dict)
                gap = Gap.of(payload)
                gaps[gap.id] = gap
                continue
            outcome = None
            quiet = True
            if isinstance(payload, Typed):  # to the quiet path as a struct (its cluster met, no gap to take first)
                if state is not None and not gaps:
                    took = step_typed(state, nodes, payload.event, policy, partition, offset, log)
                    if took is not None:
                        outcome = Outcome(APPLIED, None, took)
                        touched = True
                    quiet = False  # refused: the full path does not offer it again
                if outcome is None:
                    payload = untyped(cluster, payload).payload
            if outcome is None and isinstance(payload, DeadLetterPayload):
                outcome = Outcome(DEADLETTERED, payload.code, [Output(DEADLETTER, payload.key, payload.value)])
            elif outcome is None:
                if state is None or gaps:
                    fresh = state is None
                    if state is None:
                        state = ClusterState.starting(cluster, self.start)
                    for o in state.meet_gaps(sorted(gaps.values()), payload["log_ms"] if fresh else None, policy):
                        yield o.channel, o.key, o.value
                    gaps = {}
                    touched = True
                outcome = step(state, nodes, cast(Event, payload), policy, partition, offset, quiet)
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
        self.state = state
        self.result = BatchResult([], counts_of(tally), state if touched else None, nodes.dump())


def run_batch(cluster: str, state: ClusterState | None, nodes: BucketNodes, items: list[Routed], policy: Policy,
              accounting: bool, start: StartPlan | None = None) -> BatchResult:
    """A ``BatchRun`` taken whole: its outputs collected in the result (tests, the bench)."""
    run = BatchRun(cluster, state, nodes, items, policy, accounting, start)
    outputs = list(run.outputs())
    assert run.result is not None
    return run.result._replace(outputs=outputs)
