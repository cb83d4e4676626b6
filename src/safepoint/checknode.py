"""``safepoint check-node``: what one node publishes, checked against the contract.

A team integrating a new database (a Java, Go, C++ or Rust node with its own Kafka client) runs it
first: it reads the events topic for a while without disturbing the job, keeps what one node
publishes, and names every way it departs from the contract, each departure once, with a count
and one example offset. ``NodeCheck`` is the pure part (feed it messages, ask for findings); the
Kafka reading is ``read_node``.

What is checked (the operator guide, "Publishing from another language", says why):

* ``invalid``: an event the job would dead-letter (the job's own parser decides, with its class);
* ``key``: an event of the node keyed by something else than the node id (its order is then not kept);
* ``seq_repeat`` / ``seq_back`` / ``seq_gap``: ``seq`` repeated, going back, or skipping within one
  incarnation (a gap is an event lost on the way; not when the topic's offsets skipped there too:
  records deleted before they were read are not the node's doing, the report counts them);
* ``incarnation_back``: an incarnation lower than one already seen (and not a process that still speaks);
* ``two_processes``: an older incarnation sends new events after a newer one appeared: two live
  processes speak as one node id (a copied configuration, a process that outlived its replacement);
  the job counts the holds of both and raises ``duplicate_node`` until one falls silent;
* ``heartbeat_sparse``: heartbeats further apart than half of ``node_lease_ms`` in ``wall_ms``, or
  none at all: the job would call the node stale and hold the safe point;
* ``close_unknown``: a ``reader_close`` or ``tx_end`` for a hold never opened, once the checker
  knows the node's complete set (after a snapshot of the incarnation, or from the node's first event);
* ``unpublished_hold``: a snapshot listing a reader or transaction below the retention bound
  (``mvcc_now - retention`` of the node's highest heartbeat so far) that was never published,
  once the complete set is known. ``retention`` is the one the node publishes with: a Reporter
  with lazy registration (``Reporter(..., retention=R)``) leaves the holds at or above its bound
  unpublished by design, so the check takes ``R`` (``check-node --retention R``; without the
  flag, the job's retention announced on the cluster's newest directive, else 0: every hold
  must be published);
* ``leader_never_publishes``: a group the node leads whose ``published_min_tx_time`` stayed null in
  every heartbeat read: the job cannot know the node's minimum;
* ``snapshot_parts``: a snapshot sent in parts whose parts do not follow one another (a part skipped,
  another event between two parts, another ``cut``): the job applies none of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from safepoint.core.batch import header_cluster
from safepoint.core.event_records import NodeEvent
from safepoint.core.events import Rejected, is_node_event, parse
from safepoint.core.ids import CLUSTER_HEADER
from safepoint.core.policy import Policy

__all__ = ["Finding", "NodeCheck", "announced_retention", "read_node", "CHECKS"]

CHECKS = ("invalid", "key", "header", "seq_repeat", "seq_back", "seq_gap", "incarnation_back", "two_processes", "heartbeat_sparse",
          "close_unknown", "unpublished_hold", "leader_never_publishes", "snapshot_parts")


@dataclass(slots=True)
class Finding:
    """One way the node departs from the contract: how often, and the first example."""

    check: str
    what: str
    count: int = 1
    example: str = ""

    def line(self) -> str:
        times = f" ({self.count} times)" if self.count > 1 else ""
        return f"{self.check}: {self.what}{times}; first at {self.example}"


@dataclass(slots=True)
class _Node:
    incarnation: int = -1
    seq: int = -1
    readers_known: bool = False
    """The checker knows every open reader: after a snapshot, a restart (a new process has none), or
    from the node's first event."""
    txs_known: bool = False
    """The same for transactions (a prepared one outlives a restart, so only a snapshot or the first event)."""
    readers: dict[str, int] = field(default_factory=dict)
    txs: dict[str, int] = field(default_factory=dict)
    mvcc_now: int | None = None
    bound: int | None = None
    """The highest retention bound of the node's heartbeats (a lazy reporter never lowers it)."""
    last_heartbeat: int | None = None
    heartbeats: int = 0
    leading: dict[str, bool] = field(default_factory=dict)
    """group the node leads -> whether it ever published a time."""
    older: dict[int, int] = field(default_factory=dict)
    """Each earlier incarnation -> its last seq (an older process that still speaks)."""
    parts: dict[str, Any] | None = None
    """A snapshot sent in parts, received so far: {cut, parts, next, readers, txs}."""
    lost: bool = False
    """Offsets of the topic skipped since its last event read (records deleted before they were read)."""


