"""One database cluster: its nodes' summaries, topology, catalog, and the safe point.

``engine.step`` hands each event of a cluster to its ``ClusterState``. It learns about nodes
only through ``NodeUpdate`` summaries and about the cluster through cluster events, and after
each one it re-evaluates the round: aborts (with alerts), the global minimum, the monotonic
safe point and the catalog floor, and emits a directive when either advances.

A ``ClusterState`` is made of owned parts, each with its own invariants and methods; this class
keeps the round's own figures and composes them:

========================  ======================================================================
``members``               the nodes' records, the topology and the round's indexes (``core/members.py``)
``catalog``               catalog versions, index builds, rebalances and the floor (``core/catalog.py``)
``alerts``                the raised alerts (``core/alerts.py``)
``control``               service holds, pause, action outcomes (``core/control.py``)
``tenants``               the namespaces' bounds (``core/tenants.py``)
``directives``            directive sequences and input positions (``core/directives.py``)
``recovery``              after a start on empty state or a gap: who still owes a snapshot (``core/recovery.py``)
``gaps``                  events lost from the log: what each gap means for the cluster (``core/gaps.py``)
``emergency``             critical nodes whose debt keeps growing, and the emergency (``core/emergency.py``)
========================  ======================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from safepoint.core.aborts import AbortSync, sync_aborts
from safepoint.core.alerts import (
    ABORT_KINDS,
    AlertBook,
    Bound,
    below_sent,
    check_floor,
    check_horizon,
    check_join,
    stall_alert,
    violation,
)
from safepoint.core.catalog import Catalog
from safepoint.core.clock import log_time
from safepoint.core.control import GAP_ACK, Control
from safepoint.core.directives import Directives
from safepoint.core.emergency import Emergency
from safepoint.core.event_records import ClusterEvent, Event, GapAck, NodeEvent
from safepoint.core.event_structs import TYPE_OF, HoldEvent, ReaderOpenStruct, TxBeginStruct
from safepoint.core.events import is_control_event, is_node_event
from safepoint.core.gaps import Gap, Gaps
from safepoint.core.holds import EVENTS, HoldKind
from safepoint.core.ids import join_id
from safepoint.core.members import Members
from safepoint.core.node import NodeState
from safepoint.core.origin import MISROUTED, is_control
from safepoint.core.outputs import DEADLETTER, Output
from safepoint.core.policy import Policy
from safepoint.core.records import Hold, NodeUpdate
from safepoint.core.recovery import ASK, COMPLETED, Recovery, StartPlan
from safepoint.core.signals import AlertChange, BandChange, DebtReport, ExpireOrder, Signal, SnapshotAsk
from safepoint.core.tenants import Tenants

__all__ = ["ClusterState", "IGNORED_STALE_VERSION", "ABORT_KINDS"]

IGNORED_STALE_VERSION = "stale_version"


MISROUTED_ID = "event_misrouted/-"

class ClusterState:
    """One cluster's state: the round's figures and its parts."""

    __slots__ = ("name", "members", "catalog", "alerts", "control", "tenants", "directives", "recovery", "emergency",
                 "gaps", "versions",
                 "cluster_time", "first_wall", "topology_wall", "safe_ts", "dirty", "last_advance_wall", "aborts",
                 "settled", "clears", "compacted")

    def __init__(self, name: str) -> None:
        self.name = name
        self.members = Members()
        self.catalog = Catalog()
        self.alerts = AlertBook(name)
        self.control = Control()
        self.tenants = Tenants()
        self.directives = Directives(name)
        self.recovery: Recovery | None = None
        self.emergency = Emergency()
        self.gaps = Gaps()
        self.versions: dict[str, int] = {}
        """Cluster event type -> the last version applied (an event at or below it is stale)."""
        self.cluster_time: int | None = None
        """The largest log time of the cluster's node events (``core/clock.py``): every lease, TTL and
        window runs on it."""
        self.first_wall: int | None = None
        self.topology_wall: int | None = None
        self.safe_ts: int | None = None
        self.dirty = False
        """Something the round reads changed since the last round that passed."""
        self.last_advance_wall: int | None = None
        self.aborts = AbortSync()
        """What the last abort sync saw (not stored: a restored state starts with a full walk)."""
        self.settled: int | None = None
        """The cluster time of the last ``evaluate``, which left the round settled there: evaluating
        again at that time with nothing changed emits nothing and changes nothing (not stored)."""
        self.clears = False
        """A round run again at ``settled`` would get past its gates (not aborted, not paused, the
        directive interval over) and so clear ``dirty`` (not stored)."""
        self.compacted: list[int] | None = None
        """[the highest ``compacted_ts`` a node's heartbeat reported, how many times it rose]: the
        store's own compaction (an etcd agent's), below which no service hold is taken."""

    @classmethod
    def starting(cls, name: str, plan: StartPlan | None = None) -> ClusterState:
        """A cluster met for the first time: fresh, or from its seed and recovering (``core/recovery.py``)."""
        state = cls(name)
        seed = plan.seed_of(name) if plan is not None else None
        if seed is not None:
            state.start_recovery(seed.safe_ts, seed.catalog_floor, seed.seq, seed.node_seq, seed.nodes)
            # a backup's hold outlives the checkpoint (its TTL still runs), and so does a pause
            state.control.seed(seed.service_holds, seed.paused, state.alerts)
            if seed.tenants:  # every namespace's bound keeps going forward only
                state.tenants = Tenants.from_json({"base": seed.tenants["base"], "bounds": seed.tenants["bounds"]})
        return state

    @property
    def catalog_floor(self) -> int | None:
        return self.catalog.floor

    @property
    def dseq(self) -> int:
        """The ``seq`` of the last compaction directive."""
        return self.directives.seq

    # -- persistence ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The stored form: the cluster's own fields and each part's (``to_stored``), one flat map."""
        return {
            "name": self.name,
            **self.members.to_stored(),
            "versions": self.versions,
            **self.catalog.to_stored(),
            "cluster_time": self.cluster_time,
            "first_wall": self.first_wall,
            "safe_ts": self.safe_ts,
            **self.directives.to_stored(),
            "dirty": self.dirty,
            "raised": self.alerts.raised,
            "topology_wall": self.topology_wall,
            "last_advance_wall": self.last_advance_wall,
            "recovery": None if self.recovery is None else self.recovery.to_json(),
            **({"control": self.control.to_json()} if self.control else {}),
            **({"tenants": self.tenants.to_json()} if self.tenants else {}),
            **({"emergency": self.emergency.to_json()} if self.emergency else {}),
            **({"gaps": self.gaps.to_json()} if self.gaps else {}),
            **({"compacted": self.compacted} if self.compacted is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterState:
        state = cls(data["name"])
        state.members = Members.from_stored(data)
        state.versions = data["versions"]
        state.catalog = Catalog.from_stored(data)
        state.cluster_time = data["cluster_time"]
        state.first_wall = data["first_wall"]
        state.safe_ts = data["safe_ts"]
        state.directives = Directives.from_stored(state.name, data)
        state.dirty = data["dirty"]
        state.alerts = AlertBook(state.name, data["raised"])
        state.topology_wall = data["topology_wall"]
        state.last_advance_wall = data.get("last_advance_wall")
        state.control = Control.from_json(data.get("control"))
        state.tenants = Tenants.from_json(data.get("tenants"))
        state.recovery = Recovery.from_json(data.get("recovery"))
        state.emergency = Emergency.from_json(data.get("emergency"))
        state.gaps = Gaps(data.get("gaps"))
        state.compacted = data.get("compacted")
        state._rebuild_recovery()
        return state

    def _rebuild_recovery(self) -> None:
        if self.recovery is not None:
            self.recovery.rebuild(self.members.names, self.members.topology is not None)

    # -- inputs -----------------------------------------------------------------------
    def _advance(self, wall: int) -> None:
        if self.cluster_time is None or wall > self.cluster_time:
            self.cluster_time = wall
        if self.first_wall is None:
            self.first_wall = wall
        if self.members.topology is not None and self.topology_wall is None:
            self.topology_wall = wall

    def apply_node_update(self, u: NodeUpdate, policy: Policy) -> list[Output]:
        """Take one node's summary after one of its applied events, then re-evaluate; what it emits."""
        out: list[Output] = []
        self._advance(u.log_ms)
        now = self.cluster_time
        assert now is not None
        self.aborts.touched.add(u.node)
        member, fresh, old_min = self.members.take(u)
        if fresh or u.changed:
            self.dirty = True
        if self.alerts or u.opened or member:
            out += self._violations(u, member, now)
        if u.signals:
            out += self._signals(u.node, u.signals, now, policy)
        if self.recovery is not None:
            step = self.recovery.take(u, member, now, policy.node_lease_ms, fresh, -1 if u.partition is None else u.partition)
            if step == ASK:
                reason = "recovery" if u.node not in self.recovery.cause else "events_lost"
                out.append(self.directives.snapshot_request(u.node, reason, now, policy))
            elif step == COMPLETED:
                self.dirty = True
                if self.gaps.open:
                    self.gaps.restated(u.node)
            if self.recovery.finished(now):
                self.recovery = None  # the gap's recovery is over: no node owes a snapshot
        elif not (fresh or u.signals) and self._settled_for(u.node, u.log_ms):
            if not u.changed:
                return out  # the round reads nothing that changed, at the time it was settled at (take_quiet says why)
            if member and self._above_lowest(u, old_min):
                self.dirty = not self.clears  # what the round would leave; it would find nothing else to do
                return out
        out += self.evaluate(policy)
        return out

    def _violations(self, u: NodeUpdate, member: bool, now: int) -> list[Output]:
        """The horizon violations one node update clears (holds it closed) and raises (holds it opened
        below a bound already sent; for a member, its lowest hold or its own floor below one)."""
        out: list[Output] = []
        book = self.alerts
        if book:
            for kind, hid in u.closed:
                cleared = self._clear_violation(u.node, kind, hid, now)
                if cleared is not None:
                    out.append(cleared)
        for kind, hid, ts, ns in u.opened:
            if below_sent(ts, self.safe_ts):
                assert self.safe_ts is not None
                out.append(violation(book, u.node, kind, hid, ts, (self.safe_ts, "safe_ts"), now))
            elif self.tenants:
                raised = self.tenants.check_violation(book, u.node, kind, hid, ts, ns, self.safe_ts, now)
                if raised is not None:
                    out.append(raised)
        if member:
            raised = check_horizon(book, self.members, u.node, self.safe_ts, now)
            if raised is not None:
                out.append(raised)
            limit = self.tenants.pins_all(self.safe_ts) if self.tenants else (
                None if self.safe_ts is None else (self.safe_ts, "safe_ts"))
            out += check_floor(book, u.node, u.floor, limit, now)
        return out

    def _clear_violation(self, node: str, kind: str, hid: str, now: int) -> Output | None:
        """A hold that closed clears its horizon violation, if one was raised: the message that says so."""
        return self.alerts.clear(join_id("horizon_violation", node, kind, hid), now)

    def _settled_for(self, node: str, log: int) -> bool:
        """The round was settled at the cluster time an event of ``node`` read at ``log`` leaves it at,
        and the abort sync holds nothing stale of the node: run again it would read from the node
        only its summary (``apply_node_update`` skips it when that did not change, and so does
        ``take_quiet``)."""
        now = self.cluster_time
        return now is not None and self.settled == now and log <= now and node not in self.aborts.stale

    def _above_lowest(self, u: NodeUpdate, old_min: int | None) -> bool:
        """A member's known minimum moved from ``old_min`` to another value, both strictly above the
        round's lowest, and nothing else the round reads changed (its groups, namespaces): at the
        settled time the round would find the same lowest member, safe point and abort problems,
        and emit nothing."""
        if (old_min is None or u.local_min is None or u.groups is not None or u.ns is not None
                or self.members.ns_nodes or self.tenants):
            return False
        lowest = self.members.lowest()
        return lowest is not None and old_min > lowest[0] and u.local_min > lowest[0]

    def take_quiet(self, node: NodeState, event: NodeEvent, policy: Policy,
                   partition: int | None = None) -> list[Output] | None:
        """The shortcut of the commonest events: a hold that opens above, or closes strictly above, its
        node's lowest hold, while nothing else moves. What it emits when it took the event
        (``NodeState.quiet`` applied it to the node: at most the clearing of a violation by the
        hold it closes); None: nothing changed, the full path takes it.

        Each condition is one that a step of ``apply_node_update`` begins with, so that it finds
        nothing to say: the round is settled at the event's time and nothing of the node is stale
        (``_settled_for``); no recovery, no namespaces and no topology waiting for its time (its
        recovery, violation and ``_advance`` steps); the node's record exists, holds nothing
        namespaced and keeps its partition (``Members.take`` would change no more than ``heard``
        does); for a member, no floor alert raised (``AlertBook.floor_of``) and its minimum not
        below ``safe_ts`` (``below_sent``, as ``check_horizon`` asks). ``test_properties`` checks it against the full path
        (the same log with every state read back from its stored form before each message: a
        restored cluster has no settled round, so it takes none of these shortcuts)."""
        shape = EVENTS.get(event["type"])
        if shape is None:
            return None
        what, opening = shape
        wall = event["wall_ms"]
        incarnation = event["incarnation"]
        hold = what.opened(event, wall, incarnation) if opening else None
        return self._take_quiet(node, event["type"], what, opening, wall, incarnation, event["seq"], what.id_of(event),
                                hold, log_time(event), policy, partition)

    def take_quiet_typed(self, node: NodeState, event: HoldEvent, policy: Policy, partition: int,
                         log: int) -> list[Output] | None:
        """``take_quiet`` of an event decoded as a struct (``core/event_structs.py``), at log time ``log``."""
        kind = TYPE_OF[type(event)]
        shape = EVENTS.get(kind)
        if shape is None:
            return None
        what, opening = shape
        hold = (what.opened_struct(event, event.incarnation) if isinstance(event, (ReaderOpenStruct, TxBeginStruct))
                else None)
        hid: str = getattr(event, what.id_field)
        return self._take_quiet(node, kind, what, opening, event.wall_ms, event.incarnation, event.seq, hid, hold, log,
                                policy, partition)

    def _take_quiet(self, node: NodeState, kind: str, what: HoldKind, opening: bool, wall: int, incarnation: int,
                    seq: int, hid: str, hold: Hold | None, log: int, policy: Policy,
                    partition: int | None) -> list[Output] | None:
        """``take_quiet`` of an event given by its fields (``NodeState.quiet``)."""
        name = node.node
        if (not self._settled_for(name, log) or self.recovery is not None
                or self.tenants.active or (self.members.topology is not None and self.topology_wall is None)):
            return None
        members = self.members
        rec = members.nodes.get(name)
        if rec is None or rec.ns is not None or rec.partition != partition:
            return None
        member = name in members.names
        safe = self.safe_ts
        if member and (self.alerts.floor_of(name) is not None or below_sent(rec.local_min, safe)):
            return None
        change = node.quiet(kind, what, opening, wall, incarnation, seq, hid, hold, policy, safe, member, log)
        if change is None:
            return None
        members.heard(name, rec, node.incarnation, node.seq, log, member)
        if change and change[2] is None and self.alerts:
            now = self.cluster_time
            assert now is not None
            cleared = self._clear_violation(name, change[0], change[1], now)
            if cleared is not None:
                return [cleared]
        return []

    def _signals(self, node: str, signals: list[Signal], now: int, policy: Policy) -> list[Output]:
        """What the node stage decided on the node's clock (``core/signals.py``), stamped with the
        cluster's identity and time: alerts, expire and snapshot_request directives, band changes, the
        emergency's debt report, what the store compacted. The messages they make."""
        out: list[Output] = []
        for sig in signals:
            if isinstance(sig, AlertChange):
                if sig.body["kind"] == "forced_expiry" and self.control.paused is not None:
                    self.control.count("expiry_while_paused")
                    continue
                out.append(self.alerts.stamp(sig.body, sig.state, now))
            elif isinstance(sig, ExpireOrder):
                if self.control.paused is not None:
                    self.control.count("expiry_while_paused")
                    continue
                out.append(self.directives.expire(node, sig.body, now, policy))
            elif isinstance(sig, SnapshotAsk):
                out.append(self.directives.snapshot_request(node, sig.reason, now, policy))
            elif isinstance(sig, BandChange):
                out.append(self.directives.band(node, sig.band, now, policy))
            elif isinstance(sig, DebtReport):
                self.emergency.take(node, sig.growing, sig.rate)
            else:
                was = self.compacted
                if was is None or sig.ts > was[0]:
                    self.compacted = [sig.ts, 0 if was is None else was[1] + 1]
        return out

    def refuse_node_event(self, event: NodeEvent, why: str) -> list[Output]:
        """A node event its node did not sign (``core/signing.py``): nothing of it is applied; a
        critical ``node_event_refused`` names the node (once, until it signs again)."""
        node = event["node"]
        aid = join_id("node_event_refused", node)
        if aid in self.alerts.raised:
            return []
        now = self.cluster_time if self.cluster_time is not None else log_time(event)
        words = "carries no signature" if why == "unsigned_node_event" else "is not signed with its node's key"
        return [self.alerts.raise_({
            "id": aid, "kind": "node_event_refused", "node": node, "severity": "critical", "value": None,
            "threshold": None, "since": now,
            "detail": f"a {event['type']} of node {node} {words} ({why}): refused, as every one until the node signs "
                      "with its own key; a node speaks only for itself"}, now)]

    def accept_node_event(self, node: str) -> list[Output]:
        """A signed event of ``node``: its refusal alert, if any, clears."""
        if self.cluster_time is not None:
            cleared = self.alerts.clear(join_id("node_event_refused", node), self.cluster_time)
            if cleared is not None:
                return [cleared]
        return []

    def refuse_misrouted(self, event: Event) -> list[Output]:
        """A message on the wrong topic (``core/origin.py``): its dead letter, and a critical
        ``event_misrouted`` naming its topic and key (raised again for each, cleared by the next
        control event from the control topic); a control event's action is refused."""
        letter = event[MISROUTED]
        body = letter["value"]
        now = self.cluster_time if self.cluster_time is not None else log_time(event)
        control = event if is_control_event(event) else None  # (narrowed once: its action is refused below)
        detail = (f"{body['error']} (partition {body['partition']}, offset {body['offset']}, key {body['key']!r}): "
                  "refused and dead-lettered" + ("; whoever may write the events topic could otherwise steer the "
                                                 "cluster (an old publisher needs control_on_events_topic)"
                                                 if control is not None else ""))
        out = [Output(DEADLETTER, letter["key"], body),
               self.alerts.raise_again({"id": MISROUTED_ID, "kind": "event_misrouted",
                                        "node": event["node"] if is_node_event(event) else None,
                                        "severity": "critical", "value": None, "threshold": None, "since": now,
                                        "detail": detail}, now)]
        if control is not None:
            self.control.count(MISROUTED)
            if self.control.action(control.get("action_id")) is None:  # a copy of a known action cannot change it
                self.control.record(control, "refused", MISROUTED, detail, self.cluster_time)
        return out

    def _hold_bound(self) -> Bound | None:
        """The highest bound a service hold must not lie below: a bound already sent (``safe_ts``, a
        namespace's), or what the store itself has compacted already (``compacted_ts``)."""
        bound = self.tenants.pins_all(self.safe_ts)
        if self.compacted is not None and (bound is None or self.compacted[0] >= bound[0]):  # the plainer reason
            return (self.compacted[0], "compacted_ts")
        return bound

    # -- recovery after a start on empty state (core/recovery.py) -------------------------
    def start_recovery(self, safe_ts: int | None, catalog_floor: int | None, seq: int, node_seq: int,
                       expected: tuple[str, ...] | list[str]) -> None:
        """Continue from a seed and require a snapshot of every node before it counts again."""
        self.safe_ts = safe_ts
        self.catalog.advance(catalog_floor)
        self.directives.seed(seq, node_seq)
        self.recovery = Recovery(expected)
        self.members.rebuild()
        self.aborts = AbortSync()
        self._rebuild_recovery()

    def _read_from(self, partition: int | None, control: bool) -> list[Output]:
        """Where the cluster's own events live, in each topic (``core/origin.py``), noted from one read
        from events ``partition`` (None: a file); a control event from the control topic clears
        ``event_misrouted``: the message that says so."""
        if partition is None:
            return []
        self.gaps.home(partition, control)
        if is_control(partition) and MISROUTED_ID in self.alerts.raised and self.cluster_time is not None:
            cleared = self.alerts.clear(MISROUTED_ID, self.cluster_time)
            if cleared is not None:
                return [cleared]
        return []

    def apply_cluster_event(self, event: ClusterEvent, policy: Policy,
                            holds_of: Callable[[str], list[tuple[str, str, int]]],
                            partition: int | None = None) -> tuple[str | None, list[Output]]:
        """Apply a validated cluster event (from events ``partition``). Returns (why it was ignored, or
        None; what it emits). ``holds_of(node)``: the node's open holds (``NodeState.open_holds``),
        alerted when a topology makes it a member below the safe point."""
        kind = event["type"]
        if is_control_event(event):
            out = self._read_from(partition, True)
            if policy.control_keys:
                why, said = self.control.check_signature(event, policy.signing_keys,
                                                         policy.control_signature_window_ms, self.cluster_time,
                                                         self.alerts)
                out += said
                if why is not None:
                    return why, out
            if event["type"] == GAP_ACK:
                self._ack_gap(event)
                out += self.evaluate(policy)
                return None, out
            dirty, said = self.control.apply(event, self._hold_bound, self.cluster_time, self.alerts,
                                             policy.max_service_hold_ttl_ms)
            out += said
            if dirty:
                self.dirty = True
            out += self.evaluate(policy)
            return None, out
        out = self._read_from(partition, False)
        version = event["version"]
        if version <= self.versions.get(kind, -1):
            return IGNORED_STALE_VERSION, out
        self.versions[kind] = version
        if event["type"] == "topology":
            joined = self.members.set_topology({n: list(gs) for n, gs in event["nodes"].items()})
            self.topology_wall = self.cluster_time
            self.aborts = AbortSync()
            self._rebuild_recovery()
            if self.cluster_time is not None:
                for node in sorted(joined):
                    out += check_join(self.alerts, self.members, node, holds_of(node), self.safe_ts, self.cluster_time)
        else:
            self.catalog.apply(event)
        self.dirty = True
        out += self.evaluate(policy)
        return None, out

    # -- events lost from the log (core/gaps.py) ------------------------------------------
    def meet_gaps(self, gaps: Iterable[Gap], first_log: int | None, policy: Policy) -> list[Output]:
        """The gaps found so far, handed to the cluster before its next message; ``first_log``: the log
        time of its first event when it is met for the first time now (None: met before). A cluster met
        for the first time takes a gap found at most a lease before its first event (its earlier events
        may be what was lost); an older gap cannot hide a live node of it, and is only marked seen.
        What they emit."""
        out: list[Output] = []
        for gap in gaps:
            if first_log is None or first_log <= gap.ms + policy.node_lease_ms:
                out += self.take_gap(gap, policy)
            else:
                self.gaps.skip(gap.id)
        return out

    def take_gap(self, gap: Gap, policy: Policy) -> list[Output]:
        """A gap in the events or control topic: the nodes whose events may have been in it owe a snapshot
        (and so does a node first seen on its partitions within a lease), the safe point holds meanwhile,
        and while a service hold may have been lost with it, until every such hold would have run out.
        What it emits."""
        if gap.id <= self.gaps.seen:
            return []
        now = self.cluster_time
        at = gap.ms if now is None else now
        owed: list[str] = []
        cp = self.gaps.control_partition  # where its control events came from last (either topic, or not known)
        if gap.control:  # the control topic: no node event lives there (core/origin.py)
            own = holds = gap.covers(cp) if is_control(cp) else True
        else:
            owed = sorted(name for name, rec in self.members.nodes.items() if gap.covers(rec.partition))
            if self.recovery is None:
                self.recovery = Recovery((), whole=False)
            self.recovery.owe(owed, gap.partition, at + policy.node_lease_ms, gap.id)
            own = gap.covers(self.gaps.key_partition)
            holds = gap.covers(cp) if cp is not None and not is_control(cp) else own and policy.control_on_events_topic
            if own:  # the cluster's own events may be in it: a topology, a catalog event
                self.members.loosen({n for n, rec in self.members.nodes.items()
                                     if at - rec.last_wall <= policy.node_lease_ms})
                self.catalog.hold(True)
        out = [self.gaps.take(gap, owed, own, holds, now, policy.max_service_hold_ttl_ms, self.alerts)]
        self.aborts = AbortSync()
        self._rebuild_recovery()
        self.dirty = True
        if now is not None:
            out += self.evaluate(policy)
        return out

    def _ack_gap(self, event: GapAck) -> None:
        """An operator acknowledged a gap (``gap``: its id; absent: every open one): control events lost
        in it need not hold the safe point any more."""
        gid = event.get("gap")
        acked = self.gaps.ack(gid)
        if acked:
            self.dirty = True
            if not any(g["control"] and not g["acked"] for g in self.gaps.open.values()):
                self.members.tighten()  # the operator checked the topology and the catalog too
                self.catalog.hold(False)
                self.aborts = AbortSync()
                self._rebuild_recovery()
            self.control.record(event, "applied", None, f"acknowledged gap(s) {', '.join(map(str, acked))}",
                                self.cluster_time)
        else:
            self.control.count("unknown_gap")
            self.control.record(event, "ignored", "unknown_gap",
                                "no open gap" if gid is None else f"no open gap {gid}", self.cluster_time)

    # -- the round ----------------------------------------------------------------------
    def evaluate(self, policy: Policy) -> list[Output]:
        """Run the round at the cluster time; it is settled there after (``settled``). What it emits."""
        out = self._evaluate(policy)
        self.settled = self.cluster_time
        return out

    def _evaluate(self, policy: Policy) -> list[Output]:
        self.clears = False
        now = self.cluster_time
        out: list[Output] = []
        if now is None or self.first_wall is None:
            return out
        frozen = bool(self.gaps.open) and self.gaps.frozen(now)
        if self.control and not frozen:
            expired = self.control.expire(now, self.alerts)
            if expired:
                self.dirty = True  # (while a gap may hide a renewal, no known hold expires)
                out += expired
        if self.gaps.open:
            closed, said = self.gaps.settle(self.members.names if self.members.topology is not None else None, now,
                                            self.alerts)
            out += said
            if closed:
                self.dirty = True
        emergency_moved = False
        if self.emergency:
            emergency_moved, said = self.emergency.step(now, policy, self.alerts)
            out += said
        if self.members.topology is None and now < self.first_wall + policy.node_lease_ms:
            return out  # discovery window: every live node gets a lease to report first
        aborted, said = sync_aborts(self.aborts, self.members, self.recovery, self.alerts, now, policy)
        out += said
        emitted, said = self._round(aborted, now, policy)
        out += said
        if not emitted and (self.control.announce or emergency_moved) and self.safe_ts is not None:
            # the holds or the pause changed: they ride on a directive at once (same safe point), so
            # that a job that loses its checkpoint keeps them (core/recovery.py); so does an emergency
            out += self._emit(self._lowest_node(), now, policy)
        # after the round: a message that both ends a long gap and advances the safe point is no stall
        if self.last_advance_wall is None:
            self.last_advance_wall = now if self.first_wall is None else self.first_wall
        stalled = stall_alert(self.alerts, self.members, self.recovery, self.last_advance_wall, now, policy)
        if stalled is not None:
            out.append(stalled)
        self.clears = self._passes(aborted, now, policy)
        return out

    def _passes(self, aborted: bool, now: int, policy: Policy) -> bool:
        """The round's gates: not aborted, not paused, not held by a gap that may hide a service hold,
        and the directive interval over."""
        if aborted or self.control.paused is not None or (self.gaps.open and self.gaps.frozen(now)):
            return False
        last = self.directives.last_wall
        return not (policy.directive_interval_ms and last is not None and now - last < policy.directive_interval_ms)

    def round_min(self) -> tuple[int, str] | None:
        """The lowest of the members' known minimums and the service holds: (ts, its node), the node
        "" for a service hold (a tie goes to the node); None when there is neither. The round's
        global minimum once every member's minimum is known, and the status's blocker."""
        lowest, service = self.members.lowest(), self.control.lowest()
        return None if lowest is None and service is None else _lower(lowest, service)

    def _lowest_node(self) -> str:
        """The node of the lowest minimum when every member's is known ("": none, or a service hold)."""
        low = self.round_min() if self.members.complete else None
        return "" if low is None else low[1]

    def _round(self, aborted: bool, now: int, policy: Policy) -> tuple[bool, list[Output]]:
        """Emit a directive if the round is not aborted and safe_ts or catalog_floor advances:
        (it did, what it emits)."""
        if not self.dirty or not self._passes(aborted, now, policy):
            return False, []  # a pause keeps the cluster dirty: what it held back goes out after resume
        self.dirty = False
        lowest = self.members.lowest()
        if lowest is None or not self.members.complete:
            return False, []
        service = self.control.lowest()
        global_min, gnode = _lower(lowest, service)
        safe = global_min if self.safe_ts is None else max(self.safe_ts, global_min)
        floor = self.catalog.floor_at(safe)
        tenants_moved = False
        out: list[Output] = []
        if self.members.ns_nodes or self.tenants:
            tenants_moved, out = self.tenants.round(self.members, service, safe, now, policy, self.alerts)
        if safe == self.safe_ts and floor == self.catalog.floor and not tenants_moved:
            return False, out
        self.safe_ts = safe
        self.catalog.advance(floor)
        self.last_advance_wall = now
        cleared = self.alerts.clear("stall/-", now)
        if cleared is not None:
            out.append(cleared)
        out += self._emit(gnode, now, policy)
        return True, out

    def _emit(self, gnode: str, now: int, policy: Policy) -> list[Output]:
        self.control.announced()
        return self.directives.compaction(safe_ts=self.safe_ts, catalog_floor=self.catalog.floor, gnode=gnode,
                                          members=self.members, control=self.control, tenants=self.tenants, now=now,
                                          policy=policy, extra=self.emergency.directive_fields(policy))


def _lower(lowest: tuple[int, str] | None, service: tuple[int, str] | None) -> tuple[int, str]:
    """The lower of the members' lowest minimum and the lowest service hold (``ClusterState.round_min``)."""
    if service is not None and (lowest is None or service[0] < lowest[0]):
        return service[0], ""  # "": the blocker is a service hold of the cluster
    assert lowest is not None
    return lowest[0], str(lowest[1])
