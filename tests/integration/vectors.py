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
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from safepoint.connectors.kafka.topics import ensure_topics
from safepoint.core.signing import public_key_of, sign_directive, sign_node
from safepoint.devtools.driver_node import Lines

from kafka_util import read_messages, unique

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
    records: list[dict[str, Any]] = field(default_factory=list)
    """Each event's record as the vector's ``record`` says it: its key and headers."""
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
    for message in read_messages(bootstrap, events_topic):
        ran.records.append({"key": message.key().decode() if message.key() is not None else None,
                            "headers": {k: v.decode() for k, v in message.headers() or []}})
        event = json.loads(message.value())
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
