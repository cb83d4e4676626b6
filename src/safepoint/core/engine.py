"""One message through the core: what ``replay`` runs and the job runs, the same function.

``step`` applies one validated event to its cluster: a node event first to the node's
``NodeState`` (which says what changed in a ``NodeUpdate``), then to the ``ClusterState``; a
cluster event to the cluster alone. It returns the message's ``Outcome``: its ``Result``
(applied, ignored or dead-lettered, and why) and what it emits. ``Engine`` calls it for every message of a log, in order, keeping every node and
cluster in memory; the job's one stateful operator calls it for every message of a micro-batch of
one cluster, in the job's log order, with the nodes loaded bucket by bucket from its state
(``core/batch.py``). Both give the same outputs for the same order: they are one loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from enum import Enum
from typing import NamedTuple, Protocol

from safepoint.core.clock import log_time
from safepoint.core.cluster import ClusterState
from safepoint.core.event_records import Event
from safepoint.core.event_structs import HoldEvent
from safepoint.core.events import Rejected, is_control_event, is_node_event, parse, typed_event
from safepoint.core.gaps import Gap
from safepoint.core.node import NodeState
from safepoint.core.origin import CONTROL, FILE, MISROUTED, misrouted, routed_partition
from safepoint.core.outputs import Output, dead_letter
from safepoint.core.policy import Policies, Policy
from safepoint.core.recovery import StartPlan
from safepoint.core.signing import verify_node

__all__ = ["APPLIED", "DEADLETTERED", "IGNORED", "Engine", "NodeSource", "Outcome", "Position", "Result", "Tally",
           "dead_lettered", "step", "step_typed"]


class Result(Enum):
    """What became of one message."""

    APPLIED = "applied"
    """Applied to its node or cluster."""
    IGNORED = "ignored"
    """Valid, and nothing of it applied (a duplicate, an older seq, an unsigned node event, ...: its ``why``)."""
    DEADLETTERED = "deadlettered"
    """Refused: sent to the dead-letter topic (its ``why``: the class, ``core/events.py``)."""


APPLIED = Result.APPLIED
IGNORED = Result.IGNORED
DEADLETTERED = Result.DEADLETTERED


class Position(NamedTuple):
    """Where a message came from; dead letters and accounting name it."""

    topic: str
    partition: int
    offset: int
    key: bytes | str | None = None


class Outcome:
    """What one message did, and what it emits (a plain class, not a tuple: the compiled core makes
    one for every message, and a compiled class is the cheapest record to make)."""

    __slots__ = ("result", "why", "outputs")

    def __init__(self, result: Result, why: str | None, outputs: list[Output]) -> None:
        self.result = result
        self.why = why
        """Why it was ignored, or the class of its dead letter; None when applied."""
        self.outputs = outputs
        """What it emits, in order: directives, alerts, dead letters."""

    @property
    def label(self) -> str:
        """Its accounting label: ``applied``, ``ignored:<why>``, ``deadlettered:<class>`` (the
        accounting rows' ``outcome``, ``Engine.labels``)."""
        why = self.why
        if why is None:
            return APPLIED_LABEL if self.result is APPLIED else self.result.value
        return f"{self.result.value}:{why}"


APPLIED_LABEL = "applied"
"""The label of the commonest outcome, made once (an enum's value is read through Python)."""


class Tally:
    """Messages counted by label, with each label's (result, why) kept beside it, so that nothing
    parses a label back (``counts_of``, ``Engine.counts``)."""

    __slots__ = ("counts", "results")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        """Label -> how many messages had it."""
        self.results: dict[str, tuple[Result, str | None]] = {}
        """Label -> its result and why."""

    def add(self, outcome: Outcome) -> str:
        """Count one message's outcome; its label."""
        label = outcome.label
        n = self.counts.get(label)
        if n is None:
            self.results[label] = (outcome.result, outcome.why)
            self.counts[label] = 1
        else:
            self.counts[label] = n + 1
        return label

    def applied(self) -> str:
        """``add`` of an applied message's outcome (the quiet path's: no outcome is made for it)."""
        n = self.counts.get(APPLIED_LABEL)
        if n is None:
            self.results[APPLIED_LABEL] = (APPLIED, None)
            self.counts[APPLIED_LABEL] = 1
        else:
            self.counts[APPLIED_LABEL] = n + 1
        return APPLIED_LABEL

    def by_result(self) -> list[tuple[Result, str | None, int]]:
        """(result, why, how many) of every label counted."""
        return [(*self.results[label], n) for label, n in self.counts.items()]


class NodeSource(Protocol):
    """Where ``step`` finds a node's state: ``Engine`` keeps every node in memory, the job loads a
    node's bucket from its state store when the batch first touches it."""

    def node(self, cluster: str, name: str) -> NodeState:
        """The node's state, a new one if it has none."""
        ...

    def peek(self, cluster: str, name: str) -> NodeState | None:
        """The node's state if it has one, without making one (nor, in the job, counting the node
        as touched by the batch)."""
        ...


def dead_lettered(rejected: Rejected, value: bytes | str | None, pos: Position) -> Outcome:
    """The outcome of a message that failed parsing or validation: its dead letter."""
    out = dead_letter(rejected.error, value, pos.key, pos.topic, pos.partition, pos.offset)
    return Outcome(DEADLETTERED, rejected.code, [out])


def _open_holds(ns: NodeState | None) -> list[tuple[str, str, int]]:
    return [] if ns is None else ns.open_holds()


def step(state: ClusterState, nodes: NodeSource, event: Event, policy: Policy, partition: int,
         offset: int, quiet: bool = True) -> Outcome:
    """Apply one validated event, the message at routed ``partition``/``offset`` (``core/origin.py``),
    to its node and cluster. ``quiet``: a node event is offered to the quiet path first
    (``ClusterState.take_quiet``); False where it was offered already, as a struct, and refused."""
    state.directives.saw(partition, offset)
    if MISROUTED in event:
        if is_control_event(event) and policy.control_on_events_topic:  # an old publisher, allowed
            del event[MISROUTED]
        else:
            return Outcome(DEADLETTERED, MISROUTED, state.refuse_misrouted(event))
    if not is_node_event(event):
        ignored, out = state.apply_cluster_event(event, policy, lambda name: _open_holds(nodes.peek(state.name, name)),
                                                 partition)
        return Outcome(APPLIED if ignored is None else IGNORED, ignored, out)
    accepted: list[Output] = []
    if policy.node_key_secret:
        why = verify_node(event, policy.node_key_secret)
        if why is not None:
            return Outcome(IGNORED, why, state.refuse_node_event(event, why))
        if state.alerts.raised:
            accepted = state.accept_node_event(event["node"])
    name = event["node"]
    node = nodes.node(state.name, name)
    took = state.take_quiet(node, event, policy, partition) if quiet else None
    if took is not None:
        return Outcome(APPLIED, None, accepted + took if accepted else took)
    rec = state.recovery  # (the quiet path takes no event while the cluster recovers)
    lost = rec is not None and rec.may_have_lost(name, partition, -1 if state.cluster_time is None else state.cluster_time,
                                                 name not in state.members.nodes)
    update = node.apply(event, policy, lost)
    if isinstance(update, str):
        return Outcome(IGNORED, update, accepted)
    update.partition = partition
    out = state.apply_node_update(update, policy)
    return Outcome(APPLIED, None, accepted + out if accepted else out)


def step_typed(state: ClusterState, nodes: NodeSource, event: HoldEvent, policy: Policy, partition: int, offset: int,
               log: int) -> list[Output] | None:
    """``step`` of a hold's opening or closing decoded as a struct (``core/event_structs.py``), at log
    time ``log``, where the quiet path takes it (``ClusterState.take_quiet_typed``): its outputs. None,
    nothing changed, where it does not, or where ``step`` would not offer it (a cluster that checks
    signatures): the event then goes ``step``'s full path, parsed. The caller knows the event is on
    the events topic (``step`` would refuse a hold event elsewhere as misrouted)."""
    if policy.node_key_secret:
        return None
    out = state.take_quiet_typed(nodes.node(state.name, event.node), event, policy, partition, log)
    if out is not None:
        state.directives.saw(partition, offset)
    return out


class Engine:
    """Every message of a log through ``step``, in order, with the accounting of every message."""

    def __init__(self, policy: Policy | Policies | None = None, record: bool = False, start: StartPlan | None = None,
                 origins: Mapping[str, str] | None = None) -> None:
        self.policies = Policies.of_policy(policy)
        """Each cluster's policy (``Policies.of``)."""
        self.policy = self.policies.default
        """The default policy (a message's size limit: it is checked before its cluster is known)."""
        self.origins = dict(origins or {})
        """topic -> its origin (``core/origin.py``: ``events`` or ``control``), as the job reads them; a
        topic not named (a file, for ``safepoint replay``) is ``file``: it may mix both kinds."""
        self.start = start or StartPlan()
        """How clusters met for the first time start (seeded and recovering after a lost checkpoint)."""
        self.nodes: dict[tuple[str, str], NodeState] = {}
        self.clusters: dict[str, ClusterState] = {}
        self.tally = Tally()
        """Every message's outcome, counted (``labels`` and ``counts`` read it)."""
        self.outcomes: list[tuple[int, int, str]] | None = [] if record else None
        """With ``record``: (routed partition, offset, label) of every message, in order (``core/origin.py``)."""
        self.gaps: list[Gap] = []
        """The gaps found in the log so far (``gap``): a cluster met later may take them."""

    def node(self, cluster: str, name: str) -> NodeState:
        state = self.nodes.get((cluster, name))
        if state is None:
            state = self.nodes[(cluster, name)] = NodeState(cluster, name)
        return state

    def peek(self, cluster: str, name: str) -> NodeState | None:
        return self.nodes.get((cluster, name))

    @property
    def labels(self) -> Counter[str]:
        """Messages by final label: applied, ignored:<reason>, deadlettered:<code>."""
        return Counter(self.tally.counts)

    @property
    def dead_letters(self) -> Counter[str]:
        """Dead-lettered messages by class."""
        return Counter({why or "": n for result, why, n in self.tally.by_result() if result is DEADLETTERED})

    @property
    def counts(self) -> Counter[str]:
        """Messages by outcome: ``applied``, ``ignored:<why>``, ``deadlettered`` (every class of dead letter in one)."""
        counts: Counter[str] = Counter()
        for label, n in self.tally.counts.items():
            result = self.tally.results[label][0]
            counts[result.value if result is DEADLETTERED else label] += n
        return counts

    def process(self, value: bytes | str | None, pos: Position, log_ms: int | None = None) -> list[Output]:
        """One message: parsed, validated and applied; what it emits."""
        return self.process_at(value, pos.topic, pos.partition, pos.offset, pos.key, log_ms)

    def process_at(self, value: bytes | str | None, topic: str, partition: int, offset: int,
                   key: bytes | str | None = None, log_ms: int | None = None) -> list[Output]:
        """``process`` of the message at ``topic``/``partition``/``offset`` (its ``Position`` is built
        only for a dead letter: the commonest message needs none), with its log time ``log_ms``
        (``core/clock.py``: a Kafka record's broker time). Without one, the message's own ``log_ms``
        (a replay file's line may carry its record's time) or else its ``wall_ms`` stands in. ``topic``'s
        origin (``origins``) decides what belongs there.

        A hold's opening or closing is decoded as a struct first (``typed_event``) and offered to
        the quiet path (``quiet_typed``); what that does not take is parsed into a map and goes the
        full path, which does not offer it to the quiet path again (it would refuse it as well)."""
        quiet = True
        typed = typed_event(value, self.policy.max_message_bytes)
        if typed is not None:
            out = self.quiet_typed(typed, topic, partition, offset, log_ms)
            if out is not None:
                return out
            quiet = False
        event = parse(value, self.policy.max_message_bytes)
        origin = self.origins.get(topic, FILE)
        routed = routed_partition(origin, partition)
        if isinstance(event, Rejected):
            outcome = dead_lettered(event, value, Position(topic, partition, offset, key))
        else:
            own = event.get("log_ms")
            if log_ms is not None:
                event["log_ms"] = log_ms
            elif type(own) is not int:
                event["log_ms"] = event["wall_ms"]
            misrouted(event, origin, value, key, topic, partition, offset)
            outcome = self.apply(event, routed, offset, quiet)
        label = self.tally.add(outcome)
        if self.outcomes is not None:
            self.outcomes.append((routed, offset, label))
        return outcome.outputs

    def quiet_typed(self, event: HoldEvent, topic: str, partition: int, offset: int,
                    log_ms: int | None) -> list[Output] | None:
        """The outputs of a hold's opening or closing decoded as a struct when the quiet path takes it
        (``ClusterState.take_quiet_typed``), counted as ``process_at`` counts an event; None, nothing
        changed, where ``step`` would not offer it to the quiet path (a cluster not met yet, an
        event on the control topic: misrouted, a cluster that checks signatures) or the quiet path
        refuses it. Its log time: ``log_ms``, else its ``wall_ms`` (a struct holds no ``log_ms``)."""
        state = self.clusters.get(event.cluster)
        if state is None or self.origins.get(topic, FILE) == CONTROL:
            return None
        out = step_typed(state, self, event, self.policies.of(event.cluster), partition, offset,
                         event.wall_ms if log_ms is None else log_ms)
        if out is None:
            return None
        label = self.tally.applied()
        if self.outcomes is not None:
            self.outcomes.append((partition, offset, label))
        return out

    def apply(self, event: Event, partition: int, offset: int, quiet: bool = True) -> Outcome:
        """One validated event through ``step`` (its cluster started if it is new; ``quiet``: as
        ``step`` takes it)."""
        name = event["cluster"]
        state = self.clusters.get(name)
        pre: list[Output] = []
        if state is None:
            state = self.clusters[name] = ClusterState.starting(name, self.start)
            pre = state.meet_gaps(self.gaps, log_time(event), self.policies.of(name))
        outcome = step(state, self, event, self.policies.of(name), partition, offset, quiet)
        if pre:
            outcome.outputs = pre + outcome.outputs
        return outcome

    def gap(self, gap: Gap) -> list[Output]:
        """A gap found in the log before the messages that follow (``core/gaps.py``): every cluster
        known takes it now, and a cluster met within a lease of it takes it when it is met."""
        self.gaps.append(gap)
        out: list[Output] = []
        for _name, state in sorted(self.clusters.items()):
            if _name:
                out += state.take_gap(gap, self.policies.of(_name))
        return out

    def cluster(self, name: str) -> ClusterState | None:
        return self.clusters.get(name)
