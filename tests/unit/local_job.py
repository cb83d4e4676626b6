"""The job's processors run in one process over given micro-batches, without Spark.

The real operator classes (``streaming/processors.py``) are driven the way ``transformWithState``
drives them: rows grouped by the operator's key, one ``handleInputRows`` call per key and batch,
a value state per key (here a dict). Tests use it to compare the job's batch logic with
``replay`` on many logs and batch splits quickly; the Spark job itself is tested against the same
expectations in tests/integration.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from pyspark.sql import Row

from safepoint.streaming.processors import BucketProcessor, ClusterProcessor, Router

__all__ = ["LocalJob", "Message"]

Message = tuple[int, int, bytes | None, bytes | None]
"""(partition, offset, key, value) as the source reads it."""


class _KeyedState:
    """A ValueState: one value per grouping key; ``key`` is set before each call."""

    def __init__(self) -> None:
        self.data: dict[Any, Any] = {}
        self.key: Any = None

    def exists(self) -> bool:
        return self.key in self.data

    def get(self) -> Any:
        return self.data.get(self.key)

    def update(self, value: Any) -> None:
        self.data[self.key] = value

    def clear(self) -> None:
        self.data.pop(self.key, None)


class _Handle:
    def __init__(self) -> None:
        self.states: dict[str, _KeyedState] = {}

    def getValueState(self, name: str, schema: Any, *a: Any, **k: Any) -> _KeyedState:  # noqa: N802
        return self.states.setdefault(name, _KeyedState())


class LocalJob:
    """One job whose state lives across ``run_batch`` calls."""

    def __init__(self, policy: dict[str, Any], topics: dict[str, str], *, buckets: int = 8,
                 accounting_topic: str = "") -> None:
        self.buckets = buckets
        self.policy = policy
        self.topic = topics["events"]
        self.h1, self.h2 = _Handle(), _Handle()
        self.p1 = BucketProcessor(policy, buckets)
        self.p2 = ClusterProcessor(policy, topics, accounting_topic)
        self.router = Router(policy, self.topic, buckets)
        self.p1.init(self.h1)
        self.p2.init(self.h2)
        self.s1 = next(iter(self.h1.states.values()))
        self.s2 = next(iter(self.h2.states.values()))
        self.accounting: list[dict[str, int]] = []
        """Per batch: the observed accounting counters."""
        self.seconds = {"route": 0.0, "stage1": 0.0, "stage2": 0.0}
        """Time spent so far in the router, stage one and stage two."""

    def run_batch(self, messages: Iterable[Message]) -> list[tuple[str, str | None, str]]:
        """One micro-batch: the (topic, key, value) rows the sink would write, in order."""
        import pyarrow as pa

        t0 = time.perf_counter()
        groups1: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
        by_partition: dict[int, list[Message]] = defaultdict(list)
        for m in messages:
            by_partition[m[0]].append(m)
        for part in sorted(by_partition):  # one Arrow batch per Kafka partition, through the real Router
            msgs = by_partition[part]
            batch = pa.RecordBatch.from_arrays(
                [pa.array([m[0] for m in msgs], pa.int32()), pa.array([m[1] for m in msgs], pa.int64()),
                 pa.array([m[2] for m in msgs], pa.binary()), pa.array([m[3] for m in msgs], pa.binary())],
                names=["partition", "offset", "key", "value"],
            )
            for out in self.router(iter([batch])):
                for cluster, bucket, blob in zip(*(out.column(i).to_pylist() for i in range(3)), strict=True):
                    groups1[(cluster, bucket)].append(Row(cluster=cluster, bucket=bucket, blob=blob))
        t1 = time.perf_counter()
        groups2: dict[str, list[Any]] = defaultdict(list)
        totals: dict[str, int] = {}
        for key, rows in groups1.items():
            self.s1.key = key
            for out in self.p1.handleInputRows(key, iter(rows), None):
                groups2[out["cluster"]].append(out)
                for m, n in out.asDict().items():
                    if m not in ("cluster", "blob"):
                        totals[m] = totals.get(m, 0) + n
        self.accounting.append(totals)
        t2 = time.perf_counter()
        written: list[tuple[str, str | None, str]] = []
        for cluster, rows in groups2.items():
            self.s2.key = (cluster,)
            for out in self.p2.handleInputRows((cluster,), iter(rows), None):
                written.append((out["topic"], out["key"], out["value"]))
        t3 = time.perf_counter()
        self.seconds["route"] += t1 - t0
        self.seconds["stage1"] += t2 - t1
        self.seconds["stage2"] += t3 - t2
        return written

    def state_bytes(self) -> tuple[int, int]:
        """Bytes of the stored state values: (node stage, cluster stage)."""
        return (sum(len(v[0]) for v in self.s1.data.values()), sum(len(v[0]) for v in self.s2.data.values()))

