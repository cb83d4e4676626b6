"""What the integration tests share: the job run as a process, logs to send, the checkpoint read
back, and the check that a run's outputs are replay's (``verify``).

How a run is checked (``verify``):

* Input, exactly once: the checkpoint's offset log must tile every partition of the events topic
  from 0 to its end, every batch committed; the accounting topic must name every input offset,
  and an offset written twice (a batch re-run after a crash) must carry the same outcome both
  times, equal to replay's label for it (an event applied twice would read ``ignored:duplicate``
  the second time).
* The job's own order: the batches are rebuilt from the offset log and each one is merged as the
  cluster stage merges it (per cluster, partitions by offset, interleaved by the stage-one
  ``wall_ms``), then replayed through ``Engine``. The accounting topic's order per cluster must
  be that order.
* Output, at least once: directives are read as a node reads them (a ``seq`` that does not
  advance is dropped), and must then equal replay's, ``seq`` contiguous from 1 and ``safe_ts``
  never going back; a repeated ``seq`` must repeat the same directive byte for byte. Alerts and
  dead letters are compared with repeats removed.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from safepoint.connectors.kafka.clients import FAILOVER_CONF
from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
from safepoint.core import Engine, Policy, Position
from safepoint.core.batch import BY_NAME, merge_log_order, route
from safepoint.core.codec import encode
from safepoint.core.origin import CONTROL, EVENTS, control_partition, is_control, kafka_partition
from safepoint.core.policy import Policies
from safepoint.devtools.simulate import SimConfig, generate_log, key_of
from safepoint.settings import Settings, load_settings
from safepoint.streaming.java import C1_ONLY

from kafka_util import read_topic, unique


def events_by_partition(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("raw"), "enable.auto.commit": False})
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    try:
        for p in sorted(c.list_topics(topic, timeout=10).topics[topic].partitions):
            end = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            c.assign([TopicPartition(topic, p, 0)])
            pos, deadline = 0, time.monotonic() + 20
            while pos < end and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                out.append((p, m.offset(), m.key(), m.value()))
                pos = m.offset() + 1
        return out
    finally:
        c.close()


def log_rows(bootstrap: str, settings: Settings) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every message of the events and the control topics, at its routed partition (``core/origin.py``)."""
    ctl = [(control_partition(p), *rest) for p, *rest in events_by_partition(bootstrap, settings.control_topic)]
    return events_by_partition(bootstrap, settings.events_topic) + ctl  # type: ignore[arg-type]


def log_ends(bootstrap: str, settings: Settings) -> dict[int, int]:
    """The end offsets of both topics, by routed partition."""
    ctl = {control_partition(p): e for p, e in topic_ends(bootstrap, settings.control_topic).items()}
    return {**topic_ends(bootstrap, settings.events_topic), **ctl}


def run_to_end(spark: Any, settings: Any, checkpoint: str) -> int:
    """Start the job's query, run it until it has read everything there is, stop it: messages read."""
    from safepoint.streaming.job import build_query, messages_in

    q = build_query(spark, settings, checkpoint)
    try:
        q.processAllAvailable()
        return sum(messages_in(p) for p in q.recentProgress)
    finally:
        q.stop()


def get(url: str) -> Any:
    """GET a loopback URL: JSON decoded when the answer is JSON, text otherwise."""
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
        body = resp.read()
        return json.loads(body) if resp.headers.get_content_type() == "application/json" else body.decode()


def answers(url: str) -> bool:
    """Whether an HTTP server answers ``url`` (any status)."""
    try:
        get(url)
    except (OSError, http.client.HTTPException):
        return False
    return True


Message = tuple[int | None, str, Any]
"""(partition or None for the default partitioner, key, value): dicts are sent as JSON."""

JOB_START_TIMEOUT_S = 240.0
CATCH_UP_TIMEOUT_S = 240.0


# -- the log ------------------------------------------------------------------------------


class Node:
    """One database node's side of the log: its incarnation and seq, on a fixed partition."""

    def __init__(self, name: str, cluster: str, partition: int | None, incarnation: int = 1) -> None:
        self.name, self.cluster, self.partition = name, cluster, partition
        self.incarnation, self.seq = incarnation, 0

    def event(self, kind: str, wall: int, **fields: Any) -> Message:
        self.seq += 1
        return self.partition, self.name, {"v": 1, "type": kind, "cluster": self.cluster, "node": self.name,
                                           "incarnation": self.incarnation, "seq": self.seq, "wall_ms": wall, **fields}

    def heartbeat(self, wall: int, mvcc: int) -> Message:
        return self.event("heartbeat", wall, mvcc_now=mvcc)

    def restart(self) -> None:
        self.incarnation += 1
        self.seq = 0


