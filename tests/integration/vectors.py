"""The shared test vectors (``schemas/vectors/``) run through a client's driver against a broker.

A vector names a node (``cluster``, ``node``), the driver's arguments (``args``: ``incarnation``,
``retention``, ``node_key``, ``directive_key``: a name of ``keys``, whose public half the driver gets,
``snapshot_part_bytes``), the operations to feed it (``ops``, the protocol of
``safepoint.devtools.client_driver``) and the directives to write to its directives topic after an
operation's reply (``directives``: ``after`` the reply to that operation, signed ``sign_with`` a key of
``keys``; a ``cluster_wall_ms`` of 0 becomes the time it is written). What a client must do:
``replies`` (one per operation, without ``detail``; a directive a ``wait`` returns as its ``seq`` and
``safe_ts``), ``expired`` (the expiries that reached a handle) and ``events`` (what it published, in
order, without ``wall_ms``, ``opened_wall_ms`` and ``sig``: they carry the time; a ``sig`` is checked
against the node's key instead).
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Producer

from safepoint.connectors.kafka.topics import ensure_topics
from safepoint.core.signing import public_key_of, sign_directive, sign_node
from safepoint.devtools.client_driver import DRIVERS

from kafka_util import read_topic, unique

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "schemas" / "vectors"
TIME_FIELDS = ("wall_ms", "opened_wall_ms")


def vectors() -> list[Path]:
    return sorted(VECTORS.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


@dataclass
class Ran:
    """What a driver did with a vector."""

    replies: list[dict[str, Any]] = field(default_factory=list)
    expired: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    events_topic: str = ""
    """The topic it published to."""
    signed: int = 0
    """Events whose ``sig`` the node's key gives (every one, where the vector has a ``node_key``)."""
    stderr: str = ""

    def outcome(self) -> dict[str, Any]:
        return {"replies": self.replies, "expired": sorted(self.expired, key=lambda e: e["ref"]), "events": self.events}


def _reply(line: str) -> dict[str, Any]:
    reply = dict(json.loads(line))
    reply.pop("detail", None)
    if isinstance(reply.get("directive"), dict):
        reply["directive"] = {k: reply["directive"][k] for k in ("seq", "safe_ts")}
    return reply