class NodeCheck:
    """Feed one node's messages in offset order; ``findings`` names every departure once."""

    def __init__(self, cluster: str, node: str, policy: Policy, from_first_event: bool = False) -> None:
        self.cluster, self.node, self.policy = cluster, node, policy
        self.events = 0
        self.state = _Node(readers_known=from_first_event, txs_known=from_first_event)
        self.next_offset: dict[int, int] = {}
        self.skipped = 0
        """Offsets of the topic that were gone when read (records deleted before they were read)."""
        self._findings: dict[str, Finding] = {}

    def _found(self, check: str, what: str, where: str) -> None:
        f = self._findings.get(check)
        if f is None:
            self._findings[check] = Finding(check, what, 1, where)
        else:
            f.count += 1

    def feed(self, key: bytes | None, value: bytes | None, partition: int, offset: int,
             headers: list[tuple[str, bytes | None]] | None = None) -> None:
        """One message of the events topic (any node's: others are skipped), with its record's headers."""
        where = f"partition {partition} offset {offset}"
        expected = self.next_offset.get(partition)
        if expected is not None and offset > expected:
            self.skipped += offset - expected
            self.state.lost = True
        self.next_offset[partition] = offset + 1
        event = parse(value, self.policy.max_message_bytes)
        if isinstance(event, Rejected):
            if key == self.node.encode():
                self.events += 1
                self._found("invalid", f"an event the job dead-letters ({event.code}: {event.error})", where)
            return
        if not is_node_event(event) or event["node"] != self.node or event["cluster"] != self.cluster:
            return
        self.events += 1
        if key != self.node.encode():
            self._found("key", f"events keyed {key!r}, not by the node id {self.node!r}: their order is not kept", where)
        named = header_cluster(headers)
        if named is not None and named != event["cluster"]:
            self._found("header", f"the record's {CLUSTER_HEADER} header names cluster {named!r}, the event's cluster is "
                                  f"{event['cluster']!r}: the job dead-letters it", where)
        if self._order(event, where):
            self._holds(event, where)

    def _order(self, event: NodeEvent, where: str) -> bool:
        """Check the event's incarnation and seq; False for an older process's event (its holds are
        not the newest process's)."""
        n = self.state
        inc, seq = event["incarnation"], event["seq"]
        if inc < n.incarnation:
            last = n.older.get(inc)
            if last is not None and seq > last:
                n.older[inc] = seq
                self._found("two_processes", f"incarnation {inc} still sends events after incarnation {n.incarnation} "
                            "appeared: two live processes speak as this node id; the job counts both and raises "
                            "duplicate_node; give each process its own node id", where)
            else:
                self._found("incarnation_back", f"incarnation {inc} after {n.incarnation}: the job ignores such events",
                            where)
            return False
        if inc > n.incarnation:
            if n.incarnation >= 0:  # a restart: its readers died with the process (prepared transactions did not)
                n.older[n.incarnation] = n.seq
                n.readers.clear()
                n.readers_known = True
            n.bound = None  # a new process publishes eagerly until its first heartbeat, then from its own bound
            n.incarnation, n.seq = inc, seq
            return True
        if seq == n.seq:
            self._found("seq_repeat", f"seq {seq} sent twice in incarnation {inc}: the job ignores the repeat", where)
        elif seq < n.seq:
            self._found("seq_back", f"seq {seq} after {n.seq} in incarnation {inc}: the job ignores it", where)
        else:
            if seq > n.seq + 1 and not n.lost:
                self._found("seq_gap", f"seq jumps from {n.seq} to {seq} in incarnation {inc}: events lost on the way?", where)
            n.seq = seq
            n.lost = False
        return True

    def _parts(self, event: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
        """The whole snapshot once its last part is read (None before, and for parts that do not follow)."""
        n = self.state
        if event["type"] != "snapshot" or event.get("parts", 1) == 1:
            if n.parts is not None:
                self._found("snapshot_parts", f"an event between the parts of a snapshot ({n.parts['next']} of "
                            f"{n.parts['parts']} read): the job applies none of it", where)
                n.parts = None
            return event
        part, parts = event.get("part", 0), event["parts"]
        if part == 0:
            n.parts = {"cut": event["cut"], "parts": parts, "next": 0, "readers": [], "txs": []}
        p = n.parts
        if p is None or (p["cut"], p["parts"], p["next"]) != (event["cut"], parts, part):
            self._found("snapshot_parts", f"part {part} of {parts} of a snapshot does not follow the parts read: the "
                        "job applies none of it", where)
            n.parts = None
            return None
        p["next"] += 1
        p["readers"] += event["readers"]
        p["txs"] += event["txs"]
        if p["next"] < parts:
            return None
        n.parts = None
        return {**event, "readers": p["readers"], "txs": p["txs"]}

    def _holds(self, event: Mapping[str, Any], where: str) -> None:
        whole = self._parts(event, where)
        if whole is None:
            return
        event = whole
        n, kind, wall = self.state, event["type"], event["wall_ms"]
        if kind == "reader_open":
            n.readers[event["reader_id"]] = event["read_ts"]
        elif kind == "tx_begin":
            n.txs[event["tx_id"]] = event["begin_ts"]
        elif kind in ("reader_close", "tx_end"):
            reader = kind == "reader_close"
            holds, hid = (n.readers, event["reader_id"]) if reader else (n.txs, event["tx_id"])
            if holds.pop(hid, None) is None and (n.readers_known if reader else n.txs_known):
                self._found("close_unknown", f"{kind} for {hid}, which was never opened", where)
        elif kind == "snapshot":
            bound = n.bound
            for entries, holds, id_key, ts_key, known in ((event["readers"], n.readers, "reader_id", "read_ts", n.readers_known),
                                                           (event["txs"], n.txs, "tx_id", "begin_ts", n.txs_known)):
                for h in entries:
                    if known and h[id_key] not in holds and bound is not None and h[ts_key] < bound:
                        self._found("unpublished_hold", f"the snapshot lists {h[id_key]} at {h[ts_key]}, below the "
                                    f"retention bound {bound} (retention {self.policy.retention}), but it was never "
                                    "published (a reporter that publishes lazily: pass its retention with --retention)",
                                    where)
            n.readers = {r["reader_id"]: r["read_ts"] for r in event["readers"]}
            n.txs = {t["tx_id"]: t["begin_ts"] for t in event["txs"]}
            n.readers_known = n.txs_known = True
        elif kind == "heartbeat":
            lease = self.policy.node_lease_ms
            if n.last_heartbeat is not None and wall - n.last_heartbeat > lease / 2:
                self._found("heartbeat_sparse", f"{wall - n.last_heartbeat} ms between heartbeats; the job calls a "
                            f"node stale after node_lease_ms = {lease}: send one at least every {lease // 2} ms", where)
            n.last_heartbeat = wall if n.last_heartbeat is None else max(n.last_heartbeat, wall)
            n.heartbeats += 1
            n.mvcc_now = event["mvcc_now"]
            bound = n.mvcc_now - self.policy.retention
            n.bound = bound if n.bound is None else max(n.bound, bound)
            for g in event.get("groups") or ():
                if g.get("leader"):
                    n.leading[g["group"]] = n.leading.get(g["group"], False) or g.get("published_min_tx_time") is not None

    def findings(self) -> list[Finding]:
        """Every departure, in the order of ``CHECKS``."""
        found = dict(self._findings)
        if self.events and self.state.heartbeats == 0:
            found["heartbeat_sparse"] = Finding("heartbeat_sparse", "no heartbeat at all: the job cannot know the node's "
                                                "minimum and calls it stale", 1, "the whole window")
        silent = sorted(g for g, published in self.state.leading.items() if not published)
        if silent:
            found["leader_never_publishes"] = Finding(
                "leader_never_publishes", f"group(s) {', '.join(silent)} it leads never published a min tx time: the "
                "node's minimum stays unknown and the round aborts", 1, "every heartbeat read")
        return [found[c] for c in CHECKS if c in found]

    def report(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "node": self.node, "events": self.events, "retention": self.policy.retention,
                "skipped_offsets": self.skipped,
                "conforms": bool(self.events) and not self.findings(), "findings": [asdict(f) for f in self.findings()]}


def read_node(conf: dict[str, Any], topic: str, duration_s: float, from_beginning: bool,
              node: str) -> Iterator[tuple[bytes | None, bytes | None, int, int, list[tuple[str, bytes | None]] | None]]:
    """The events topic's messages that may be the node's, for ``duration_s`` (from the current end,
    or from the beginning), without a consumer group: the job's reading is not disturbed."""
    from safepoint.connectors.kafka.follow import TopicFollower
    from safepoint.connectors.kafka.topics import check_reachable, quiet
    from safepoint.errors import BrokerError

    check_reachable(conf)
    follower = TopicFollower(quiet(conf), topic, "beginning" if from_beginning else "end",
                             client_id="safepoint-check-node")
    try:
        if not follower.open():
            msg = f"cannot read {topic} at {conf.get('bootstrap.servers')}: {follower.error}"
            raise BrokerError(msg)
        needle = json.dumps(node).encode()
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            for m in follower.poll(min(0.5, max(0.0, deadline - time.monotonic()))):
                key, value = m.key(), m.value()
                if key == node.encode() or (value is not None and needle in value):
                    yield key, value, m.partition() or 0, m.offset() or 0, m.headers()
    finally:
        follower.close()


def announced_retention(conf: dict[str, Any], directives_topic: str, cluster: str, timeout_s: float = 10.0) -> int | None:
    """The ``retention`` the job announced on the cluster's newest compaction directive (None: no
    directive of the cluster was read)."""
    from safepoint.connectors.kafka.seeds import read_directive_values

    newest: dict[str, Any] | None = None
    for value in read_directive_values(conf, directives_topic, timeout_s):
        if value.get("type") == "compaction" and value.get("cluster") == cluster and isinstance(value.get("seq"), int) \
                and (newest is None or value["seq"] > newest["seq"]):
            newest = value
    retention = None if newest is None else newest.get("retention")
    return retention if isinstance(retention, int) else None
