"""The job's operators run in one process over given micro-batches, without Spark.

The real classes (``streaming/processors.py``) are driven the way ``transformWithState`` drives
them: the router over each partition's Arrow batch, its rows grouped by cluster, one
``handleInputRows`` call per cluster and batch, a value and a map state per cluster (here dicts).
Tests use it to compare the job's batch logic with ``replay`` on many logs and batch splits
quickly; the Spark job itself is tested against the same expectations in tests/integration.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from pyspark.sql import Row

from safepoint.core.engine import Position
from safepoint.core.ids import CLUSTER_HEADER
from safepoint.core.origin import CONTROL, EVENTS, is_control, kafka_partition
from safepoint.streaming.processors import ClusterJob, Router, origins
from safepoint.streaming.stored import KEPT

__all__ = ["LocalJob", "Message", "ORIGINS", "broker_time", "header_of", "position"]

Message = tuple[Any, ...]
"""(partition, offset, key, value) of a Kafka message, with its broker time (``LogAppendTime``) as a
fifth field where the log has one (None: none), and as a sixth the cluster its record's
``safepoint-cluster`` header names, where it has one. ``partition`` is a routed partition
(``core/origin.py``): the control topic's are ``control_partition(p)``."""
ORIGINS = {"ev": EVENTS, "ctl": CONTROL}
"""The tests' events and control topics, as ``Engine(origins=...)`` takes them."""


def position(partition: int, offset: int, key: Any = None) -> Position:
    """The ``Position`` of a message at routed ``partition``: in the control topic ``ctl`` or the events topic ``ev``."""
    return Position("ctl" if is_control(partition) else "ev", kafka_partition(partition), offset, key)


def broker_time(m: Message) -> int | None:
    """A message's broker time (None: the log keeps no time of its own, the event's ``wall_ms`` stands in)."""
    return m[4] if len(m) > 4 else None


def header_of(m: Message) -> str | None:
    """The cluster a message's ``safepoint-cluster`` header names (None: it has none)."""
    return m[5] if len(m) > 5 else None
"""(partition, offset, key, value) as the source reads it."""


class _Keyed:
    """The state of the key ``key`` (set before each call), as Spark scopes it."""

    def __init__(self) -> None:
        self.data: dict[Any, Any] = {}
        self.key: Any = None
        self.calls = 0
        """State calls so far (each one is a round trip to the JVM in Spark)."""


class _ValueState(_Keyed):
    def get(self) -> Any:
        self.calls += 1
        return self.data.get(self.key)

    def update(self, value: Any) -> None:
        self.calls += 1
        self.data[self.key] = value


class _MapState(_Keyed):
    fail_after: int | None = None
    """Reads past this many calls raise."""

    def getValue(self, k: Any) -> Any:  # noqa: N802
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            msg = "a state read failed"
            raise RuntimeError(msg)
        return self.data.get(self.key, {}).get(k)

    def updateValue(self, k: Any, value: Any) -> None:  # noqa: N802
        self.calls += 1
        self.data.setdefault(self.key, {})[k] = value


class _Handle:
    def __init__(self) -> None:
        self.states: dict[str, _Keyed] = {}

    def getValueState(self, name: str, schema: Any, *a: Any, **k: Any) -> _ValueState:  # noqa: N802
        return self.states.setdefault(name, _ValueState())  # type: ignore[return-value]

    def getMapState(self, name: str, key_schema: Any, schema: Any, *a: Any, **k: Any) -> _MapState:  # noqa: N802
        return self.states.setdefault(name, _MapState())  # type: ignore[return-value]


