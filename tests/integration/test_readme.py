"""The README's node example, run as written against its own embedded broker and the Spark job
(only the broker's address is replaced). ``db`` is a small in-memory MVCC store standing in for
the user's database: its clock, its retention, and a record of what it was told to compact."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.devtools.broker import EmbeddedBroker
from safepoint.settings import load_settings
from safepoint.streaming.job import build_query

from doc_blocks import block

pytestmark = pytest.mark.integration
README = Path(__file__).resolve().parents[2] / "README.md"


class ToyDB:
    """An MVCC clock in microseconds, a retention of 10 s, and the compactions it was told to do."""

    gc_life_time = 10_000_000

    def __init__(self) -> None:
        self.compacted: list[int] = []
        self.done = threading.Event()

    def now_ts(self) -> int:
        return time.time_ns() // 1_000

    def oldest_local_hold(self) -> int | None:
        return None

    def compact(self, ts: int) -> None:
        self.compacted.append(ts)
        self.done.set()


def test_the_readme_node_example_runs_and_compacts(spark: Any, tmp_path: Path) -> None:
    example = block("README.md", "from safepoint.connectors.reporter import Reporter").text
    db = ToyDB()
    with EmbeddedBroker() as kafka:  # its own broker: the example uses the default topic names
        settings = load_settings(flags={"bootstrap": kafka.bootstrap, "retention": ToyDB.gc_life_time,
                                        "node_lease_ms": 2_000, "trigger_ms": 200}, environ={})
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
        query = build_query(spark, settings, str(tmp_path / "ckpt"))
        try:
            def run_the_query() -> None:  # the example's query: runs until the node has compacted once
                assert db.done.wait(120), "no directive reached the node within 120 s"

            code = example.replace('"kafka:9092"', repr(kafka.bootstrap))
            exec(compile(code, str(README), "exec"), {"db": db, "run_the_query": run_the_query})  # noqa: S102
        finally:
            query.stop()
    assert db.compacted and all(ts <= db.now_ts() - ToyDB.gc_life_time for ts in db.compacted)
    assert db.compacted == sorted(db.compacted), "the safe point only moves forward"