def cluster_event(cluster: str, kind: str, wall: int, version: int, partition: int | None = 0, **fields: Any) -> Message:
    return partition, cluster, {"v": 1, "type": kind, "cluster": cluster, "wall_ms": wall, "version": version, **fields}


def simulated_log(seed: int, duration_ms: int) -> tuple[list[Message], Message]:
    """A simulated cluster (readers, transactions, two-phase commits, node restarts), a few
    duplicate deliveries and bad messages, then every hold closed and two rounds of heartbeats at
    one MVCC time; and a catalog event to send once the job has applied all that: its directive
    names every node's last event in ``basis``."""
    cfg = SimConfig(nodes=4, rate=100, cluster="c1", restart_per_node_per_min=3.0, long_reader_share=0.02,
                    long_reader_ms=(500, 3_000), prepare_share=0.2)
    log = generate_log(cfg, duration_ms, seed=seed)
    spread = {"c1-n1": 0, "c1-n2": 1, "c1-n3": 2, "c1-n4": 0, "c1": 1, "junk": 2}  # every partition busy
    out: list[Message] = []
    holds: dict[str, dict[str, str]] = defaultdict(dict)
    last: dict[str, tuple[int, int]] = {}
    for i, ev in enumerate(log):
        out.append((spread[key_of(ev)], key_of(ev), ev))
        node = ev.get("node")
        if node:
            if last.get(node, (-1, 0))[0] != ev["incarnation"]:
                holds[node] = {h: k for h, k in holds[node].items() if k == "prepared"}
            last[node] = (ev["incarnation"], ev["seq"])
            if ev["type"] == "reader_open":
                holds[node][ev["reader_id"]] = "reader"
            elif ev["type"] == "tx_begin":
                holds[node][ev["tx_id"]] = "tx"
            elif ev["type"] == "tx_prepare":
                holds[node][ev["tx_id"]] = "prepared"
            elif ev["type"] in ("reader_close", "tx_end"):
                holds[node].pop(ev.get("reader_id") or ev.get("tx_id"), None)
        if i % 397 == 200:
            out.append((spread[key_of(ev)], key_of(ev), dict(ev)))  # a duplicate delivery: ignored, counted
        if i % 1499 == 700:
            out.append((spread["junk"], "junk", "{not json"))  # dead-lettered
    wall = log[-1]["wall_ms"] + 1
    mvcc = (wall + 10_000) * 1000
    for node, (inc, seq) in sorted(last.items()):
        for hid, kind in sorted(holds[node].items()):
            seq, wall = seq + 1, wall + 1
            base = {"v": 1, "cluster": "c1", "node": node, "incarnation": inc, "seq": seq, "wall_ms": wall}
            if kind == "reader":
                out.append((spread[node], node, {**base, "type": "reader_close", "reader_id": hid}))
            else:
                out.append((spread[node], node, {**base, "type": "tx_end", "tx_id": hid, "outcome": "commit"}))
        last[node] = (inc, seq)
    for round_ in range(2):
        # the second round after the grace: the holds of a process that restarted last have gone by then
        wall += round_ * Policy().incarnation_grace_ms
        for node, (inc, seq) in sorted(last.items()):
            seq, wall = seq + 1, wall + 1
            beat = {"v": 1, "type": "heartbeat", "cluster": "c1", "node": node, "incarnation": inc, "seq": seq,
                    "wall_ms": wall, "mvcc_now": mvcc}
            out.append((spread[node], node, beat))
            last[node] = (inc, seq)
    return out, cluster_event("c1", "catalog", wall + 1, 100, spread["c1"], catalog_version=1, activated_at=mvcc - 10**7)


