"""Hypothesis properties of the core over generated event logs (docs/contributing.md, rule 9).

A generated log comes from a small simulated cluster: several nodes opening and closing readers
and transactions, preparing some, heartbeating with advancing ``mvcc_now`` and ``wall_ms``,
restarting (incarnation bumps), replaying old events (duplicates, older seqs, stale
incarnations), publishing topologies now and then, and a few cluster events and bad messages.

The properties:

a. monotonic: per cluster, directive ``safe_ts`` never decreases and ``seq`` grows by exactly one
   (CONTRACT Semantics "Safe point"; Directives "seq grows by one").
b. safety: when a directive is emitted, its ``safe_ts`` is <= every hold live at that point of the
   log on a node of the current membership, except holds that were already below the then-current
   ``safe_ts`` when they arrived, and each of those raised a horizon_violation alert at once
   (CONTRACT Semantics "Global minimum", "Safe point", "Horizon violation"). A hold "arrives" in the
   global minimum when it opens on a member or when its node joins the membership (a topology
   change), whichever is later: a non-member's holds do not count, so safe_ts may pass them before
   the node joins. Every horizon_violation alert names a hold that is live and below safe_ts (no
   false alarms). Live holds come from ``HoldModel``, an independent model of the contract's node
   rules; it never reads the engine.
c. batch-split invariance: serialising every state object through JSON at arbitrary points and
   continuing with a fresh ``Engine`` gives exactly the outputs of one uninterrupted run
   (CONTRACT Principle: "whatever the micro-batch boundaries").
d. liveness: once every hold closes and every node heartbeats, the safe point reaches
   min over member nodes of (mvcc_now - retention).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safepoint.core import ClusterState, Engine, NodeState, Output, Policy, Position
from safepoint.core.ids import escape
from safepoint.core.leases import LastWalls
from safepoint.core.node import STORED_FIELDS
from safepoint.replay import final_status
from safepoint.streaming.stored import bucket_entries, encode_bucket

from core_helpers import EVENTS_TOPIC, NodeClient, check_output, cluster_event, restore_engine

# SAFEPOINT_HYPOTHESIS_EXAMPLES=5000 for a deeper hunt; the default keeps the unit suite quick
EXAMPLES = int(os.environ.get("SAFEPOINT_HYPOTHESIS_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000_000
MVCC0 = 1_000_000
BIG = 10**15  # the settle phase's mvcc_now: above every timestamp a generated log can hold
GROUPS = ("g0", "g1")

# -- the generated log -------------------------------------------------------------------------


@dataclass
class SimNode:
    """A well-behaved node process: what it would send, in its own order."""

    name: str
    cluster: str | None
    idx: int
    incarnation: int = 0
    seq: int = -1
    mvcc: int = MVCC0
    readers: dict[str, int] = field(default_factory=dict)
    txs: dict[str, list[Any]] = field(default_factory=dict)  # id -> [begin_ts, prepared]
    counter: int = 0
    zombie: list[int] | None = None
    """[incarnation, seq] of the previous process, which still speaks after its restart (the ``zombie`` op)."""
    skew: int | None = None
    """How far the node's clock is off: its events carry the log's time (``log_ms``, the time the
    generator keeps) and its own ``wall_ms`` that far from it (None: no log time, ``wall_ms`` stands in)."""

    @property
    def groups(self) -> list[str]:
        return [GROUPS[self.idx % 2]]

    def event(self, type_: str, wall: int, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        ev = {"v": 1, "type": type_, "node": self.name, "incarnation": self.incarnation, "seq": self.seq, "wall_ms": wall}
        if self.skew is not None:
            ev["wall_ms"], ev["log_ms"] = wall + self.skew, wall
        if self.cluster is not None:
            ev["cluster"] = self.cluster
        ev.update(fields)
        return ev

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.name}-{self.incarnation}-{self.counter}"


OPS = (
    ["open"] * 4
    + ["close"] * 3
    + ["begin"] * 2
    + ["prepare"]
    + ["end"] * 2
    + ["hb"] * 8
    + ["restart", "dup", "dup", "snapshot", "topology", "tick", "catalog", "garbage", "zombie"]
)

op_strategy = st.tuples(
    st.sampled_from(OPS),
    st.integers(0, 7),  # which node
    st.integers(0, 400),  # a size: ts offset, mvcc advance, choice among open holds
    st.integers(0, 63),  # a choice: subset bits, flags
    st.sampled_from([0, 0, 1, 10, 100, 300]),  # wall-clock advance before the op (tick: past a lease)
)


@dataclass(frozen=True)
class Scenario:
    policy: Policy
    n_nodes: int
    clusters: tuple[str | None, ...]
    ops: tuple[tuple[str, int, int, int, int], ...]
    prelude: str | None = None
    skews: tuple[int, ...] | None = None
    """Each node's clock offset against the log's time (``SimNode.skew``), round robin; None: no log time."""


scenarios = st.builds(
    Scenario,
    policy=st.builds(
        Policy,
        retention=st.sampled_from([0, 0, 50, 300]),
        node_lease_ms=st.sampled_from([1_000, 5_000]),
        directive_interval_ms=st.sampled_from([0, 0, 0, 700]),
        # short clocks, so that the pressure's bands and in-doubt alerts fire within a log
        reader_age_warning_ms=st.sampled_from([600_000, 600_000, 250, 1_500]),
        in_doubt_timeout_ms=st.sampled_from([60_000, 60_000, 200]),
        # no grace: a restart drops the older process's holds in the step that moves them
        incarnation_grace_ms=st.sampled_from([5_000, 5_000, 0]),
    ),
    n_nodes=st.integers(1, 5),
    clusters=st.sampled_from([(None,), (None,), ("c1", "c2")]),
    ops=st.lists(op_strategy, min_size=20, max_size=120).map(tuple),
    prelude=st.sampled_from([None, "readers", "heartbeats", "topology", "topology"]),
    # a clock a minute behind, a day ahead, a little off: the log's time rules leases and TTLs; the
    # skew alert fires within a generated log (max_clock_skew_ms is 10 s by default)
    skews=st.sampled_from([None, None, (0,), (0, -60_000, 0, 86_400_000, -1_500), (-20, 15_000)]),
)


class LogBuilder:
    """Turns a scenario's ops into a log of message values, as a cluster would write them."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.now = T0
        self.nodes = [SimNode(f"n{i}", sc.clusters[i % len(sc.clusters)], i,
                              skew=None if sc.skews is None else sc.skews[i % len(sc.skews)]) for i in range(sc.n_nodes)]
        self.log: list[dict[str, Any] | str] = []
        self.sent: list[dict[str, Any]] = []
        self.versions: dict[tuple[str | None, str], int] = defaultdict(int)
        self.topology: dict[str | None, dict[str, list[str]]] = {}
        self.catalog_version = 0

    def emit(self, ev: dict[str, Any]) -> None:
        self.log.append(ev)
        self.sent.append(ev)

    def cluster_event(self, cluster: str | None, type_: str, **fields: Any) -> dict[str, Any]:
        self.versions[(cluster, type_)] += 1
        ev = {"v": 1, "type": type_, "version": self.versions[(cluster, type_)], "wall_ms": self.now, **fields}
        if cluster is not None:
            ev["cluster"] = cluster
        return ev

    def build(self) -> list[dict[str, Any] | str]:
        if self.sc.prelude == "readers":  # every node opens a reader before its first heartbeat
            for n in self.nodes:
                self.step("open", n, 0, 0)
        elif self.sc.prelude:  # every node introduces itself; a published topology, sometimes
            for n in self.nodes:
                groups = [{"group": g, "leader": True, "published_min_tx_time": n.mvcc} for g in n.groups]
                self.emit(n.event("heartbeat", self.now, mvcc_now=n.mvcc, groups=groups))
            if self.sc.prelude == "topology":
                for cluster in self.sc.clusters:
                    nodes = {m.name: m.groups for m in self.nodes if m.cluster == cluster}
                    self.topology[cluster] = nodes
                    self.emit(self.cluster_event(cluster, "topology", nodes=nodes))
        for kind, i, size, choice, dt in self.sc.ops:
            self.now += dt
            self.step(kind, self.nodes[i % len(self.nodes)], size, choice)
        return self.log

    def step(self, kind: str, n: SimNode, size: int, choice: int) -> None:  # noqa: C901 - one branch per op
        now = self.now
        if kind == "open":
            rid = n.new_id("r")
            n.readers[rid] = n.mvcc - size
            self.emit(n.event("reader_open", now, reader_id=rid, read_ts=n.readers[rid], label=f"job{choice % 3}"))
        elif kind == "close":
            rid = pick(sorted(n.readers), size) or "never-opened"
            n.readers.pop(rid, None)
            self.emit(n.event("reader_close", now, reader_id=rid))
        elif kind == "begin":
            tid = n.new_id("t")
            n.txs[tid] = [n.mvcc - size, False]
            self.emit(n.event("tx_begin", now, tx_id=tid, begin_ts=n.txs[tid][0]))
        elif kind == "prepare":
            tid = pick(sorted(t for t, (_, p) in n.txs.items() if not p), size)
            if tid is not None:
                n.txs[tid][1] = True
                self.emit(n.event("tx_prepare", now, tx_id=tid, coordinator=n.name, participants=[n.name]))
        elif kind == "end":
            tid = pick(sorted(n.txs), size)
            if tid is not None:
                del n.txs[tid]
                self.emit(n.event("tx_end", now, tx_id=tid, outcome="commit" if choice % 2 else "abort"))
        elif kind == "hb":
            n.mvcc += size
            fields: dict[str, Any] = {"mvcc_now": n.mvcc}
            if choice % 4 != 0:
                published = None if choice % 16 == 1 else n.mvcc - (choice % 8) * 10
                fields["groups"] = [{"group": g, "leader": choice % 2 == 1, "published_min_tx_time": published} for g in n.groups]
            self.emit(n.event("heartbeat", now, **fields))
        elif kind == "zombie":
            # the previous process still speaks after its restart: two live processes under one node id
            if n.incarnation > 0:
                if n.zombie is None or n.zombie[0] != n.incarnation - 1:
                    n.zombie = [n.incarnation - 1, 10_000]
                n.zombie[1] += 1
                ev = {"v": 1, "node": n.name, "incarnation": n.zombie[0], "seq": n.zombie[1], "wall_ms": now}
                if n.skew is not None:
                    ev["wall_ms"], ev["log_ms"] = now + n.skew, now
                if n.cluster is not None:
                    ev["cluster"] = n.cluster
                if choice % 3 == 0:
                    ev.update(type="reader_open", reader_id=f"z{size % 3}", read_ts=n.mvcc - size)
                elif choice % 3 == 1:
                    ev.update(type="reader_close", reader_id=f"z{size % 3}")
                else:
                    ev.update(type="heartbeat", mvcc_now=n.mvcc)
                self.emit(ev)
        elif kind == "restart":
            # the process died: its readers and unprepared transactions died with it
            n.incarnation += 1 + (choice % 8 == 0)
            n.seq = -1
            n.readers.clear()
            n.txs = {t: h for t, h in n.txs.items() if h[1]}
            n.mvcc += size
            self.emit(n.event("heartbeat", now, mvcc_now=n.mvcc, groups=[{"group": g} for g in n.groups]))
        elif kind == "dup":
            if self.sent:
                self.log.append(self.sent[-1 - (size % len(self.sent))])
        elif kind == "snapshot":
            readers = [{"reader_id": r, "read_ts": ts} for r, ts in sorted(n.readers.items())]
            txs = [{"tx_id": t, "begin_ts": ts, "prepared": p} for t, (ts, p) in sorted(n.txs.items())]
            self.emit(n.event("snapshot", now, cut=n.mvcc, readers=readers, txs=txs))
        elif kind == "topology":
            cluster = n.cluster
            same = [m for m in self.nodes if m.cluster == cluster]
            members = [m for m in same if choice & (1 << (m.idx // len(self.sc.clusters)) % 6)] or [n]
            nodes = {m.name: (m.groups if size % 3 == 0 else []) for m in members}
            if size % 7 == 0:
                nodes[f"ghost-{cluster}"] = []  # named by the topology, never reports
            self.topology[cluster] = nodes
            self.emit(self.cluster_event(cluster, "topology", nodes=nodes))
        elif kind == "tick":
            self.now += self.sc.policy.node_lease_ms + size
        elif kind == "catalog":
            if choice % 3 == 0:
                self.catalog_version += 1
                ev = self.cluster_event(n.cluster, "catalog", catalog_version=self.catalog_version, activated_at=n.mvcc - size)
            else:
                state = "started" if choice % 3 == 1 else "finished"
                ev = self.cluster_event(
                    n.cluster, "index_build", index=f"i{size % 2}", catalog_version=self.catalog_version, state=state
                )
            self.emit(ev)
        elif kind == "garbage":
            self.log.append(["not json {", '{"v": 1, "type": "heartbeat"}', "[]", '{"v": 2}'][choice % 4])

    def settle(self) -> list[dict[str, Any]]:
        """Close every hold, then every node (and every node a topology names) heartbeats twice."""
        events: list[dict[str, Any]] = []
        for n in self.nodes:
            for rid in sorted(n.readers):
                events.append(n.event("reader_close", self.now, reader_id=rid))
            for tid in sorted(n.txs):
                events.append(n.event("tx_end", self.now, tx_id=tid, outcome="abort"))
            n.readers.clear()
            n.txs.clear()
        ghosts = {(cluster, name) for cluster, topo in self.topology.items() for name in topo if name.startswith("ghost")}
        sims = self.nodes + [SimNode(name, cluster, 0) for cluster, name in sorted(ghosts, key=str)]
        wall = (self.now + 2 * self.sc.policy.node_lease_ms + self.sc.policy.directive_interval_ms
                + self.sc.policy.incarnation_grace_ms + 1)
        for k, n in enumerate(sims):
            n.mvcc = BIG + 1_000 * (k + 1) + n.idx
        for rnd in range(2):
            for n in sims:
                required = self.topology.get(n.cluster, {}).get(n.name, [])
                groups = [{"group": g, "leader": True, "published_min_tx_time": n.mvcc} for g in sorted(set(required))]
                later = rnd * (self.sc.policy.node_lease_ms + self.sc.policy.directive_interval_ms)  # past any discovery window
                events.append(n.event("heartbeat", wall + later, mvcc_now=n.mvcc, groups=groups))
        return events


def pick(items: list[str], size: int) -> str | None:
    return items[size % len(items)] if items else None


def encode(msg: dict[str, Any] | str) -> str:
    return msg if isinstance(msg, str) else json.dumps(msg)


def run_engine(policy: Policy, log: list[dict[str, Any] | str], full: bool = False) -> list[list[Output]]:
    """One run: the outputs of each message, in order, schema-checked. ``full``: every state is read
    back from its stored form before each message (``restore_engine``), so every message takes the
    full path: a restored cluster has no settled round (no shortcut: ``take_quiet``, the settled
    round) and syncs its abort alerts by walking every member, and a restored node has no walk to
    reuse (``NodeState._update``) -- what the shortcuts must equal, with no flag in the core."""
    engine = Engine(policy)
    per_message = []
    for offset, msg in enumerate(log):
        if full:
            restore_engine(engine)
        outs = engine.process(encode(msg), Position(EVENTS_TOPIC, 0, offset, None))
        for out in outs:
            check_output(out)
        per_message.append(outs)
    return per_message


# -- the independent model of holds -------------------------------------------------------------


@dataclass
class ModelNode:
    incarnation: int = -1
    seq: int = -1
    holds: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (kind, id) -> [ts, prepared, excluded, inc]
    others: dict[int, list[Any]] = field(default_factory=dict)  # inc -> [last seq, last log, spoke after, newer's first wall]
    gone: dict[int, list[Any]] = field(default_factory=dict)  # inc -> [last seq, newer's first wall], holds gone


class HoldModel:
    """The contract's node rules, written again as simply as possible, to say which holds are live."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.nodes: dict[tuple[str, str], ModelNode] = {}
        self.seen: dict[str, set[str]] = defaultdict(set)
        self.topology: dict[str, set[str]] = {}
        self.versions: dict[tuple[str, str], int] = {}
        self.safe: dict[str, int] = {}
        self.ignored = 0
        self.deadlettered = 0

    def members(self, cluster: str) -> set[str]:
        return self.topology[cluster] if cluster in self.topology else self.seen[cluster]

    def apply(self, msg: dict[str, Any] | str) -> list[tuple[str, str, str, str, int]]:
        """Apply one message; return the holds it opened below the then-current safe_ts."""
        if not isinstance(msg, dict) or msg.get("v") != 1 or "wall_ms" not in msg:
            self.deadlettered += 1
            return []
        cluster = msg.get("cluster", "default")
        if "node" not in msg:
            key = (cluster, msg["type"])
            if msg["version"] <= self.versions.get(key, -1):
                self.ignored += 1
            else:
                self.versions[key] = msg["version"]
                if msg["type"] == "topology":
                    before = self.members(cluster)
                    self.topology[cluster] = set(msg["nodes"])
                    self.join(cluster, self.topology[cluster] - before)
            return []
        node = self.nodes.setdefault((cluster, msg["node"]), ModelNode())
        older = self.process(node, msg)
        if older is None:
            self.ignored += 1
            return []
        inc = msg["incarnation"]
        self.seen[cluster].add(msg["node"])
        safe = self.safe.get(cluster)
        opened: list[tuple[str, int]] = []
        t = msg["type"]

        def key(kind: str, hid: str) -> tuple[str, str]:
            own = node.holds.get((kind, hid))
            if not older or ((kind, f"{hid}@{inc}") not in node.holds and own is not None and own[3] == inc):
                return (kind, hid)
            return (kind, f"{hid}@{inc}")

        if t in ("reader_open", "tx_begin"):
            kind, hid, ts = ("reader", msg["reader_id"], msg["read_ts"]) if t == "reader_open" else ("tx", msg["tx_id"], msg["begin_ts"])
            k = (kind, f"{hid}@{inc}") if older else (kind, hid)
            node.holds[k] = [ts, False, False, inc]
            opened.append((f"{k[0]}/{k[1]}", ts))
        elif t == "reader_close":
            node.holds.pop(key("reader", msg["reader_id"]), None)
        elif t == "tx_end":
            node.holds.pop(key("tx", msg["tx_id"]), None)
        elif t == "tx_prepare":
            if key("tx", msg["tx_id"]) in node.holds:
                node.holds[key("tx", msg["tx_id"])][1] = True
        elif t == "snapshot":
            def its(k: tuple[str, str], h: list[Any]) -> bool:
                theirs = h[3] != node.incarnation and k[1].endswith(f"@{h[3]}")
                return (theirs and h[3] == inc) if older else not theirs

            mine = {k: h for k, h in node.holds.items() if its(k, h)}
            new: dict[tuple[str, str], list[Any]] = {}
            for kind, items, id_key, ts_key in (
                ("reader", msg["readers"], "reader_id", "read_ts"),
                ("tx", msg["txs"], "tx_id", "begin_ts"),
            ):
                for item in items:
                    k = (kind, f"{item[id_key]}@{inc}" if older else item[id_key])
                    old = mine.get(k)
                    if old is not None and old[0] == item[ts_key]:
                        new[k] = [old[0], item.get("prepared", old[1]), old[2], old[3]]
                    else:
                        new[k] = [item[ts_key], item.get("prepared", False), False, inc]
                        opened.append((f"{k[0]}/{k[1]}", item[ts_key]))
            node.holds = {**new, **{k: h for k, h in node.holds.items() if k not in mine}}
        self.silent(node, msg.get("log_ms", msg["wall_ms"]))
        below = []
        for hold, ts in opened:
            if safe is not None and ts < safe:
                kind, hid = hold.split("/", 1)
                node.holds[(kind, hid)][2] = True  # excluded: it arrived below the safe point
                below.append((cluster, msg["node"], kind, hid, ts))
        return below

    def process(self, node: ModelNode, msg: dict[str, Any]) -> bool | None:
        """None: a stale or repeated message; True: an older incarnation's next one (a second live
        process); False: the newest process's (a newer incarnation keeps the old one's holds, renamed
        ``id@incarnation``, until it is silent for the grace)."""
        inc, seq, log = msg["incarnation"], msg["seq"], msg.get("log_ms", msg["wall_ms"])
        if inc < node.incarnation:
            entry = node.others.get(inc)
            last, since = (entry[0], entry[3]) if entry is not None else node.gone.get(inc, (None, None))
            if last is None or seq <= last:
                return None
            if since is not None and msg["wall_ms"] <= since:  # sent before the newer process started
                if entry is None:
                    return None
                entry[0] = seq
                return True
            if entry is None:
                entry = node.others[inc] = [seq, log, True, since]
                del node.gone[inc]
            entry[0], entry[1], entry[2] = seq, max(entry[1], log), True
            if node.incarnation not in node.others and node.incarnation not in node.gone:
                node.others[node.incarnation] = [node.seq, log, True, None]
            return True
        if inc == node.incarnation and seq <= node.seq:
            return None
        if inc > node.incarnation:
            if node.incarnation >= 0:
                old = node.incarnation
                node.others[old] = [node.seq, log, False, msg["wall_ms"]]
                safe = self.safe.get(msg.get("cluster", "default"))
                for k in [k for k, h in node.holds.items() if h[3] == old and not h[1]]:
                    hold = node.holds[(k[0], f"{k[1]}@{old}")] = node.holds.pop(k)
                    if safe is not None and hold[0] < safe:
                        hold[2] = True  # renamed, it arrives again below the safe point: alerted so
            node.incarnation = inc
        elif inc in node.gone and inc not in node.others:
            node.others[inc] = [seq, log, True, node.gone.pop(inc)[1]]
        node.seq = seq
        if inc in node.others:
            node.others[inc][0] = seq
            node.others[inc][1] = max(node.others[inc][1], log)
        return False

    def silent(self, node: ModelNode, log: int) -> None:
        """An incarnation silent for the grace after being superseded, or a lease as a second live
        process, loses its readers and unprepared transactions (the four newest others are kept)."""
        due = [inc for inc, (_s, last, spoke, _since) in node.others.items()
               if not (inc == node.incarnation and not spoke)
               and log - last >= (self.policy.node_lease_ms if spoke else self.policy.incarnation_grace_ms)]
        alive = sorted(k for k in node.others if k != node.incarnation and k not in due)
        for inc in sorted(set(due) | set(alive[:max(0, len(alive) - 4)])):
            for k in [k for k, h in node.holds.items() if h[3] == inc]:
                if not node.holds[k][1]:
                    del node.holds[k]
                elif inc != node.incarnation and k[1].endswith(f"@{inc}") and (k[0], k[1][: -len(f"@{inc}")]) not in node.holds:
                    node.holds[(k[0], k[1][: -len(f"@{inc}")])] = node.holds.pop(k)
            dropped = node.others.pop(inc)
            node.gone[inc] = [dropped[0], dropped[3]]
            for old in sorted(node.gone)[:max(0, len(node.gone) - 4)]:
                del node.gone[old]
        if set(node.others) <= {node.incarnation}:
            node.others.clear()

    def join(self, cluster: str, joined: set[str]) -> None:
        """Nodes that join the membership bring holds that did not count until now: those already
        below safe_ts cannot be protected any more (CONTRACT Horizon violation: alerted, never lowering it)."""
        safe = self.safe.get(cluster)
        for name in joined:
            node = self.nodes.get((cluster, name))
            if node is not None and safe is not None:
                for h in node.holds.values():
                    if h[0] < safe:
                        h[2] = True

    def hold(self, cluster: str, node: str, kind: str, hid: str) -> list[Any] | None:
        model_node = self.nodes.get((cluster, node))
        return None if model_node is None else model_node.holds.get((kind, hid))

    def live_holds(self, cluster: str) -> list[tuple[str, str, str, int]]:
        return [
            (name, kind, hid, h[0])
            for (c, name), node in self.nodes.items()
            if c == cluster and name in self.members(cluster)
            for (kind, hid), h in node.holds.items()
            if not h[2]
        ]


# -- the properties ------------------------------------------------------------------------------


def directives_of(outs: list[Output]) -> list[dict[str, Any]]:
    return [o.value for o in outs if o.channel == "directives" and o.value["type"] == "compaction"]


@SETTINGS
@given(scenarios)
def test_a_safe_ts_monotonic_and_seq_by_one(sc: Scenario) -> None:
    """Property a: CONTRACT Semantics "Safe point ... never goes backwards"; Directives "seq grows by one"."""
    builder = LogBuilder(sc)
    log = builder.build() + builder.settle()
    last: dict[str, tuple[int, int, int | None]] = {}
    for outs in run_engine(sc.policy, log):
        for d in directives_of(outs):
            prev_seq, prev_safe, prev_floor = last.get(d["cluster"], (0, d["safe_ts"], None))
            assert d["seq"] == prev_seq + 1
            assert d["safe_ts"] >= prev_safe
            if prev_floor is not None:
                assert d["catalog_floor"] is not None and d["catalog_floor"] >= prev_floor
            assert (d["seq"] == 1) or d["safe_ts"] > prev_safe or d["catalog_floor"] != prev_floor, "a directive means an advance"
            last[d["cluster"]] = (d["seq"], d["safe_ts"], d["catalog_floor"])


@SETTINGS
@given(scenarios)
def test_b_safe_ts_never_passes_a_live_hold(sc: Scenario) -> None:
    """Property b: CONTRACT Semantics "Global minimum", "Safe point" (inclusive bound), "Horizon violation"."""
    log = LogBuilder(sc).build()
    model = HoldModel(sc.policy)
    engine = Engine(sc.policy)
    for offset, msg in enumerate(log):
        outs = engine.process(encode(msg), Position(EVENTS_TOPIC, 0, offset, None))
        below = model.apply(msg)
        raised = [
            o.value
            for o in outs
            if o.channel == "alerts" and o.value["kind"] == "horizon_violation" and o.value["state"] == "raised"
        ]
        named = {(a["cluster"], a["node"], *a["id"].split("/", 4)[3:], a["value"]) for a in raised}
        assert set(below) <= named, "a hold that arrives below safe_ts is alerted at once"
        for a in raised:
            cluster, node, kind, hid = a["cluster"], a["node"], *a["id"].split("/", 4)[3:]
            if kind in ("retention", "group"):  # the node's own floor went below the safe point
                assert node in model.members(cluster) and a["value"] < a["threshold"] == model.safe[cluster]
                continue
            h = model.hold(cluster, node, kind, hid)
            assert h is not None and h[2], f"alert {a['id']} names a hold that is live and below safe_ts"
            assert a["value"] == h[0] < a["threshold"] == model.safe[cluster]
        for d in directives_of(outs):
            for node, kind, hid, ts in model.live_holds(d["cluster"]):
                assert d["safe_ts"] <= ts, f"directive {d['seq']} passes live {kind} {hid} at {ts} on {node}"
            model.safe[d["cluster"]] = d["safe_ts"]
    ignored = sum(v for k, v in engine.counts.items() if k.startswith("ignored:"))
    assert ignored == model.ignored, "CONTRACT: duplicates and stale events are ignored and counted"
    assert engine.counts["deadlettered"] == model.deadlettered
    assert sum(engine.counts.values()) == len(log), "CONTRACT Dead letters: nothing is silently lost"


@SETTINGS
@given(scenarios, st.one_of(st.none(), st.sets(st.integers(0, 200), max_size=10)))
def test_c_batch_split_invariance(sc: Scenario, splits: set[int] | None) -> None:
    """Property c: CONTRACT Principle: the same events in the same order give the same directives
    and alerts whatever the micro-batch boundaries (state restored from JSON at each boundary;
    ``None``: a boundary before every message, the job's worst case of one-message batches)."""
    builder = LogBuilder(sc)
    log = builder.build() + builder.settle()
    whole = [out for outs in run_engine(sc.policy, log) for out in outs]

    split_out: list[Output] = []
    engine = Engine(sc.policy)
    for offset, msg in enumerate(log):
        if splits is None or offset in splits:
            nodes = {k: NodeState.from_json(json.loads(json.dumps(s.to_json()))) for k, s in engine.nodes.items()}
            clusters = {k: ClusterState.from_json(json.loads(json.dumps(s.to_json()))) for k, s in engine.clusters.items()}
            engine = Engine(sc.policy)
            engine.nodes, engine.clusters = nodes, clusters
        split_out.extend(engine.process(encode(msg), Position(EVENTS_TOPIC, 0, offset, None)))
    assert split_out == whole


@SETTINGS
@given(scenarios)
def test_d_liveness_when_holds_close_and_nodes_heartbeat(sc: Scenario) -> None:
    """Property d: once every hold closes and every node heartbeats with fresh wall_ms and advancing
    mvcc_now, safe_ts reaches min over the members of (mvcc_now - retention) (CONTRACT Semantics
    "Node minimum": a node with no reader and no transaction holds at mvcc_now - retention)."""
    builder = LogBuilder(sc)
    log = builder.build()
    settle = builder.settle()
    per_message = run_engine(sc.policy, log + settle)
    final: dict[str, int] = {}
    for outs in per_message:
        for d in directives_of(outs):
            final[d["cluster"]] = d["safe_ts"]
    expected: dict[str, int] = defaultdict(lambda: BIG * 2)
    members: dict[str, set[str]] = {}
    for cluster, topo in builder.topology.items():
        members[cluster or "default"] = set(topo)
    mvcc = {(ev.get("cluster", "default"), ev["node"]): ev["mvcc_now"] for ev in settle if ev["type"] == "heartbeat"}
    for (cluster, node), now in mvcc.items():
        if cluster not in members or node in members[cluster]:
            expected[cluster] = min(expected[cluster], now - sc.policy.retention)
    assert final == dict(expected)


def _indexes(state: ClusterState) -> tuple[Any, ...]:
    return (state.members.indexes(), sorted(state.members.leaderless), sorted(state.members.ns_nodes),
            dict(sorted(state.alerts.floor.items())))


@SETTINGS
@given(scenarios)
def test_e_incremental_indexes_equal_a_rebuild(sc: Scenario) -> None:
    """The cluster stage updates its derived indexes (minimums, last walls, unknown minimums,
    missing groups) incrementally on every node update; after every message they must equal
    what ``Members.rebuild`` derives from the persisted fields alone (what a restore from state gives)."""
    builder = LogBuilder(sc)
    log = builder.build() + builder.settle()
    engine = Engine(sc.policy)
    for offset, msg in enumerate(log):
        engine.process(encode(msg), Position(EVENTS_TOPIC, 0, offset, None))
        for state in engine.clusters.values():
            rebuilt = ClusterState.from_json(json.loads(json.dumps(state.to_json())))
            assert _indexes(state) == _indexes(rebuilt), f"after message {offset}"


@SETTINGS
@given(scenarios)
def test_f_incremental_abort_alerts_equal_the_full_walk(sc: Scenario) -> None:
    """The round's abort alerts are synced from the members touched since the last event and the
    lease changes (core/aborts.py); the outputs must be exactly those of walking every member after
    every event (the full path of a state read back before each message: ``run_engine(full=True)``),
    alerts, their order and the directives alike."""
    builder = LogBuilder(sc)
    log = builder.build() + builder.settle()
    assert run_engine(sc.policy, log) == run_engine(sc.policy, log, full=True)


def run_with_status(policy: Policy, log: list[dict[str, Any] | str],
                    full: bool = False) -> tuple[list[list[Output]], dict[str, Any]]:
    """``run_engine``'s outputs (``full``: the full path of every message) and the final status."""
    engine = Engine(policy)
    outs = []
    for offset, msg in enumerate(log):
        if full:
            restore_engine(engine)
        outs.append(engine.process(encode(msg), Position(EVENTS_TOPIC, 0, offset, None)))
    return outs, final_status(engine)


def shortcut_equals_the_walk(policy: Policy, log: list[dict[str, Any] | str]) -> None:
    """With the node's shortcut (an event that cannot change its lowest holds reuses the last walk)
    the outputs and the final status (each node's minimum and blocker) are the walk's, exactly."""
    assert run_with_status(policy, log) == run_with_status(policy, log, full=True)


@SETTINGS
@given(scenarios)
def test_g_the_nodes_shortcut_equals_walking_its_holds(sc: Scenario) -> None:
    builder = LogBuilder(sc)
    shortcut_equals_the_walk(sc.policy, builder.build() + builder.settle())


def _positional(state: NodeState) -> list[Any]:
    """``to_json``'s fields by position (``STORED_FIELDS``), trailing absent ones left out: what the
    stored form is defined as."""
    data = state.to_json()
    stored = [data.get(f) for f in STORED_FIELDS]
    while stored[-1] is None:
        stored.pop()
    return stored


@SETTINGS
@given(scenarios)
def test_h_the_stored_form_is_to_json_by_position_and_restores_the_same_node(sc: Scenario) -> None:
    """The job writes every node a micro-batch touched in the compact stored form (``to_stored``,
    built directly) and reads it back with ``from_stored``: after every message, each node's stored
    form is ``to_json``'s fields by position, and a node read back through the state's own codec
    (a bucket's MessagePack) has the same ``to_json``."""
    builder = LogBuilder(sc)
    engine = Engine(sc.policy)
    for offset, msg in enumerate(builder.build() + builder.settle()):
        engine.process(encode(msg), Position(EVENTS_TOPIC, 0, offset, None))
        for (cluster, name), state in engine.nodes.items():
            assert state.to_stored() == _positional(state), f"{name} after message {offset}"
            stored = bucket_entries(encode_bucket([state], 4), 4)[name]
            assert isinstance(stored, list)
            restored = NodeState.from_stored(cluster, stored)
            assert restored.to_json() == state.to_json(), f"{name} after message {offset}"


@pytest.mark.parametrize("late", [0, 1])
@pytest.mark.parametrize("event", ["close", "open"])
def test_the_shortcut_ends_at_the_millisecond_the_oldest_hold_reaches_its_age_threshold(late: int, event: str) -> None:
    """The shortcut's pressure bound (``Pressure.still_until``) is exact: a reader or transaction
    event on a node whose oldest hold is one millisecond short of ``reader_age_warning_ms`` takes
    it and raises nothing; at the threshold itself the full path runs the age band, which raises
    the warning. Generated logs seldom land on that millisecond, so it is pinned here."""
    age = 5_000
    policy = Policy(reader_age_warning_ms=age, reader_age_critical_ms=4 * age)
    n1, n2 = NodeClient("n1"), NodeClient("n2")
    t0 = 1_700_000_000_000
    now = t0 + age - 1 + late
    log: list[dict[str, Any] | str] = [
        cluster_event("topology", 1, t0, nodes={"n1": [], "n2": []}),
        n1.hb(t0, 1_000), n2.hb(t0, 1_000),
        n1.open("low", 2_000, t0), n1.open("other", 3_000, t0),
        n2.hb(now, 1_000),  # cluster time moves on; the round settles there
        n1.close("other", now) if event == "close" else n1.open("new", 4_000, now),
    ]
    outs = run_engine(policy, log)
    assert outs == run_engine(policy, log, full=True)
    raised = [o.value["kind"] for o in outs[-1] if o.value.get("kind") == "reader_age"]
    assert raised == (["reader_age"] if late else [])


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 50), st.integers(0, 60)), max_size=200))
def test_lease_clock_lowest_and_older_than_equal_a_scan(steps: list[tuple[int, int, int]]) -> None:
    """``LastWalls`` (a heap whose entries may lag behind a member's time) answers ``lowest`` and
    ``older_than`` as a scan of every member's time does, times going up and, now and then, down."""
    walls, model = LastWalls(), {}
    for node, wall, limit in steps:
        walls.set(f"n{node}", wall)
        model[f"n{node}"] = wall
        assert walls.lowest() == min(model.values())
        assert walls.older_than(limit) == sorted((w, n) for n, w in model.items() if w < limit)


