"""The clients phase: how fast one reporter of each client (Python, Go, Java) publishes, and its memory.

Each client's conformance driver (``safepoint.devtools.client_driver.DRIVERS``) is one node against a
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

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from bench_brokers import make_broker
from bench_common import say
from confluent_kafka import Consumer, TopicPartition

from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.devtools.client_driver import DRIVERS

VARIANTS = {"java-64m": ("java", "-Xmx64m")}
"""Clients run with other settings: the Java driver with a heap of at most 64 MB (the JVM's default
heap is a quarter of the machine's memory, which it takes as it likes: its peak RSS says little of
what the client needs)."""
TICK = os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _ask(proc: subprocess.Popen[str], op: dict[str, Any]) -> dict[str, Any]:
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None
    stdin.write(json.dumps(op) + "\n")
    stdin.flush()
    while True:
        line = stdout.readline()
        if not line:
            msg = f"the driver ended before answering {op['op']} (exit {proc.wait()})"
            raise RuntimeError(msg)
        reply = dict(json.loads(line))
        if reply.get("op") == op["op"]:
            if "error" in reply:
                msg = f"the driver refused {op}: {reply}"
                raise RuntimeError(msg)
            return reply


def _on_topic(bootstrap: str, topic: str, partitions: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "safepoint-bench-clients"})
    try:
        total = 0
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high - low
        return total
    finally:
        consumer.close()


def one_client(client: str, bootstrap: str, broker_pid: int, readers: int, warmup: int, log: IO[str]) -> dict[str, Any]:
    """One reporter of ``client`` publishing ``readers`` readers' events to a topic of its own."""
    language, java_opts = VARIANTS.get(client, (client, ""))
    topics = {name: f"bench-{client}.{name}" for name in ("events", "directives", "alerts", "deadletter")}
    events, directives = topics["events"], topics["directives"]
    ensure_topics({"bootstrap.servers": bootstrap}, topic_specs(topics, 1, log_append_time=False))
    argv = [*DRIVERS[language], "--bootstrap", bootstrap, "--cluster", "bench", "--node", f"n-{client}",
            "--incarnation", "1", "--heartbeat-ms", "0", "--events-topic", events, "--directives-topic", directives]
    t0 = time.monotonic()
    # the Java driver with the JVM's defaults (its script's quick-start flags, C1 only, are for the tests)
    env = {**os.environ, "SAFEPOINT_DRIVER_JAVA_OPTS": java_opts}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,  # noqa: S603
                            env=env)
    try:
        _ask(proc, {"op": "clock", "mvcc_now": 1_000_000})
        started_s = time.monotonic() - t0
        _ask(proc, {"op": "publish", "ref": "warm", "readers": warmup})
        cpu0, broker0 = _cpu_s(proc.pid), _cpu_s(broker_pid)
        reply = _ask(proc, {"op": "publish", "ref": "b", "readers": readers})
        cpu, broker_cpu = _cpu_s(proc.pid) - cpu0, _cpu_s(broker_pid) - broker0
        peak_kb, rss_kb = _status_kb(proc.pid, "VmHWM"), _status_kb(proc.pid, "VmRSS")
        assert proc.stdin is not None
        proc.stdin.close()
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sent = int(reply["events"])
    on_topic = _on_topic(bootstrap, events, 1)
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
            with (work / f"clients-{client}.log").open("w") as log:
                say(f"(7) clients: {client}: {args.client_readers:,} readers opened and closed by one reporter ...")
                row = one_client(client, broker.bootstrap, broker.proc.pid, args.client_readers, args.client_warmup, log)
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