def check_labels(labels: dict[str, int], log: list[Message], extra_applied: int, resent: int) -> None:
    """What every message of a ``simulated_log`` must come to: applied, a repeated delivery
    ignored as a duplicate, junk dead-lettered; and the ``resent`` extra copies the feeder's new
    producer sent after a fatal error, ignored (as a duplicate, an older seq, a stale version for a
    copy of a cluster event, or, for a copy of a message from before its node's restart that lands
    after the restart's first event, a stale incarnation). Every message of the log itself must be applied, so an ignored label cannot
    hide a lost one."""
    junk = sum(1 for m in log if not isinstance(m[2], dict))
    repeats = sum(1 for a, b in zip(log, log[1:], strict=False) if isinstance(b[2], dict) and a[2] == b[2])
    ignored = {k: v for k, v in labels.items() if k.startswith("ignored:")}
    allowed = {"ignored:duplicate", "ignored:older_seq"}
    if resent and restarted(log):
        allowed.add("ignored:stale_incarnation")
    if resent:
        allowed.add("ignored:stale_version")
    assert set(ignored) <= allowed, labels
    assert labels["applied"] == len(log) - junk - repeats + extra_applied, labels
    assert labels["deadlettered:not_json"] == junk and sum(ignored.values()) == repeats + resent, labels
    assert set(labels) - set(ignored) == {"applied", "deadlettered:not_json"}, labels


def restarted(log: list[Message]) -> bool:
    """Some node of the log starts a new incarnation after events of an older one."""
    seen: dict[str, int] = {}
    for _p, _k, ev in log:
        if isinstance(ev, dict) and ev.get("node"):
            if ev["incarnation"] > seen.get(ev["node"], ev["incarnation"]):
                return True
            seen[ev["node"]] = ev["incarnation"]
    return False


def last_positions(log: list[Message]) -> dict[str, dict[str, int]]:
    """Each node's (incarnation, seq) after the log: the basis the final directive must carry."""
    out: dict[str, dict[str, int]] = {}
    for _p, _k, ev in log:
        if isinstance(ev, dict) and ev.get("node"):
            out[ev["node"]] = {"incarnation": ev["incarnation"], "seq": ev["seq"]}
    return out


QUIET = {"log_level": 0}
"""librdkafka logs nothing: the broker restart makes test clients log every refused connection."""


def producer(bootstrap: str, conf: dict[str, Any] | None = None) -> Producer:
    """An idempotent producer of the tests, with ``conf`` over its settings."""
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **(conf or {}), **QUIET})