class LocalJob:
    """One job whose state lives across ``run_batch`` calls."""

    def __init__(self, policy: dict[str, Any], topics: dict[str, str], *, buckets: int = 8,
                 accounting_topic: str = "", source: str = "python", keep: str = "some") -> None:
        """``source``: ``python`` routes as the Python source's read tasks do (``Router.pack``);
        ``arrow`` as the ``mapInArrow`` after Spark's kafka source (Arrow batches, the headers a column).
        ``keep``: which of the states the operator kept in this process (``stored.KEPT``) a batch
        finds: ``all`` (one worker runs every batch), ``none`` (each batch decodes all it reads, as
        after a restart) or ``some`` (about half, picked at random: batches that go to two workers)."""
        if keep not in ("all", "none", "some"):
            msg = f"keep: all, none or some, not {keep!r}"
            raise ValueError(msg)
        self.keep = keep
        self.rng = random.Random(len(topics) * 31 + buckets)
        self.buckets = buckets
        self.source = source
        self.policy = policy
        self.topic = topics["events"]
        self.handle = _Handle()
        self.operator = ClusterJob(policy, buckets, topics, accounting_topic)
        self.router = Router(policy, origins(self.topic, topics.get("control")))
        self.operator.init(self.handle)  # type: ignore[arg-type]
        self.accounting: list[dict[str, int]] = []
        """Per batch: the observed accounting counters."""
        self.seconds = {"route": 0.0, "operator": 0.0}
        """Time spent so far in the router and the stateful operator."""

    def run_batch(self, messages: Iterable[Message], fail_reads: int | None = None) -> list[tuple[str, str | None, str]]:
        """One micro-batch: the (topic, key, value) rows the sink would write, in order. With
        ``fail_reads``, every read of a bucket after that many raises (a task that fails mid-batch:
        nothing is stored)."""
        import pyarrow as pa

        t0 = time.perf_counter()
        groups: dict[str, list[Any]] = defaultdict(list)
        by_partition: dict[int, list[Message]] = defaultdict(list)
        for m in messages:
            by_partition[m[0]].append(m)
        for part in sorted(by_partition):  # one Arrow batch (or chunk of rows) per Kafka partition, through the real Router
            msgs = by_partition[part]
            topic = position(part, 0).topic
            if self.source == "python":
                rows = [(kafka_partition(m[0]), m[1], m[2], m[3], broker_time(m), header_of(m)) for m in msgs]
                outs = [self.router.pack(topic, rows)]
            else:
                heads = [[{"key": CLUSTER_HEADER, "value": h.encode()}] if (h := header_of(m)) is not None else None
                         for m in msgs]
                batch = pa.RecordBatch.from_arrays(
                    [pa.array([topic] * len(msgs), pa.string()),
                     pa.array([kafka_partition(m[0]) for m in msgs], pa.int32()), pa.array([m[1] for m in msgs], pa.int64()),
                     pa.array([m[2] for m in msgs], pa.binary()), pa.array([m[3] for m in msgs], pa.binary()),
                     pa.array([broker_time(m) for m in msgs], pa.int64()),
                     pa.array(heads, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))],
                    names=["topic", "partition", "offset", "key", "value", "timestamp", "headers"],
                )
                outs = list(self.router(iter([batch])))
            for out in outs:
                for cluster, blob in zip(*(out.column(i).to_pylist() for i in range(2)), strict=True):
                    groups[cluster].append(Row(cluster=cluster, blob=blob))
        t1 = time.perf_counter()
        written: list[tuple[str, str | None, str]] = []
        totals: dict[str, int] = {}
        nodes = self.handle.states["nodes"]
        nodes.fail_after = None if fail_reads is None else nodes.calls + fail_reads
        if self.keep != "all":
            KEPT.forget(self.operator.scope, None if self.keep == "none" else lambda _k: self.rng.random() < 0.5)
        for cluster, rows in groups.items():
            for state in self.handle.states.values():
                state.key = (cluster,)
            for out in self.operator.handleInputRows((cluster,), iter(rows), None):
                if out["topic"] == "":  # the counter row: observed, not written
                    for m, n in out.asDict().items():
                        if m not in ("topic", "key", "value"):
                            totals[m] = totals.get(m, 0) + n
                else:
                    written.append((out["topic"], out["key"], out["value"]))
        self.accounting.append(totals)
        self.seconds["route"] += t1 - t0
        self.seconds["operator"] += time.perf_counter() - t1
        return written

    def state_bytes(self) -> tuple[int, int]:
        """Bytes of the stored state values: (the nodes' buckets, the clusters' values)."""
        nodes, cluster = self.handle.states["nodes"], self.handle.states["cluster"]
        return (sum(len(v[0]) for buckets in nodes.data.values() for v in buckets.values()),
                sum(len(v[0]) for v in cluster.data.values()))

    def state_calls(self) -> int:
        """State calls so far, over every state variable."""
        return sum(s.calls for s in self.handle.states.values())


def replay_in_batches(engine: Any, batches: list[list[Message]], gaps: dict[int, list[Any]] | None = None
                      ) -> list[tuple[str, str | None, str]]:
    """What ``engine`` (replay) emits over ``batches`` taken in the job's order (per cluster, each
    batch's partitions merged by log time), as (topic, key, value) rows like ``LocalJob.run_batch``'s;
    ``gaps``: batch index -> the gaps the source hands that batch (``Engine.gap`` before it)."""
    import json

    from safepoint.core.batch import merge_log_order, route

    channel = {"directives": "dir", "alerts": "al", "deadletter": "dl"}
    rows: list[tuple[str, str | None, str]] = []
    for i, batch in enumerate(batches):
        for gap in (gaps or {}).get(i, []):
            rows += [(channel[o.channel], o.key, json.dumps(o.value)) for o in engine.gap(gap)]
        groups: dict[str, list[Any]] = {}
        for m in batch:
            pos = position(m[0], m[1])
            ((cluster, (routed,)),) = route([(pos.partition, *m[1:4], broker_time(m))], pos.topic, engine.policy,
                                            origin=ORIGINS[pos.topic]).items()
            groups.setdefault(cluster, []).append((m[0], m[1], routed.log_ms, m[2], m[3], broker_time(m)))
        for cluster in groups:
            for p, o, _log, k, v, b in merge_log_order(groups[cluster]):
                rows += [(channel[out.channel], out.key, json.dumps(out.value))
                         for out in engine.process(v, position(p, o, k), b)]
    return rows