class Lines:
    """The driver's output lines as they come (a thread reads them: a line already buffered is never
    waited for at the pipe)."""

    def __init__(self, out: IO[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(out,), daemon=True)
        self.thread.start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            self.queue.put(line)
        self.queue.put(None)

    def next(self, timeout_s: float) -> str:
        try:
            line = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            msg = f"the driver said nothing for {timeout_s:.0f} s"
            raise TimeoutError(msg) from None
        if line is None:
            msg = "the driver ended its output"
            raise RuntimeError(msg)
        return line

    def rest(self) -> list[str]:
        self.thread.join(30)
        lines = []
        while not self.queue.empty():
            line = self.queue.get()
            if line is not None:
                lines.append(line)
        return lines


def run(command: list[str], bootstrap: str, vector: dict[str, Any], timeout_s: float = 60.0) -> Ran:
    """Feed ``vector`` to the driver ``command`` (a list of words) on the broker ``bootstrap``."""
    tag = unique(f"vec-{vector['name']}")
    events_topic, directives_topic = f"{tag}.events", f"{tag}.directives"
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    ensure_topics({"bootstrap.servers": bootstrap}, [NewTopic(events_topic, 1, -1),
                                                     NewTopic(directives_topic, 1, -1, config={"cleanup.policy": "compact"})])
    args, keys = vector["args"], vector.get("keys", {})
    argv = [*command, "--bootstrap", bootstrap, "--cluster", vector["cluster"], "--node", vector["node"],
            "--incarnation", str(args["incarnation"]), "--heartbeat-ms", "0", "--events-topic", events_topic,
            "--directives-topic", directives_topic]
    if args.get("retention") is not None:
        argv += ["--retention", str(args["retention"])]
    if args.get("node_key"):
        argv += ["--node-key", args["node_key"]]
    if args.get("directive_key"):
        argv += ["--directive-key", public_key_of(keys[args["directive_key"]])]
    if args.get("snapshot_part_bytes"):
        argv += ["--snapshot-part-bytes", str(args["snapshot_part_bytes"])]
    producer = Producer({"bootstrap.servers": bootstrap})
    ran = Ran(events_topic=events_topic)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    lines = Lines(proc.stdout)
    try:
        for i, op in enumerate(vector["ops"]):
            proc.stdin.write(json.dumps(op) + "\n")
            proc.stdin.flush()
            while True:
                try:
                    line = lines.next(timeout_s)
                except (TimeoutError, RuntimeError) as exc:
                    proc.kill()
                    msg = f"{vector['name']}: operation {i} {op}: {exc}\n{proc.stderr.read()[-3000:]}"
                    raise AssertionError(msg) from exc
                reply = _reply(line)
                if reply.get("op") == "expired":
                    ran.expired.append(reply)
                    continue
                ran.replies.append(reply)
                break
            for d in vector.get("directives", []):
                if d["after"] == i:
                    value = dict(d["value"])
                    if value.get("cluster_wall_ms") == 0:
                        value["cluster_wall_ms"] = int(time.time() * 1000)
                    if d.get("sign_with"):
                        value["sig"] = sign_directive(value, keys[d["sign_with"]])
                    key = value["cluster"] if value["type"] == "compaction" else f"{value['cluster']}/{value['node']}"
                    producer.produce(directives_topic, key=key, value=json.dumps(value))
            assert producer.flush(10) == 0
        proc.stdin.close()  # the end of the operations
        ran.stderr = proc.stderr.read()
        proc.wait(timeout_s)
        ran.expired += [r for r in (_reply(ln) for ln in lines.rest() if ln.strip()) if r.get("op") == "expired"]
        assert proc.returncode == 0, f"the driver exited with {proc.returncode}:\n{ran.stderr[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
    for event in read_topic(bootstrap, events_topic):
        event.pop("key", None)
        sig = event.pop("sig", None)
        if sig is not None and args.get("node_key"):
            ran.signed += int(_signed_by(event, sig, args["node_key"]))
        for f in TIME_FIELDS:
            event.pop(f, None)
            for entry in [*event.get("readers", []), *event.get("txs", [])]:
                entry.pop(f, None)
        ran.events.append(event)
    return ran


def _signed_by(event: dict[str, Any], sig: str, key: str) -> bool:
    """The event (as published, ``wall_ms`` included) was signed with the node's own ``key``."""
    return sign_node(event, key) == sig


class Node:
    """One driver as a node of a live cluster: ``do`` sends an operation and returns its reply; the
    expiries it reports on the way are kept in ``expired`` (a lock keeps one operation at a time)."""

    def __init__(self, language: str, bootstrap: str, cluster: str, node: str, events_topic: str,
                 directives_topic: str, control_topic: str, status_topic: str, heartbeat_ms: int = 500,
                 incarnation: int = 1) -> None:
        self.language, self.node = language, node
        argv = [*DRIVERS[language], "--bootstrap", bootstrap, "--cluster", cluster, "--node", node,
                "--incarnation", str(incarnation), "--heartbeat-ms", str(heartbeat_ms),
                "--events-topic", events_topic, "--directives-topic", directives_topic,
                "--control-topic", control_topic, "--status-topic", status_topic]
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by finish; a file: a pipe nobody reads fills
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        self.lines = Lines(self.proc.stdout)
        self.expired: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def do(self, op: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        timeout_s = int(op.get("timeout_ms", 0)) / 1000 + 60  # a wait answers by its own timeout
        with self._lock:
            self.proc.stdin.write(json.dumps(op) + "\n")
            self.proc.stdin.flush()
            while True:
                try:
                    reply = dict(json.loads(self.lines.next(timeout_s)))
                except (TimeoutError, RuntimeError) as exc:
                    msg = f"{self.language} node {self.node}: {op}: {exc}\n{self.stderr()}"
                    raise AssertionError(msg) from exc
                if reply.get("op") == "expired":
                    self.expired.append(reply)
                    continue
                return reply

    def ok(self, op: dict[str, Any]) -> None:
        reply = self.do(op)
        assert reply.get("ok") is True, f"{self.language} node {self.node}: {op} -> {reply}"

    def stderr(self) -> str:
        """The end of what the driver logged so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-3000:]

    def finish(self, timeout_s: float = 60.0) -> int:
        """End its input: it closes what is open, flushes and exits."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