def send(bootstrap: str, topic: str, messages: list[Message]) -> None:
    p = producer(bootstrap)
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for part, key, value in messages:
        data = json.dumps(value) if isinstance(value, dict) else value
        if part is None:
            p.produce(topic, key=key, value=data, on_delivery=on_delivery)
        else:
            p.produce(topic, key=key, value=data, partition=part, on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(60) == 0 and not failed, failed[:3]


def fatal(exc: BaseException) -> bool:
    """A dead idempotent producer: a clean restart of the embedded broker with a request in flight
    can desynchronise its sequence numbers (OUT_OF_ORDER_SEQUENCE_NUMBER), and it never sends again."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL)


class Feeder(threading.Thread):
    """Produces a log at a steady pace, never past ``allowed`` messages (the test moves it).

    Like a node's client, it outlives a fatal producer error or a failed delivery: a new producer
    sends again, in order, every message not confirmed yet and every one confirmed in the last
    ``RESEND_S`` seconds (so the topic may hold a few repeats: the job must ignore them as
    duplicates). The embedded broker can lose the last messages it acknowledged before a clean
    stop (measured: 3 of 1,400 with a producer sending through the stop); the fatal
    OUT_OF_ORDER_SEQUENCE_NUMBER that follows is the only sign. An idempotent librdkafka producer
    with requests in flight through a broker's restart can also stall, delivering nothing until
    its messages time out (seen once on Apache Kafka: 120 s without a delivery report, with
    librdkafka's defaults): it has the project's clients' ``FAILOVER_CONF``, its messages time out
    after ``STALL_S``, and a new producer sends them again. A ``Reporter``
    repairs either with a new producer and a snapshot; a fixed log can only be sent again."""

    RESEND_S = 15.0
    STALL_S = 30.0

    def __init__(self, bootstrap: str, topic: str, log: list[Message], per_s: float, allowed: int | None = None) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.log, self.per_s = bootstrap, topic, log, per_s
        self.allowed = len(log) if allowed is None else allowed
        self.sent = 0
        self.rebuilds = 0
        self.delivered: dict[int, Any] = {}  # log index -> delivery error (None: delivered)
        self.confirmed_at: dict[int, float] = {}  # log index -> when its delivery was confirmed
        self.error: BaseException | None = None
        self._undelivered = False  # a delivery failed since the producer was made
        self._cv = threading.Condition()
        self._p: Producer | None = None
        self._retired: list[Producer] = []

    def allow(self, n: int) -> None:
        with self._cv:
            self.allowed = min(len(self.log), max(self.allowed, n))
            self._cv.notify_all()

    @property
    def idle(self) -> bool:
        """Everything allowed so far has been handed to the producer."""
        return self.sent >= self.allowed

    def _produce(self, i: int) -> None:
        assert self._p is not None
        part, key, value = self.log[i]
        data = json.dumps(value) if isinstance(value, dict) else value

        def on_delivery(err: Any, msg: Any) -> None:
            self.delivered[i] = err
            self.confirmed_at[i] = time.monotonic()
            if err is not None:
                self._undelivered = True

        if part is None:
            self._p.produce(self.topic, key=key, value=data, on_delivery=on_delivery)
        else:
            self._p.produce(self.topic, key=key, value=data, partition=part, on_delivery=on_delivery)

    def _producer(self) -> Producer:
        return producer(self.bootstrap, {**FAILOVER_CONF, "message.timeout.ms": int(self.STALL_S * 1000)})

    def _rebuild(self) -> None:
        self.rebuilds += 1
        assert self.rebuilds <= 5, "the producer keeps dying"
        self._undelivered = False
        if self._p is not None:  # kept, never polled again: its destruction could wait on what it holds
            self._retired.append(self._p)
        self._p = self._producer()
        recent = time.monotonic() - self.RESEND_S
        for i in range(self.sent):
            if self.delivered.get(i, "unconfirmed") is not None or self.confirmed_at.get(i, 0.0) >= recent:
                self.delivered.pop(i, None)
                self._produce(i)

    def _guarded(self, step: Callable[[], None]) -> None:
        while True:
            try:
                step()
                return
            except KafkaException as exc:
                if not fatal(exc):
                    raise
                self._rebuild()

    def _poll(self, timeout_s: float) -> None:
        """The producer's delivery reports; a new producer after a failed delivery (every message
        handed over so far was given to the old one, so the rebuild sends again all that failed)."""
        self._guarded(lambda: self._p.poll(timeout_s))  # type: ignore[union-attr]
        if self._undelivered:
            self._rebuild()

    def run(self) -> None:
        try:
            self._p = self._producer()
            tick = 0.05
            chunk = max(1, int(self.per_s * tick))
            while self.sent < len(self.log):
                with self._cv:
                    while self.sent >= self.allowed:
                        self._cv.wait(0.5)
                    upto = min(self.allowed, self.sent + chunk)
                while self.sent < upto:
                    self._guarded(lambda: self._produce(self.sent))
                    self.sent += 1
                self._poll(0)
                time.sleep(tick)
            deadline = time.monotonic() + 120
            while len(self.delivered) < len(self.log) and time.monotonic() < deadline:
                self._poll(0.1)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def finish(self, timeout_s: float = 180.0) -> None:
        self.allow(len(self.log))
        self.join(timeout_s)
        assert not self.is_alive(), f"the feeder did not finish ({self.sent}/{len(self.log)} sent)"
        assert self.error is None, self.error
        failed = [str(e) for e in self.delivered.values() if e is not None]
        assert len(self.delivered) == len(self.log) and not failed, (len(self.delivered), failed[:3])


# -- the job's checkpoint -------------------------------------------------------------------


def _ids(ckpt: Path, kind: str) -> list[int]:
    d = ckpt / kind
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def batch_end(ckpt: Path, batch: int) -> dict[int, int]:
    """The end offsets of one micro-batch, as the offset log recorded them (by routed partition: the
    control topic's are negative, ``core/origin.py``)."""
    lines = (ckpt / "offsets" / str(batch)).read_text().splitlines()
    return {int(p): int(o) for p, o in json.loads(lines[-1]).items() if p.lstrip("-").isdigit()}


def in_flight(ckpt: Path) -> int | None:
    """The batch whose offsets are logged but not yet committed, if one runs now."""
    offsets, commits = _ids(ckpt, "offsets"), _ids(ckpt, "commits")
    if offsets and (not commits or offsets[-1] > commits[-1]):
        return offsets[-1]
    return None


def committed_batches(ckpt: Path) -> list[dict[int, int]]:
    """End offsets of every micro-batch, all of which must be committed."""
    offsets, commits = _ids(ckpt, "offsets"), _ids(ckpt, "commits")
    assert offsets == commits == list(range(len(commits))), (
        f"offset log {offsets[:3]}..{offsets[-3:]} and commit log {commits[:3]}..{commits[-3:]} must both run "
        "0..N (not purged, nothing left uncommitted)")
    return [batch_end(ckpt, b) for b in commits]


class Pacer:
    """Waits for a batch in flight (after two committed ones), so that a fault lands mid-batch.

    With ``sink_topic``, waits until that topic grows while the batch is in flight: the sink is
    writing the batch, so a fault now leaves part of it written. A batch that commits before that
    is seen counts as a miss; after ``misses`` of them any batch in flight will do.
    Whenever the job has caught up with what the feeder may send, the feeder may send ``step``
    more, so that a batch starts; never past ``cap`` of the log, so that the rest is published
    after the fault."""

    def __init__(self, ckpt: Path, feeder: Feeder, cap: float = 0.75, step: int = 60, sink_topic: str | None = None,
                 misses: int = 3) -> None:
        self.ckpt, self.feeder, self.step, self.sink_topic, self.misses = ckpt, feeder, step, sink_topic, misses
        self.cap = int(len(feeder.log) * cap)
        self._next_check = 0.0
        self._watch: tuple[int, int] | None = None  # (batch, sink topic end when it was first seen)
        self.sink_hit = False
        self._consumer = Consumer({"bootstrap.servers": feeder.bootstrap, "group.id": unique("pacer"), **QUIET})

    def _sink_end(self) -> int:
        assert self.sink_topic is not None
        return int(self._consumer.get_watermark_offsets(TopicPartition(self.sink_topic, 0), timeout=10, cached=False)[1])

    def close(self) -> None:
        self._consumer.close()

    def __call__(self) -> bool:
        batch = in_flight(self.ckpt)
        if self._watch is not None and batch != self._watch[0]:
            self._watch, self.misses = None, self.misses - 1  # it committed before its output was seen
        if batch is not None:
            if len(_ids(self.ckpt, "commits")) < 2:
                return False
            if self.sink_topic is None or self.misses <= 0:
                return True
            if self._watch is None:
                self._watch = (batch, self._sink_end())
                return False
            self.sink_hit = self._sink_end() > self._watch[1]
            return self.sink_hit
        if time.monotonic() < self._next_check or not self.feeder.idle:
            return False
        self._next_check = time.monotonic() + 0.3
        if caught_up(self.ckpt, topic_ends(self.feeder.bootstrap, self.feeder.topic)):
            if self.feeder.allowed >= self.cap:
                return len(_ids(self.ckpt, "commits")) >= 2  # fall back: the fault lands between batches
            self.feeder.allow(min(self.cap, self.feeder.sent + self.step))
        return False


def topic_ends(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ends"), **QUIET})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in sorted(parts)}
    finally:
        c.close()


def caught_up(ckpt: Path, ends: dict[int, int]) -> bool:
    commits = _ids(ckpt, "commits")
    if not commits:
        return not any(ends.values())
    done = batch_end(ckpt, commits[-1])
    return all(done.get(p, 0) >= n for p, n in ends.items())


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str, job: JobProcess | QueryJob | None = None,
             every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if job is not None and not job.alive():
            pytest.fail(f"the job ended ({job.ended()}) while waiting for {what}:\n{job.tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}" + (f":\n{job.tail()}" if job else ""))
        time.sleep(every_s)


# -- the job as a process -----------------------------------------------------------------------


def job_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFEPOINT_")}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # tests stay on loopback
    # keep the whole offset log: the test rebuilds every batch from it; a cluster's executors compile
    # with C1 only, as the suite's other JVMs (conftest.py)
    env["PYSPARK_SUBMIT_ARGS"] = ("--conf spark.sql.streaming.minBatchesToRetain=1000000 "
                                  f"--conf spark.executor.extraJavaOptions={C1_ONLY} pyspark-shell")
    return env


class JobProcess:
    """``safepoint run`` in its own session (process group), so its JVM can be killed with it."""

    def __init__(self, flags: dict[str, Any], log_path: Path, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "safepoint.cli", "run"]
        for k, v in flags.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        self.log_path = log_path
        with open(log_path, "ab") as log:
            log.write(f"\n=== {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**job_env(), **(env or {})}, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        keep = [ln for ln in lines if "TransformWithStateInPandas" not in ln and ln.strip()]
        return "\n".join(keep[-n:])

    def ended(self) -> str:
        return f"exit {self.proc.returncode}"

    def kill9(self) -> None:
        """SIGKILL the driver, its JVM and every Python worker the JVM started."""
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the session: driver, spark-submit, JVM
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        for p in family:  # pyspark daemons put themselves in their own process groups
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(family, timeout=10)

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM (the job stops its query and exits); SIGKILL if it hangs."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode


class QueryJob:
    """The job as a query on this test worker's shared Spark session: what a test needs of a running
    job (its outputs, its checkpoint) without the half minute a JVM of its own costs. A test that
    signals, kills or restarts the job, or runs ``safepoint run`` itself, uses ``JobProcess``."""

    def __init__(self, spark: Any, settings: Settings, ckpt: Path) -> None:
        from safepoint.streaming.job import build_query

        self.query = build_query(spark, settings, str(ckpt))

    def alive(self) -> bool:
        return bool(self.query.isActive)

    def ended(self) -> str:
        return f"query stopped: {self.query.exception()}"

    def tail(self, n: int = 40) -> str:
        progress = self.query.lastProgress or {}
        return f"query active={self.query.isActive}, exception={self.query.exception()}, last batch {progress.get('batchId')}"

    def stop(self) -> int:
        """Stop the query; 0 when it had not failed."""
        failed = self.query.exception() is not None
        self.query.stop()
        return 1 if failed else 0


NOISE = ("doesn't contain a value", "doesn't contain key", "Failed to cancel job group", "SparkEnv not active",
         "cannot do maintenance", "No more data to read from the socket", "NativeCodeLoader", "AQE")
"""What Spark printed in normal operation of the job before its log configuration left it out
(``streaming/log4j2.properties``) and its stop stopped the state stores first."""


def noisy_lines(text: str) -> list[str]:
    """The lines of a job's log that are Spark's noise, not the job's own word or a real warning."""
    return [line for line in text.splitlines() if any(n in line for n in NOISE)]


def job_flags(settings: Settings, ckpt: Path, **extra: Any) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "bootstrap": settings.bootstrap, "checkpoint": str(ckpt), "events_topic": settings.events_topic,
        "control_topic": settings.control_topic, "control_on_events_topic": settings.control_on_events_topic,
        "directives_topic": settings.directives_topic, "alerts_topic": settings.alerts_topic,
        "deadletter_topic": settings.deadletter_topic, "accounting_topic": settings.accounting_topic,
        "status_topic": settings.status_topic,
        "retention": settings.retention, "node_lease_ms": settings.node_lease_ms,
        "trigger_ms": settings.trigger_ms, "max_offsets_per_trigger": settings.max_offsets_per_trigger,
        "shuffle_partitions": 2, "spark_master": "local[2]",
    }
    flags.update(extra)
    return flags


# -- replay in the job's order and the comparison ---------------------------------------------


def make_settings(bootstrap: str, prefix: str, partitions: int, **values: Any) -> Settings:
    tag = unique(prefix)
    settings = load_settings(flags={
        "bootstrap": bootstrap, "events_topic": f"{tag}.events", "control_topic": f"{tag}.control",
        "directives_topic": f"{tag}.directives",
        "alerts_topic": f"{tag}.alerts", "deadletter_topic": f"{tag}.deadletter", "accounting_topic": f"{tag}.acct",
        "status_topic": f"{tag}.status",
        "stall_ms": 0, **values}, environ={})
    ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), partitions, log_append_time=False))
    return settings


