"""A live safety auditor: every compaction directive checked against the holds live when it was made.

``safepoint audit`` follows the events, control and directives topics beside the job and checks,
with a model of its own (it imports none of the job's rules, only ``core/ids.py`` for the alert
id's format, ``core/origin.py``'s naming of the control topic's partitions and ``core/signing.py``'s
HMACs: a bug in the core would have to be made again here to slip through), that no directive passes a live hold and that
no bound goes back:

* **Holds.** A compaction directive carries ``positions``: per partition of the events and control
  topics, the offset after the cluster's last message the job had applied. The auditor keeps each
  cluster's events queued per partition and applies them up to a directive's positions before
  checking it, so every node and service hold is exactly where the job had it. A control event on
  the events topic (unless the cluster's ``control_on_events_topic``), a node event on the
  control topic, and an event without the signature its cluster's keys require (the auditor is
  given the settings' ``control_keys`` and ``node_key_secret``) are skipped: the job refuses them. Then every member's open readers and transactions (prepared
  or not), its retention bound (``mvcc_now - retention``, the directive's ``retention``), its
  groups' published times and the cluster's service holds must lie at or above their bound: a
  hold with a namespace its namespace's bound (``namespaces[ns]``, else ``namespace_safe_ts``,
  else ``safe_ts``), everything else the highest bound sent (it pins every namespace).
* **Excused.** A hold that arrived already below the bound in force (a late reader, a clock or
  group that went back) is the job's ``horizon_violation`` to alert, not a directive's fault: it
  is counted, not reported.
* **Order.** ``seq`` runs 1, 2, 3 ... per cluster (repeats of the same directive are dropped),
  and ``safe_ts``, ``catalog_floor`` and every namespace's bound never go back.

A violation is printed and, unless ``--no-alerts``, published to the alerts topic as an
``audit_violation`` alert (critical). With ``--until-idle SECONDS`` the auditor stops once both
topics were quiet that long and exits 1 if it found a violation (0 otherwise), which is how the
soak, the demo and the tests run it.

Service holds expire on the auditor's own cluster time (the largest log time it applied: a record's
broker time, else its ``wall_ms``, as the job's): it is never ahead of the job's, so a hold is never
taken for live after the job let it expire. Events the auditor missed (a partition's offsets skip:
records deleted before it read them) make it unsure of the holds of every node and service hold
whose events live in that partition, since a lost close would leave a hold here that the job no
longer has: those are not checked (counted) until the node's next snapshot or the hold's renewal,
so a gap never makes it report a violation the job could not have seen. A node restart drops the old process's holds at once
here (the job keeps them for a grace, and an older process that still speaks keeps its own), so the
auditor checks fewer holds than the job keeps there, never more. A
cluster's events wait in memory until a directive reaches them (at most ``max_pending`` per
cluster: beyond that the oldest are applied, and directives behind them are counted as
unverified, never checked against a state that is ahead).
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from safepoint.connectors.kafka.topics import TIMESTAMP_LOG_APPEND_TIME
from safepoint.core.ids import escape, join_id
from safepoint.core.origin import control_partition, routed_of
from safepoint.core.policy import Policies
from safepoint.core.signing import verify, verify_node
from safepoint.ops.contract_check import CLUSTER_TYPES, CONTROL_TYPES, INT64_MIN, SnapshotParts, validate_event

__all__ = ["AUDIT_KIND", "Auditor", "Violation", "follow_and_audit", "run_audit"]

AUDIT_KIND = "audit_violation"
MAX_PENDING = 1_000_000
"""Events a cluster may have queued, waiting for a directive to reach them."""


@dataclass
class _Hold:
    ts: int
    namespace: str | None
    late: bool
    """It arrived below the bound in force then: the job alerts it; no directive is blamed."""


@dataclass
class _Node:
    incarnation: int = -1
    seq: int = -1
    holds: dict[tuple[str, str], _Hold] = field(default_factory=dict)
    prepared: set[str] = field(default_factory=set)
    mvcc_now: int | None = None
    groups: dict[str, int | None] = field(default_factory=dict)
    partition: int | None = None
    parts: SnapshotParts = field(default_factory=SnapshotParts)
    unsure: bool = False
    """Events of it may have been lost before the auditor read them: its holds are not checked until its
    next snapshot."""


@dataclass(frozen=True)
class Violation:
    cluster: str
    seq: int
    node: str | None
    what: str
    ts: int | None
    bound: int | None
    detail: str

    def alert(self, cluster_wall_ms: int) -> dict[str, Any]:
        """The ``audit_violation`` alert of this violation (the alerts topic's contract)."""
        aid = join_id(AUDIT_KIND, self.node or "-", self.what, str(self.seq))
        return {"v": 1, "type": "alert", "kind": AUDIT_KIND, "state": "raised", "severity": "critical",
                "cluster": self.cluster, "node": self.node, "value": self.ts, "threshold": self.bound,
                "since_wall_ms": cluster_wall_ms, "cluster_wall_ms": cluster_wall_ms, "detail": self.detail,
                "id": f"{escape(self.cluster)}/{aid}"}


class _Cluster:
    """One cluster as the auditor sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: dict[int, deque[tuple[int, dict[str, Any] | None, int | None]]] = {}
        """partition -> (offset, event (None: messages lost before it), broker time), waiting for a directive."""
        self.applied_to: dict[int, int] = {}
        """partition -> the offset after the last event applied (or forced) there."""
        self.nodes: dict[str, _Node] = {}
        self.topology: frozenset[str] | None = None
        self.topology_version = -1
        self.service: dict[str, list[int | None]] = {}
        """holder -> [ts, ttl_ms, deadline on the auditor's cluster time (None until a node event gave one)]."""
        self.time: int | None = None
        self.last: dict[str, Any] | None = None
        """The last compaction directive checked (its bounds are in force)."""
        self.waiting: deque[dict[str, Any]] = deque()
        """Directives whose positions the events read so far do not reach yet."""
        self.key_partition: int | None = None
        """The routed partition of the cluster's control events (``core/origin.py``)."""
        self.unsure: set[str] = set()
        """Service holders whose release may have been lost (not checked until they set their hold again)."""

    def pins_all(self) -> int | None:
        """The highest bound in force (what a hold of every namespace must respect)."""
        d = self.last
        if d is None:
            return None
        values = [d["safe_ts"], d.get("namespace_safe_ts"), *(d.get("namespaces") or {}).values()]
        return max(v for v in values if isinstance(v, int))

    def bound_of(self, d: dict[str, Any], namespace: str | None) -> int:
        """The bound a hold of ``namespace`` (None: of every namespace) must respect under ``d``."""
        namespaces = d.get("namespaces") or {}
        base = d.get("namespace_safe_ts")
        if namespace is None:
            return max(v for v in (d["safe_ts"], base, *namespaces.values()) if isinstance(v, int))
        if namespace in namespaces:
            return int(namespaces[namespace])
        return int(base) if isinstance(base, int) else int(d["safe_ts"])

    # -- the model -----------------------------------------------------------------------------
    def lost(self, partition: int) -> None:
        """Messages of ``partition`` were lost before the auditor read them."""
        for node in self.nodes.values():
            if node.partition == partition:
                node.unsure = True
        if self.key_partition in (None, partition):
            self.unsure |= set(self.service)

    def apply(self, ev: dict[str, Any] | None, log: int | None = None, partition: int | None = None) -> None:
        """One event at log time ``log`` (None: its ``wall_ms``) from ``partition``; None: a gap there."""
        if ev is None:
            if partition is not None:
                self.lost(partition)
            return
        kind = ev["type"]
        if kind in CONTROL_TYPES and partition is not None:
            self.key_partition = partition
        if kind in CONTROL_TYPES:
            self._control(ev)
        elif kind in CLUSTER_TYPES:
            if kind == "topology" and ev["version"] > self.topology_version:
                self.topology_version = ev["version"]
                self.topology = frozenset(ev["nodes"])
        else:
            self._node_event(ev, ev["wall_ms"] if log is None else log, partition)

    def _control(self, ev: dict[str, Any]) -> None:
        holder = ev.get("holder")
        if isinstance(holder, str):
            self.unsure.discard(holder)
        if ev["type"] == "service_release" and isinstance(holder, str):
            self.service.pop(holder, None)
        elif ev["type"] == "service_hold" and isinstance(holder, str):
            bound = self.pins_all()
            if bound is not None and ev["ts"] < bound:
                return  # refused by the job (below a bound already sent): it holds nothing
            deadline = None if self.time is None else self.time + ev["ttl_ms"]
            self.service[holder] = [ev["ts"], ev["ttl_ms"], deadline]

    def _node_event(self, ev: dict[str, Any], log: int, partition: int | None = None) -> None:
        node = self.nodes.setdefault(ev["node"], _Node())
        if partition is not None:
            node.partition = partition
        inc, seq = ev["incarnation"], ev["seq"]
        if inc < node.incarnation or (inc == node.incarnation and seq <= node.seq):
            return  # stale or a duplicate: the job ignores it too
        if inc > node.incarnation:  # a restart: readers and undecided transactions died with the process
            node.holds = {k: h for k, h in node.holds.items() if k[0] == "tx" and k[1] in node.prepared}
            node.incarnation = inc
        node.seq = seq
        whole = node.parts.take(ev)
        if whole is None:
            return  # a part of a snapshot sent in several messages: applied with its last
        ev = whole
        if self.time is None or log > self.time:
            self.time = log
            for hold in self.service.values():
                if hold[2] is None:  # set before any cluster time: its TTL starts now, as the job's does
                    hold[2] = log + int(hold[1] or 0)
        t = ev["type"]
        if t in ("reader_open", "tx_begin"):
            kind, hid, ts = ("reader", ev["reader_id"], ev["read_ts"]) if t == "reader_open" else \
                ("tx", ev["tx_id"], ev["begin_ts"])
            self._open(node, (kind, hid), ts, ev.get("namespace"))
        elif t == "reader_close":
            node.holds.pop(("reader", ev["reader_id"]), None)
        elif t == "tx_prepare":
            node.prepared.add(ev["tx_id"])
        elif t == "tx_end":
            node.holds.pop(("tx", ev["tx_id"]), None)
            node.prepared.discard(ev["tx_id"])
        elif t == "heartbeat":
            node.mvcc_now = ev["mvcc_now"]
            if "groups" in ev:
                node.groups = {g["group"]: g.get("published_min_tx_time") for g in ev["groups"]}
        elif t == "snapshot":
            self._snapshot(node, ev)

    def _snapshot(self, node: _Node, ev: dict[str, Any]) -> None:
        """The node's complete set replaces its holds (a hold kept with its ts stays the same hold)."""
        node.unsure = False  # its complete set again
        old = node.holds
        node.holds = {}
        for kind, items, id_key, ts_key in (("reader", ev["readers"], "reader_id", "read_ts"),
                                            ("tx", ev["txs"], "tx_id", "begin_ts")):
            for item in items:
                key = (kind, item[id_key])
                kept = old.get(key)
                if kept is not None and kept.ts == item[ts_key]:
                    node.holds[key] = kept
                else:
                    self._open(node, key, item[ts_key], item.get("namespace"))
                if kind == "tx" and item.get("prepared"):
                    node.prepared.add(item[id_key])

    def _open(self, node: _Node, key: tuple[str, str], ts: int, namespace: str | None) -> None:
        bound = None if self.last is None else self.bound_of(self.last, namespace)
        node.holds[key] = _Hold(ts, namespace if isinstance(namespace, str) else None,
                                bound is not None and ts < bound)


class Auditor:
    """The model and the checks; ``event`` and ``directive`` take the topics' messages in any
    interleaving (a directive waits until the events read reach its positions)."""

    def __init__(self, max_pending: int = MAX_PENDING, control_on_events_topic: Callable[[str], bool] | None = None,
                 signed: Callable[[dict[str, Any], int | None], bool] | None = None) -> None:
        self.clusters: dict[str, _Cluster] = {}
        self.read_to: dict[int, int] = {}
        """Routed partition (``core/origin.py``: the control topic's are negative) -> the offset after
        the last message read."""
        self.control_on_events_topic = control_on_events_topic or (lambda _cluster: False)
        """Whether a cluster's policy takes control events on the events topic (else the job refuses them)."""
        self.signed = signed or (lambda _event, _broker_ms: True)
        """Whether an event carries the signature its cluster's keys require (``signatures``): the job
        refuses one that does not, so it holds nothing."""
        self.max_pending = max_pending
        self.violations: list[Violation] = []
        self.checked = 0
        self.holds_checked = 0
        self.excused = 0
        self.unverified = 0
        self.duplicates = 0
        self.unsure_holds = 0
        """Holds not checked because events of them may have been lost before the auditor read them."""

    def _cluster(self, name: str) -> _Cluster:
        c = self.clusters.get(name)
        if c is None:
            c = self.clusters[name] = _Cluster(name)
        return c

    # -- input -------------------------------------------------------------------------------
    def event(self, partition: int, offset: int, value: bytes | str | None, broker_ms: int | None = None,
              control: bool = False) -> list[Violation]:
        """One message of the events topic (``control``: of the control topic) with its record's
        broker time where the topic is stamped by the broker. Bad ones, and misrouted ones, are
        skipped: the job dead-letters them."""
        if control:
            partition = control_partition(partition)
        before = self.read_to.get(partition)
        if before is not None and offset > before:  # offsets skipped: records deleted before they were read
            for c in self.clusters.values():
                if partition in c.queue:
                    c.queue[partition].append((offset - 1, None, None))
        self.read_to[partition] = max(self.read_to.get(partition, 0), offset + 1)
        ev, _why = validate_event(value)
        if ev is not None and (ev["type"] in CONTROL_TYPES) != control and (
                control or not self.control_on_events_topic(ev.get("cluster", "default"))):
            ev = None  # misrouted (core/origin.py): the job applies none of it
        if ev is not None and not self.signed(ev, broker_ms):
            ev = None  # refused by the job (core/signing.py)
        if ev is not None:
            c = self._cluster(ev.get("cluster", "default"))
            q = c.queue.setdefault(partition, deque())
            q.append((offset, ev, broker_ms))
            if len(q) > self.max_pending:  # no directive reached them: apply the oldest, state runs ahead
                off, old, stamp = q.popleft()
                c.apply(old, stamp, partition)
                c.applied_to[partition] = off + 1
        return self._ready()

    def directive(self, value: bytes | str | None) -> list[Violation]:
        """One message of the directives topic (only compaction directives are checked)."""
        if value is None:
            return []
        try:
            d = json.loads(value)
        except ValueError:
            return []
        if not isinstance(d, dict) or d.get("type") != "compaction" or not isinstance(d.get("cluster"), str):
            return []
        self._cluster(d["cluster"]).waiting.append(d)
        return self._ready()

    def _ready(self) -> list[Violation]:
        found: list[Violation] = []
        for c in self.clusters.values():
            while c.waiting and self._reached(c.waiting[0]):
                found += self._check(c, c.waiting.popleft())
        self.violations += found
        return found

    def _reached(self, d: dict[str, Any]) -> bool:
        positions = d.get("positions")
        if not isinstance(positions, dict):
            return True  # an older job's directive: checked for its order only
        return all(self.read_to.get(routed_of(p), 0) >= o for p, o in positions.items())

    # -- checks ------------------------------------------------------------------------------
    def _check(self, c: _Cluster, d: dict[str, Any]) -> list[Violation]:
        last = c.last
        if last is not None and d["seq"] <= last["seq"]:
            self.duplicates += 1
            return []  # the sink is at-least-once: a batch sent again
        found = self._order(c, d, last)
        positions = d.get("positions")
        if isinstance(positions, dict):
            ahead = False
            for part, offset in positions.items():
                p = routed_of(part)
                if c.applied_to.get(p, 0) > offset:
                    ahead = True  # forced past it: this directive cannot be checked exactly
                q = c.queue.get(p)
                while q and q[0][0] < offset:
                    off, ev, stamp = q.popleft()
                    c.apply(ev, stamp, p)
                    c.applied_to[p] = off + 1
            if ahead:
                self.unverified += 1
            else:
                found += self._holds(c, d, last)
        c.last = d
        self.checked += 1
        return found

    def _order(self, c: _Cluster, d: dict[str, Any], last: dict[str, Any] | None) -> list[Violation]:
        if last is None:
            return []
        found = []

        def bad(what: str, detail: str, ts: int | None = None, bound: int | None = None) -> None:
            found.append(Violation(c.name, d["seq"], None, what, ts, bound, f"directive seq {d['seq']}: {detail}"))

        if d["seq"] != last["seq"] + 1:
            bad("seq", f"seq jumps from {last['seq']} to {d['seq']}")
        if d["safe_ts"] < last["safe_ts"]:
            bad("safe_ts", f"safe_ts went back from {last['safe_ts']} to {d['safe_ts']}", d["safe_ts"], last["safe_ts"])
        floor, old_floor = d.get("catalog_floor"), last.get("catalog_floor")
        if old_floor is not None and (floor is None or floor < old_floor):
            bad("catalog_floor", f"catalog_floor went back from {old_floor} to {floor}", floor, old_floor)
        before = last.get("namespaces") or {}
        if isinstance(last.get("namespace_safe_ts"), int) or before:
            for ns in sorted({*before, *(d.get("namespaces") or {})}):
                old, new = c.bound_of(last, ns), c.bound_of(d, ns)
                if new < old:
                    bad(f"namespace {ns}", f"namespace {ns}'s bound went back from {old} to {new}", new, old)
        return found

    def _holds(self, c: _Cluster, d: dict[str, Any], last: dict[str, Any] | None) -> list[Violation]:
        found = []
        retention = d.get("retention")
        pins_all = c.bound_of(d, None)
        prev_all = None if last is None else c.bound_of(last, None)
        where = f"directive seq {d['seq']} (safe_ts {d['safe_ts']}) of cluster {c.name}"
        members = sorted(c.topology if c.topology is not None else c.nodes)
        for name in members:
            node = c.nodes.get(name)
            if node is None:
                continue
            floors: list[tuple[str, int]] = []
            if node.mvcc_now is not None and isinstance(retention, int):
                floors.append(("retention", max(node.mvcc_now - retention, INT64_MIN)))
            floors += [(f"group {g}", ts) for g, ts in sorted(node.groups.items()) if ts is not None]
            for what, ts in floors:
                self.holds_checked += 1
                if ts >= pins_all:
                    continue
                if prev_all is not None and ts < prev_all:
                    self.excused += 1  # the node's clock or group went back below a bound already sent
                    continue
                found.append(Violation(c.name, d["seq"], name, what.replace(" ", ":"), ts, pins_all,
                                       f"{where} passed node {name}'s {what} bound {ts}"))
            if node.unsure:
                self.unsure_holds += len(node.holds)
                continue
            for (kind, hid), hold in sorted(node.holds.items()):
                self.holds_checked += 1
                bound = c.bound_of(d, hold.namespace)
                if hold.ts >= bound:
                    continue
                if hold.late:
                    self.excused += 1
                    continue
                prepared = " (prepared)" if kind == "tx" and hid in node.prepared else ""
                ns = f" in namespace {hold.namespace}" if hold.namespace is not None else ""
                found.append(Violation(c.name, d["seq"], name, f"{kind}:{hid}", hold.ts, bound,
                                       f"{where} passed live {kind} {hid}{prepared}{ns} of node {name} at ts "
                                       f"{hold.ts} (its bound {bound})"))
        now = d.get("cluster_wall_ms")
        for holder, (sts, _ttl, deadline) in sorted(c.service.items()):
            assert sts is not None
            if deadline is not None and isinstance(now, int) and now > deadline:
                continue  # its TTL ran out (on a cluster time never ahead of the job's)
            if holder in c.unsure:
                self.unsure_holds += 1
                continue
            self.holds_checked += 1
            if sts < pins_all:
                found.append(Violation(c.name, d["seq"], None, f"service:{holder}", sts, pins_all,
                                       f"{where} passed service hold {holder} at ts {sts}"))
        return found

    def summary(self) -> str:
        return (f"audit: {self.checked} directives checked ({self.unverified} unverified, {self.duplicates} repeated), "
                f"{self.holds_checked} holds checked, {self.excused} excused (late holds the job alerts), "
                f"{self.unsure_holds} not checked after events lost before the auditor read them, "
                f"{len(self.violations)} violation(s)")


def signatures(policies: Policies) -> Callable[[dict[str, Any], int | None], bool]:
    """Whether an event is signed as its cluster's policy requires (``core/signing.py``: control
    events with ``control_keys``, node events with ``node_key_secret``), as the job checks it."""
    def signed(event: dict[str, Any], broker_ms: int | None) -> bool:
        policy = policies.of(event.get("cluster", "default"))
        if event["type"] in CONTROL_TYPES:
            keys = policy.signing_keys
            log = broker_ms if broker_ms is not None else event["wall_ms"]
            return not keys or verify(event, keys, log, policy.control_signature_window_ms) is None
        if "node" in event and policy.node_key_secret:
            return verify_node(event, policy.node_key_secret) is None
        return True

    return signed


def follow_and_audit(settings: Any, *, until_idle_s: float | None = None, from_beginning: bool = True,
                     alerts: bool = True, out: Any = sys.stdout, stop: Any = None) -> Auditor:
    """Follow the events and directives topics and audit every directive: until both topics were
    quiet ``until_idle_s`` (None: until Ctrl-C, or, once ``stop`` (a ``threading.Event``) is set,
    until they are quiet for two seconds). Violations are printed and published as alerts."""
    from safepoint.connectors.kafka.follow import TopicFollower
    from safepoint.connectors.kafka.producer import make_producer, producer_conf

    conf = settings.librdkafka()
    policies = settings.policies()
    auditor = Auditor(control_on_events_topic=lambda c: policies.of(c).control_on_events_topic,
                      signed=signatures(policies))
    # a growing topic is read in rounds of idle_s (connectors/kafka/idle.py): the auditor needs no
    # quarter-second latency, and a round costs an end-offset request per partition
    follower = TopicFollower(conf, [settings.events_topic, settings.control_topic, settings.directives_topic],
                             "beginning" if from_beginning else "end", idle_s=1.0, client_id="safepoint-audit")
    producer = make_producer("confluent", producer_conf(conf, linger_ms=5)) if alerts else None
    quiet_since = time.monotonic()
    last_line = time.monotonic()

    def done() -> bool:
        quiet = time.monotonic() - quiet_since
        if stop is not None and stop.is_set():
            return quiet >= 2.0
        return until_idle_s is not None and quiet >= until_idle_s

    try:
        while not done():
            msgs = follower.poll(0.5)
            if msgs:
                quiet_since = time.monotonic()
            for m in msgs:
                if m.topic() in (settings.events_topic, settings.control_topic):
                    kind, stamp = m.timestamp()
                    found = auditor.event(m.partition(), m.offset(), m.value(),
                                          stamp if kind == TIMESTAMP_LOG_APPEND_TIME else None,
                                          control=m.topic() == settings.control_topic)
                else:
                    found = auditor.directive(m.value())
                for v in found:
                    print(f"audit: VIOLATION {v.cluster}: {v.detail}", file=out, flush=True)
                    if producer is not None:
                        value = v.alert(int(time.time() * 1000))
                        producer.produce(settings.alerts_topic, key=v.cluster, value=json.dumps(value))
            if producer is not None:
                producer.poll(0)
            if stop is None and time.monotonic() - last_line > 30:
                last_line = time.monotonic()
                print(auditor.summary(), file=out, flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        if follower.error:  # a topic not made yet (the job makes them) leaves every topic unread
            print(f"audit: warning: {follower.error}: nothing was read", file=sys.stderr, flush=True)
        follower.close()
        if producer is not None:
            producer.flush(10)
    return auditor


def run_audit(settings: Any, *, until_idle_s: float | None, from_beginning: bool = True, alerts: bool = True,
              out: Any = sys.stdout) -> int:
    """``safepoint audit``: follow and audit; the exit status is 1 when a violation was found."""
    from safepoint.connectors.kafka.topics import check_reachable

    check_reachable(settings.librdkafka())
    auditor = follow_and_audit(settings, until_idle_s=until_idle_s, from_beginning=from_beginning, alerts=alerts,
                               out=out)
    print(auditor.summary(), file=out, flush=True)
    return 1 if auditor.violations else 0
