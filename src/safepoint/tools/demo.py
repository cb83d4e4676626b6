"""``safepoint demo``: embedded broker, simulated cluster, the job, and a live terminal view."""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

from safepoint.settings import Settings

__all__ = ["run_demo", "LiveView"]


class LiveView:
    """Follows the directives and alerts topics and renders the cluster's safe point."""

    def __init__(self, settings: Settings, expiries: queue.Queue[tuple[str, str, str]] | None = None) -> None:
        from confluent_kafka import Consumer

        self.settings = settings
        self.consumer = Consumer(
            settings.librdkafka(
                **{
                    "logger": logging.getLogger("safepoint.librdkafka"),
                    "group.id": f"safepoint-demo-view-{time.time_ns()}",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "receive.message.max.bytes": 1_000_000_000,
                }
            )
        )
        self.consumer.subscribe([settings.directives_topic, settings.alerts_topic])
        self.latest: dict[str, dict[str, Any]] = {}
        self.directives: deque[dict[str, Any]] = deque(maxlen=6)
        self.alerts: deque[dict[str, Any]] = deque(maxlen=6)
        self.raised: dict[str, dict[str, Any]] = {}
        self.count = 0
        self.bands: dict[str, dict[str, str]] = {}  # node -> {kind: severity}
        self.expired: deque[dict[str, Any]] = deque(maxlen=4)
        self.expiries = expiries
        self.expire_seq: dict[str, int] = {}

    def poll(self, timeout: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            raw = msg.value()
            if raw is None:
                continue
            value = json.loads(raw)
            if msg.topic() == self.settings.directives_topic and value.get("type") == "expire":
                if value["seq"] > self.expire_seq.get(value["cluster"], 0):
                    self.expire_seq[value["cluster"]] = value["seq"]
                    self.expired.append(value)
                    if self.expiries is not None and "reader_id" in value:
                        self.expiries.put((value["cluster"], value["node"], value["reader_id"]))
            elif msg.topic() == self.settings.directives_topic and value.get("type") == "compaction":
                prev = self.latest.get(value["cluster"])
                if prev is None or value["seq"] > prev["seq"]:
                    self.latest[value["cluster"]] = value
                    self.directives.append(value)
                    self.count += 1
            elif value.get("type") == "alert":
                self.alerts.append(value)
                if value["state"] == "raised":
                    self.raised[value["id"]] = value
                else:
                    self.raised.pop(value["id"], None)
                if value["kind"] in ("pinned_bytes", "reader_age") and value.get("node"):
                    node_bands = self.bands.setdefault(value["node"], {})
                    if value["state"] == "raised":
                        node_bands[value["kind"]] = f"{value['severity']} ({_human(value['kind'], value['value'])})"
                    else:
                        node_bands.pop(value["kind"], None)

    def render(self, elapsed: float, job: str) -> str:
        lines = [f"safepoint demo  t+{elapsed:5.0f}s  job: {job}  directives seen: {self.count}", ""]
        lines.append(f"{'cluster':<12}{'seq':>6}{'safe_ts (us)':>20}{'lag s':>8}  blocker")
        for name, d in sorted(self.latest.items()):
            lag = d["cluster_wall_ms"] / 1000 - d["safe_ts"] / 1e6
            b = d.get("blocker") or {}
            blocker = f"{b.get('node')} {b.get('kind')} {b.get('id') or ''} {b.get('label') or ''}".strip()
            if b.get("age_ms") is not None:
                blocker += f" age {b['age_ms'] / 1000:.1f}s"
            lines.append(f"{name:<12}{d['seq']:>6}{d['safe_ts']:>20}{lag:>8.1f}  {blocker}")
        if not self.latest:
            lines.append("  (waiting for the first directive: Spark starts, then every node reports)")
        lines += ["", "pressure bands (normal unless listed):"]
        for node, kinds in sorted(self.bands.items()):
            if kinds:
                lines.append(f"  {node:<14}" + "  ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        for e in list(self.expired)[::-1]:
            lines.append(f"  expired {e['mode']:<8} {e['node']} {e.get('reader_id') or e.get('tx_id')}: {e['reason'][:70]}")
        lines += ["", "recent directives:"]
        for d in list(self.directives)[::-1]:
            lines.append(f"  {d['cluster']} seq {d['seq']} safe_ts {d['safe_ts']} floor {d['catalog_floor']}")
        lines += ["", f"active alerts: {len(self.raised)}   recent:"]
        for a in list(self.alerts)[::-1]:
            lines.append(f"  {a['state']:<8}{a['severity']:<9}{a['kind']:<18}{a['detail'][:90]}")
        return "\n".join(lines)

    def close(self) -> None:
        self.consumer.close()


def show(screen: str, tty: bool, last_print: float) -> float:
    """Redraw the screen on a terminal; elsewhere (logs, CI) print it every 5 s. Returns last_print."""
    if tty:
        sys.stdout.write("\x1b[2J\x1b[H" + screen + "\n")
        sys.stdout.flush()
    elif time.monotonic() - last_print >= 5:
        last_print = time.monotonic()
        print(screen + "\n", flush=True)
    return last_print


def follow(settings: Settings, duration_s: float | None) -> int:
    """``safepoint view``: follow a running job's outputs until Ctrl-C or the duration ends."""
    from safepoint.connectors.topics import check_reachable

    check_reachable(settings.librdkafka())
    view = LiveView(settings)
    start = time.monotonic()
    tty = sys.stdout.isatty()
    last_print = 0.0
    try:
        while duration_s is None or time.monotonic() - start < duration_s:
            view.poll(1.0)
            screen = view.render(time.monotonic() - start, f"following {settings.directives_topic} at {settings.bootstrap}")
            last_print = show(screen, tty, last_print)
    except KeyboardInterrupt:
        pass
    finally:
        view.close()
    return 0


def _human(kind: str, value: int | None) -> str:
    if value is None:
        return "?"
    if kind == "pinned_bytes":
        return f"{value / 1e9:.1f} GB"
    return f"{value / 1000:.0f}s"


def run_demo(settings: Settings, duration_s: float | None, nodes: int, rate: float, checkpoint: str | None) -> int:
    from safepoint.connectors.topics import ensure_topics, topic_specs
    from safepoint.streaming.job import build_query, messages_in
    from safepoint.streaming.session import build_session, check_java
    from safepoint.tools.broker import EmbeddedBroker
    from safepoint.tools.simulate import SimConfig, run_simulator

    check_java()
    tty = sys.stdout.isatty()
    own_ckpt = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="safepoint-demo-ckpt-")
    print("starting the embedded broker ...", flush=True)
    broker = EmbeddedBroker().start()
    settings = replace(
        settings,
        bootstrap=broker.bootstrap,
        checkpoint=checkpoint,
        **_demo_policy(settings),
    )
    print(f"broker ready at {broker.bootstrap}; retention {settings.retention} us, lease {settings.node_lease_ms} ms", flush=True)
    spark = query = view = None
    sim_thread = None
    start = time.monotonic()
    try:
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), settings.events_partitions))
        expiries: queue.Queue[tuple[str, str, str]] = queue.Queue()
        sim_cfg = SimConfig(nodes=nodes, rate=rate, stuck_reader_every_ms=60_000)
        sim_thread = threading.Thread(
            target=run_simulator,
            args=(broker.bootstrap, settings.events_topic, sim_cfg, duration_s, 0),
            kwargs={"quiet_output": True, "expiries": expiries},
            daemon=True,
        )
        sim_thread.start()
        log_fd, log_file = tempfile.mkstemp(prefix="safepoint-demo-", suffix=".log")
        os.close(log_fd)
        print(f"simulating {nodes} nodes at {rate:.0f} events/s; starting Spark (its log: {log_file}) ...", flush=True)
        spark = build_session(settings.spark_master, settings.shuffle_partitions, app="safepoint-demo", log_file=log_file)
        query = build_query(spark, settings)
        view = LiveView(settings, expiries)
        last_print = 0.0
        while duration_s is None or time.monotonic() - start < duration_s:
            view.poll(1.0)
            if not query.isActive:
                print(f"the job stopped: {query.exception()}", file=sys.stderr)
                return 1
            if not sim_thread.is_alive() and (duration_s is None or time.monotonic() - start < duration_s - 1):
                print("the simulator stopped early (its error is printed above); stopping the demo", file=sys.stderr)
                return 1
            prog = query.lastProgress
            job = f"batch {prog['batchId']}, {messages_in(prog)} events" if prog else "starting"
            screen = view.render(time.monotonic() - start, job)
            last_print = show(screen, tty, last_print)
        print(f"demo finished: {view.count} directives; final:", flush=True)
        for name, d in sorted(view.latest.items()):
            print(f"  cluster {name}: seq {d['seq']} safe_ts {d['safe_ts']}", flush=True)
        return 0 if view.count > 0 else 1
    except KeyboardInterrupt:
        return 0
    finally:
        if view is not None:
            view.close()
        if query is not None and query.isActive:
            query.stop()
        if spark is not None:
            spark.stop()
        broker.cleanup()
        if own_ckpt:
            shutil.rmtree(checkpoint, ignore_errors=True)


def _demo_policy(settings: Settings) -> dict[str, Any]:
    """Thresholds scaled to a demo: the simulator pins 50 MB per second a reader stays open.
    Values the user set (flag, environment or file) are kept."""
    defaults = Settings()
    demo = {
        "retention": 2_000_000,
        "node_lease_ms": 10_000,
        "directive_interval_ms": 1_000,
        "pinned_warning_enter_bytes": 1_000_000_000,
        "pinned_warning_exit_bytes": 800_000_000,
        "pinned_critical_enter_bytes": 2_000_000_000,
        "pinned_critical_exit_bytes": 1_600_000_000,
        "band_enter_window_ms": 3_000,
        "band_exit_window_ms": 5_000,
        "reader_age_warning_ms": 30_000,
        "reader_age_critical_ms": 60_000,
        "stall_ms": 30_000,
        "expire_after_ms": 5_000,
        "max_reader_lifetime_ms": 30_000,
        "expire_grace_ms": 10_000,
    }
    return {k: v if getattr(settings, k) == getattr(defaults, k) else getattr(settings, k) for k, v in demo.items()}