Outputs = dict[str, dict[str, list[str]]]
"""channel -> cluster -> encoded messages in order (dead letters under cluster "")."""


def _outputs() -> Outputs:
    return {"directives": defaultdict(list), "alerts": defaultdict(list), "deadletter": defaultdict(list)}


@dataclass
class Replayed:
    engine: Engine
    outputs: Outputs
    per_batch: list[Outputs]
    order: dict[str, list[tuple[int, int]]]
    """cluster -> (partition, offset) in the order the cluster stage applies them."""
    batches: list[dict[int, int]]


def replay_policies(settings: Settings, ckpt: Path | str) -> Policies:
    """The policies the job ran under: the settings', with the job's generation, which its checkpoint
    keeps (``streaming/checkpoint.py``): replay given them makes the directives the job made."""
    return settings.policies().with_generation(json.loads((Path(ckpt) / "safepoint.json").read_text())["generation"])


def replay_job_order(rows: list[tuple[int, int, bytes | None, bytes | None]], batches: list[dict[int, int]],
                     settings: Settings, policies: Policies | None = None) -> Replayed:
    """``Engine`` over the log (``log_rows``: both topics) batch by batch, each batch merged per cluster
    as the job's operator merges it: by the ``wall_ms`` the router gives each row (-1 for a dead letter)."""
    policy = settings.policy()
    origins = {settings.events_topic: EVENTS, settings.control_topic: CONTROL}
    engine = Engine(policies or settings.policies(), record=True, origins=origins)  # each cluster's own table, as the job
    total, per_batch = _outputs(), []
    order: dict[str, list[tuple[int, int]]] = defaultdict(list)
    start: dict[int, int] = {}
    by_partition: dict[int, list[tuple[int, int, bytes | None, bytes | None]]] = defaultdict(list)
    for row in rows:
        by_partition[row[0]].append(row)
    for ends in batches:
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for part in sorted(ends):
            for p, off, key, value, *broker in by_partition[part]:
                if not start.get(part, 0) <= off < ends[part]:
                    continue
                topic = settings.control_topic if is_control(p) else settings.events_topic
                pos = Position(topic, kafka_partition(p), off, key)
                stamp = broker[0] if broker else None
                ((cluster, (routed,)),) = route([(pos.partition, off, key, value, stamp)], topic, policy,
                                                origin=origins[topic]).items()
                groups[cluster].append({"partition": p, "offset": off, "log_ms": routed.log_ms, "pos": pos,
                                        "value": value, "broker": stamp})
        outs = _outputs()
        for cluster in sorted(groups):
            for r in merge_log_order(groups[cluster], *BY_NAME):
                if cluster:
                    order[cluster].append((r["partition"], r["offset"]))
                for o in engine.process(r["value"], r["pos"], r["broker"]):
                    owner = o.value.get("cluster", "") if o.channel != "deadletter" else ""
                    outs[o.channel][owner].append(encode(o.value))
                    total[o.channel][owner].append(encode(o.value))
        per_batch.append(outs)
        start = dict(ends)
    return Replayed(engine, total, per_batch, order, batches)