NODE_ALERT_KINDS = frozenset({"pinned_bytes", "reader_age", "in_doubt_tx", "forced_expiry", "pressure_forecast",
                              "clock_skew", "duplicate_node", "leaked_hold"})
"""Alerts a node's own parts keep (its pressure, clock, incarnations, leak watch: stored with the node)
and the cluster's book only stamps; their raises and clears must alternate all the same."""


@SETTINGS
@given(scenarios)
def test_i_the_alert_book_says_every_raise_and_clear_once(sc: Scenario) -> None:
    """The ``AlertBook``'s invariant (``core/alerts.py``), on random logs: after every message, each
    cluster's book holds exactly the cluster's alerts whose last message said ``raised`` (a node's own
    alerts, ``NODE_ALERT_KINDS``, live with the node); a ``cleared`` only follows a ``raised`` of its id,
    any kind (never twice); and each node's remembered floor violation is a raised ``horizon_violation``
    of that node. Nothing enters or leaves the book without the message that says so."""
    builder = LogBuilder(sc)
    engine = Engine(sc.policy)
    said: dict[str, dict[str, str]] = {}  # cluster -> alert id -> its last state
    for offset, msg in enumerate(builder.build() + builder.settle()):
        for out in engine.process(encode(msg), Position(EVENTS_TOPIC, 0, offset, None)):
            body = out.value
            if out.channel != "alerts" or "id" not in body:
                continue  # a node's band, age and in-doubt alerts are its pressure's (no id)
            last = said.setdefault(body["cluster"], {}).get(body["id"])
            if body["state"] == "cleared":
                assert last == "raised", f"{body['id']} cleared after {last} (message {offset})"
            said[body["cluster"]][body["id"]] = body["state"]
        for cluster, state in engine.clusters.items():
            raised = {aid for aid, st in said.get(cluster, {}).items() if st == "raised"}
            raised -= {aid for aid in raised if aid.split("/")[1] in NODE_ALERT_KINDS}
            book = {f"{escape(cluster)}/{aid}" for aid in state.alerts.raised}  # a message's id names its cluster
            assert book == raised, f"{cluster} after message {offset}"
            for node, aid in state.alerts.floor.items():
                assert aid in state.alerts.raised and state.alerts.raised[aid]["kind"] == "horizon_violation"
                assert state.alerts.raised[aid]["node"] == node
