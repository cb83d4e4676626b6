"""The README's node examples (Python, Go, Java), run as written against an embedded broker of their own and the Spark job
(only the broker's address is replaced). ``db`` is a small in-memory MVCC store standing in for
the user's database: its clock, its retention, and a record of what it was told to compact."""

from __future__ import annotations

import subprocess
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


GO_PROGRAM = """package main

import (
\t"context"
\t"fmt"
\t"os"
\t"sync"
\t"time"

\tsafepoint "safepoint.dev/client"
)

// toyDB: an MVCC clock in microseconds, a retention of 10 s, and the compactions it was told to do.
type toyDB struct {
\tmu        sync.Mutex
\tcompacted []int64
\tonce      sync.Once
\tdone      chan struct{}
}

func (d *toyDB) NowTS() int64            { return time.Now().UnixMicro() }
func (d *toyDB) GCLifeTime() int64       { return 10_000_000 }
func (d *toyDB) OldestLocalHold() *int64 { return nil }
func (d *toyDB) Compact(ts int64) error {
\td.mu.Lock()
\tdefer d.mu.Unlock()
\td.compacted = append(d.compacted, ts)
\tfmt.Println(ts)
\td.once.Do(func() { close(d.done) })
\treturn nil
}

var db = &toyDB{done: make(chan struct{})}

// runTheQuery: the example's query, which runs until the node has compacted once.
func runTheQuery() {
\tselect {
\tcase <-db.done:
\tcase <-time.After(120 * time.Second):
\t\tfmt.Fprintln(os.Stderr, "no directive reached the node within 120 s")
\t\tos.Exit(3)
\t}
}

func example(ctx context.Context) error {
EXAMPLE
}

func main() {
\tif err := example(context.Background()); err != nil {
\t\tfmt.Fprintln(os.Stderr, err)
\t\tos.Exit(1)
\t}
}
"""

JAVA_PROGRAM = """import dev.safepoint.client.*;
import java.util.OptionalLong;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

public class ReadmeNode {
    /** An MVCC clock in microseconds, a retention of 10 s, and the compactions it was told to do. */
    static final class ToyDB {
        final CountDownLatch done = new CountDownLatch(1);
        long nowTs() { return System.currentTimeMillis() * 1000; }
        long gcLifeTime() { return 10_000_000L; }
        OptionalLong oldestLocalHold() { return OptionalLong.empty(); }
        synchronized void compact(long ts) { System.out.println(ts); done.countDown(); }
    }

    static final ToyDB db = new ToyDB();

    /** The example's query, which runs until the node has compacted once. */
    static void runTheQuery() throws InterruptedException {
        if (!db.done.await(120, TimeUnit.SECONDS)) {
            System.err.println("no directive reached the node within 120 s");
            System.exit(3);
        }
    }

    public static void main(String[] args) throws Exception {
EXAMPLE
    }
}
"""


def test_the_readmes_go_and_java_nodes_run_and_compact(spark: Any, tmp_path: Path) -> None:
    """The README's Go and Java nodes, each as written inside a program with a toy database (its node id
    and the broker's address replaced), against one embedded broker and the job: each compacts."""
    root = README.parent
    go_dir, java_dir = tmp_path / "go", tmp_path / "java"
    go_dir.mkdir()
    java_dir.mkdir()
    programs = {"go": block("docs/client.md", "reporter, err := safepoint.NewReporter").text,
                "java": block("docs/client.md", "try (Reporter reporter = Reporter.builder").text}
    jar = next((root / "clients" / "java" / "driver" / "target").glob("safepoint-driver-*.jar"))  # the client and its dependencies
    with EmbeddedBroker() as kafka:
        def as_node(code: str, language: str) -> str:
            return code.replace('"kafka:9092"', f'"{kafka.bootstrap}"').replace('"n1"', f'"n-{language}"')

        (go_dir / "main.go").write_text(GO_PROGRAM.replace("EXAMPLE", as_node(programs["go"], "go")))
        (go_dir / "go.mod").write_text(f"module readme\n\ngo 1.26.0\n\nrequire safepoint.dev/client v0.0.0\n\n"
                                       f"replace safepoint.dev/client => {root / 'clients' / 'go'}\n")
        subprocess.run(["go", "mod", "tidy"], cwd=go_dir, check=True, capture_output=True, timeout=300)  # noqa: S607
        subprocess.run(["go", "build", "-o", "node", "."], cwd=go_dir, check=True, capture_output=True, timeout=300)  # noqa: S607
        (java_dir / "ReadmeNode.java").write_text(JAVA_PROGRAM.replace("EXAMPLE", as_node(programs["java"], "java")))
        subprocess.run(["javac", "-cp", str(jar), "-d", str(java_dir), str(java_dir / "ReadmeNode.java")],  # noqa: S607
                       check=True, capture_output=True, timeout=300)
        settings = load_settings(flags={"bootstrap": kafka.bootstrap, "retention": ToyDB.gc_life_time,
                                        "node_lease_ms": 2_000, "trigger_ms": 200}, environ={})
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), 2, log_append_time=False))
        query = build_query(spark, settings, str(tmp_path / "ckpt"))
        try:
            nodes = {"go": subprocess.Popen([str(go_dir / "node")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: S603
                                            text=True),
                     "java": subprocess.Popen(["java", "-cp", f"{jar}:{java_dir}", "ReadmeNode"],  # noqa: S603, S607
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)}
            done = {lang: proc.communicate(timeout=180) for lang, proc in nodes.items()}
        finally:
            query.stop()
    now = ToyDB().now_ts()
    for lang, (out, err) in done.items():
        assert nodes[lang].returncode == 0, f"{lang}: {err[-3000:]}"
        compacted = [int(x) for x in out.split()]
        assert compacted, f"{lang} never compacted"
        assert all(ts <= now - ToyDB.gc_life_time for ts in compacted), f"{lang}: {compacted}"
