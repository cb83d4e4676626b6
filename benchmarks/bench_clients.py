"""The clients phase: how fast one reporter of each client (Python, Go, Java) publishes, and its memory.

Each client's conformance driver (``safepoint.devtools.driver_node.DriverNode``) is one node against a
broker of its own (``--broker``): after a warm-up (a JVM's JIT, the producer's connections) it opens
and closes ``--client-readers`` readers as fast as the client goes and flushes (the driver's
``publish`` operation: two events a reader, each encoded, stamped and produced idempotently with
acks from all in-sync replicas). The figures: events per second to the last delivery, the driver
process's CPU per event (user and system, from /proc), its peak resident memory (VmHWM) and its
resident memory at the end; and the events the topic holds afterwards, which must be every one sent.
The Java driver runs with the JVM's defaults (its heap up to a quarter of the machine's memory: peak
RSS is what the JVM chose to take, not what the client needs).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench_brokers import make_broker
from bench_common import cpu_seconds, say
from confluent_kafka import Consumer

from safepoint.connectors.kafka.clients import watermarks
from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.devtools.driver_node import DriverError, DriverNode

VARIANTS = {"java-64m": ("java", "-Xmx64m")}
"""Clients run with other settings: the Java driver with a heap of at most 64 MB (the JVM's default
heap is a quarter of the machine's memory, which it takes as it likes: its peak RSS says little of
what the client needs)."""

def _status_kb(pid: int, field: str) -> int:
    """A field of /proc/PID/status in kB (VmHWM: the peak resident set, which psutil does not give)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _publish(node: DriverNode, ref: str, readers: int) -> dict[str, Any]:
    reply = node.do({"op": "publish", "ref": ref, "readers": readers, "timeout_ms": 600_000})
    if "error" in reply:
        msg = f"the {node.language} driver refused publish: {reply}\n{node.stderr()}"
        raise DriverError(msg)
    return reply


def _on_topic(bootstrap: str, topic: str) -> int:
    """The records a one-partition topic holds."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "safepoint-bench-clients"})
    try:
        low, high = watermarks(consumer, topic, 0, 30.0)
        return high - low
    finally:
        consumer.close()


def one_client(client: str, bootstrap: str, broker_pid: int, readers: int, warmup: int) -> dict[str, Any]:
    """One reporter of ``client`` publishing ``readers`` readers' events to a topic of its own."""
    language, java_opts = VARIANTS.get(client, (client, ""))
    topics = {name: f"bench-{client}.{name}" for name in ("events", "directives", "alerts", "deadletter")}
    ensure_topics({"bootstrap.servers": bootstrap}, topic_specs(topics, 1, log_append_time=False))
    t0 = time.monotonic()
    # the Java driver with the JVM's defaults (its script's quick-start flags, C1 only, are for the tests)
    node = DriverNode(language, bootstrap, "bench", f"n-{client}", topics["events"], topics["directives"],
                      f"bench-{client}.control", f"bench-{client}.status", heartbeat_ms=0,
                      env={**os.environ, "SAFEPOINT_DRIVER_JAVA_OPTS": java_opts})
    try:
        node.ok({"op": "clock", "mvcc_now": 1_000_000})
        started_s = time.monotonic() - t0
        _publish(node, "warm", warmup)
        cpu0, broker0 = cpu_seconds(node.proc.pid) or 0.0, cpu_seconds(broker_pid) or 0.0
        reply = _publish(node, "b", readers)
        cpu, broker_cpu = (cpu_seconds(node.proc.pid) or 0.0) - cpu0, (cpu_seconds(broker_pid) or 0.0) - broker0
        peak_kb, rss_kb = _status_kb(node.proc.pid, "VmHWM"), _status_kb(node.proc.pid, "VmRSS")
    finally:
        code = node.finish()
    sent = int(reply["events"])
    on_topic = _on_topic(bootstrap, topics["events"])
    return {"client": client, "readers": readers, "events": sent, "seconds": reply["ms"] / 1000,
            "events_per_s": sent / max(reply["ms"] / 1000, 1e-9), "cpu_us_per_event": cpu / sent * 1e6,
            "broker_cpu_us_per_event": broker_cpu / sent * 1e6,
            "peak_rss_bytes": peak_kb * 1024, "rss_end_bytes": rss_kb * 1024, "start_s": started_s,
            "on_topic": on_topic, "expected_on_topic": 2 * (warmup + readers), "exit": code}


def clients_phase(work: Path, args: Any) -> list[dict[str, Any]]:
    """Every client of ``--clients``, each against a fresh broker, one after the other."""
    out = []
    for client in [c.strip() for c in args.clients.split(",") if c.strip()]:
        data = work / f"clients-{client}"
        broker = make_broker(args.broker, str(data)).start()
        try:
            say(f"(7) clients: {client}: {args.client_readers:,} readers opened and closed by one reporter ...")
            row = one_client(client, broker.bootstrap, broker.proc.pid, args.client_readers, args.client_warmup)
        finally:
            broker.cleanup()
            shutil.rmtree(data, ignore_errors=True)
        say(f"(7) clients: {client}: {row['events_per_s']:,.0f} ev/s, {row['cpu_us_per_event']:.1f} us CPU per event, "
            f"peak RSS {row['peak_rss_bytes'] / 1e6:,.0f} MB; on the topic {row['on_topic']:,} of {row['expected_on_topic']:,}")
        out.append(row)
    return out


def clients_lines(rows: list[dict[str, Any]], broker: str) -> list[str]:
    """The phase's section of the report."""
    if not rows:
        return []
    r0 = rows[0]
    lines = ["## Node clients: one reporter publishing", "",
             f"Each client's driver, one node on a fresh broker ({broker}), after a warm-up opens and closes "
             f"{r0['readers']:,} readers as fast as it goes ({r0['events']:,} events, a topic of one partition) and "
             "flushes. CPU and memory are the driver process's, the broker's CPU beside it (from /proc; both share "
             "the machine's cores); java-64m is the Java driver with a heap of at most 64 MB; one run.", "",
             "| client | events/s | CPU per event | the broker's | peak RSS | RSS at the end | start to first answer | on the topic |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        whole = "all" if r["on_topic"] == r["expected_on_topic"] else f"**{r['on_topic']:,} of {r['expected_on_topic']:,}**"
        lines.append(f"| {r['client']} | {r['events_per_s']:,.0f} | {r['cpu_us_per_event']:.1f} us | "
                     f"{r['broker_cpu_us_per_event']:.1f} us | "
                     f"{r['peak_rss_bytes'] / 1e6:,.0f} MB | {r['rss_end_bytes'] / 1e6:,.0f} MB | {r['start_s']:.2f} s | {whole} |")
    return lines