def uniq(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def node_view(directives: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """What a node applies: per cluster and kind, only a directive whose ``seq`` advances. Also
    checks that a repeated ``seq`` repeats the same directive. Returns (applied, repeats)."""
    seen: dict[tuple[str, str, int], str] = {}
    last: dict[tuple[str, str], int] = {}
    applied, repeats = [], 0
    for d in directives:
        kind = (d["cluster"], d.get("type", "compaction"))
        text = encode(d)
        first = seen.setdefault((*kind, d["seq"]), text)
        assert first == text, f"seq {d['seq']} of {kind} was sent with two different contents:\n{first}\n{text}"
        if d["seq"] <= last.get(kind, 0):
            repeats += 1
            continue
        last[kind] = d["seq"]
        applied.append(d)
    return applied, repeats


@dataclass
class Verified:
    replay: Replayed
    directives: dict[str, list[dict[str, Any]]]
    """cluster -> compaction directives as a node applies them."""
    alerts: dict[str, list[dict[str, Any]]]
    output_repeats: int
    accounting_repeats: int
    messages: int
    """Messages in the events and control topics."""


def verify(bootstrap: str, settings: Settings, ckpt: Path) -> Verified:
    """Everything the module docstring promises, for one finished run."""
    rows = log_rows(bootstrap, settings)
    ends = log_ends(bootstrap, settings)
    assert len(rows) == sum(ends.values()), "read the whole events and control topics back"
    batches = committed_batches(ckpt)
    prev: dict[int, int] = {}
    for b in batches:
        assert all(b[p] >= prev.get(p, 0) for p in b), f"offset log goes back: {prev} -> {b}"
        prev = b
    assert batches[-1] == ends, f"the job stopped at {batches[-1]}, the topic ends at {ends}"
    rep = replay_job_order(rows, batches, settings, replay_policies(settings, ckpt))

    # Accounting: every offset, once per processing, the same outcome each time, replay's label.
    acct = read_topic(bootstrap, settings.accounting_topic, timeout_s=30)
    per_offset: dict[tuple[int, int], str] = {}
    for a in acct:
        if a.get("control"):
            a["partition"] = control_partition(a["partition"])
        got = per_offset.setdefault((a["partition"], a["offset"]), a["outcome"])
        assert got == a["outcome"], f"offset {a['partition']}:{a['offset']} accounted {got} then {a['outcome']}: applied twice"
    assert rep.engine.outcomes is not None
    expected_labels = {(p, o): label for p, o, label in rep.engine.outcomes}
    missing = sorted(set(expected_labels) - set(per_offset))
    assert not missing, f"{len(missing)} offsets never accounted for, e.g. {missing[:5]}"
    assert per_offset == expected_labels
    clusters_of = {pos: c for c, seq in rep.order.items() for pos in seq}
    acct_order: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for pos in dict.fromkeys((a["partition"], a["offset"]) for a in acct):
        if pos in clusters_of:
            acct_order[clusters_of[pos]].append(pos)
    assert dict(acct_order) == dict(rep.order), "the job applied the events in another order than the rebuilt batches"

    # Outputs: at least once, deduplicated as their consumers do.
    # read_topic adds the message key as "key"; a dead letter's own "key" (the original one) wins
    raw = {ch: [{k: v for k, v in m.items() if k != "key" or ch == "deadletter"}
                for m in read_topic(bootstrap, topic, timeout_s=30)]
           for ch, topic in (("directives", settings.directives_topic), ("alerts", settings.alerts_topic),
                             ("deadletter", settings.deadletter_topic))}
    applied, repeats = node_view(raw["directives"])
    directives: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for cluster in set(rep.outputs["directives"]) | {d["cluster"] for d in applied}:
        mine = [d for d in applied if d["cluster"] == cluster]
        got, want = [encode(d) for d in mine], rep.outputs["directives"].get(cluster, [])
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        assert got == want, (f"directives of {cluster}: {len(got)} from the job, {len(want)} replayed; the first "
                             f"difference at {first}: {got[first:first + 1]} against {want[first:first + 1]}")
        compaction = [d for d in mine if d.get("type", "compaction") == "compaction"]
        assert [d["seq"] for d in compaction] == list(range(1, len(compaction) + 1)), "seq contiguous from 1"
        safe = [d["safe_ts"] for d in compaction]
        assert safe == sorted(safe), f"safe_ts went back in {cluster}: {safe}"
        directives[cluster] = compaction
        assert (compaction[-1]["safe_ts"] if compaction else None) == rep.engine.clusters[cluster].safe_ts
    alerts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in raw["alerts"]:
        alerts[a["cluster"]].append(a)
    for cluster in set(rep.outputs["alerts"]) | set(alerts):
        got = uniq([encode(a) for a in alerts.get(cluster, [])])
        assert got == uniq(rep.outputs["alerts"].get(cluster, [])), f"alerts of {cluster}"
        alerts[cluster] = [json.loads(a) for a in got]
    dead = sorted(uniq([json.dumps(d, sort_keys=True) for d in raw["deadletter"]]))
    assert dead == sorted(uniq([json.dumps(json.loads(d), sort_keys=True) for d in rep.outputs["deadletter"].get("", [])]))
    out_repeats = repeats + len(raw["alerts"]) - sum(len(v) for v in alerts.values()) + len(raw["deadletter"]) - len(dead)
    return Verified(rep, dict(directives), dict(alerts), out_repeats, len(acct) - len(per_offset), len(rows))


def file_order_safe_ts(log: list[Message], settings: Settings, cluster: str) -> int | None:
    """The safe point of the log replayed in production order, as ``safepoint replay`` reads a file."""
    engine = Engine(settings.policies())
    for i, (_p, _k, value) in enumerate(log):
        engine.process(json.dumps(value) if isinstance(value, dict) else value, Position("file", 0, i))
    return engine.clusters[cluster].safe_ts


def report(name: str, **facts: Any) -> None:
    print(f"[{name}] " + ", ".join(f"{k}={v}" for k, v in facts.items()))


def guide_agent_cmd(text: str, engine: str, mine: dict[str, str], settings: Any, stats: Path, *extra: str) -> list[str]:
    """An engine's page's ``safepoint agent ENGINE`` command (``text``, its block) with this test's
    values for its flags (``mine``: every flag the page gives, no other), this test's topics and
    pace, and ``extra``."""
    import shlex

    argv = shlex.split(text)
    assert argv[:3] == [".venv/bin/safepoint", "agent", engine] and set(argv[3::2]) == set(mine), argv
    argv = [a if argv[i - 1] not in mine else mine[argv[i - 1]] for i, a in enumerate(argv)]
    return [sys.executable, "-m", "safepoint.cli", *argv[1:], "--events-topic", settings.events_topic,
            "--directives-topic", settings.directives_topic, "--poll", "0.3", "--stats-file", str(stats), *extra]
