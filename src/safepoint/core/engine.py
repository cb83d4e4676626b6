"""The two stages of the core composed in log order: what ``replay`` runs and the job mirrors.

``node_stage`` is what the job's per-node stateful operator runs for each input message;
``ClusterState`` is what its per-cluster operator runs for each stage-one result. ``Engine``
chains them one message at a time, so replay and the job share every rule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple

from safepoint.core.cluster import IGNORED_STALE_VERSION, ClusterState
from safepoint.core.control import CONTROL_TYPES
from safepoint.core.events import Rejected, is_node_event, parse
from safepoint.core.node import NodeState, NodeUpdate
from safepoint.core.outputs import Output, dead_letter
from safepoint.core.policy import Policy
from safepoint.core.recovery import StartPlan

__all__ = ["Engine", "Outcome", "StageOne", "node_stage", "parse_stage", "apply_stage", "cluster_stage", "Position"]

APPLIED = "applied"
IGNORED = "ignored"
DEADLETTERED = "deadlettered"


@dataclass(frozen=True, slots=True)
class Position:
    """Where a message came from; dead letters and accounting name it."""

    topic: str
    partition: int
    offset: int
    key: bytes | str | None = None


@dataclass(slots=True)
class StageOne:
    """Result of the node stage for one message, handed to the cluster stage."""

    cluster: str
    outcome: str  # applied | ignored | deadlettered
    reason: str | None = None  # why ignored, or the dead letter's error
    update: NodeUpdate | None = None  # node event applied
    event: dict[str, Any] | None = None  # cluster event to apply in the cluster stage
    output: Output | None = None  # a dead letter
    code: str | None = None  # the dead letter's error class

    @property
    def label(self) -> str:
        """The message's final accounting label: applied, ignored:<reason>, deadlettered:<code>."""
        if self.outcome == APPLIED:
            return APPLIED
        if self.outcome == IGNORED:
            return f"{IGNORED}:{self.reason}"
        return f"{DEADLETTERED}:{self.code}"


def node_stage(
    nodes: dict[tuple[str, str], NodeState],
    value: bytes | str | None,
    pos: Position,
    policy: Policy,
    gates: dict[str, dict[str, int]] | None = None,
    reference: bool = False,
) -> StageOne:
    """Parse one message and apply it to its node's state (``nodes`` is updated in place).

    Cluster events pass the version gate of their cluster (``gates``: cluster -> type -> last
    version), so every message's outcome is final here; the cluster stage checks again.
    """
    event = parse_stage(value, pos, policy)
    if isinstance(event, StageOne):
        return event
    return apply_stage(nodes, event, policy, gates, reference)


def parse_stage(value: bytes | str | None, pos: Position, policy: Policy) -> dict[str, Any] | StageOne:
    """The first half of ``node_stage``: the validated event, or its dead letter."""
    event = parse(value, policy.max_message_bytes)
    if isinstance(event, Rejected):
        out = dead_letter(event.error, value, pos.key, pos.topic, pos.partition, pos.offset)
        return StageOne(cluster="", outcome=DEADLETTERED, reason=event.error, output=out, code=event.code)
    return event


def apply_stage(
    nodes: dict[tuple[str, str], NodeState],
    event: dict[str, Any],
    policy: Policy,
    gates: dict[str, dict[str, int]] | None = None,
    reference: bool = False,
) -> StageOne:
    """The second half of ``node_stage``: apply one validated event to its node (or gate)."""
    cluster = event["cluster"]
    if not is_node_event(event):
        if gates is not None and event["type"] not in CONTROL_TYPES:  # those order themselves (core/control.py)
            versions = gates.setdefault(cluster, {})
            if event["version"] <= versions.get(event["type"], -1):
                return StageOne(cluster=cluster, outcome=IGNORED, reason=IGNORED_STALE_VERSION)
            versions[event["type"]] = event["version"]
        return StageOne(cluster=cluster, outcome=APPLIED, event=event)
    key = (cluster, event["node"])
    state = nodes.get(key)
    if state is None:
        state = nodes[key] = NodeState(cluster, event["node"], reference)
    result = state.apply(event, policy)
    if isinstance(result, str):
        return StageOne(cluster=cluster, outcome=IGNORED, reason=result)
    return StageOne(cluster=cluster, outcome=APPLIED, update=result)


class Outcome(NamedTuple):
    """What one message did in the cluster stage: its final accounting label (``applied``, or the
    outcome class: ``ignored``, ``deadlettered``) and what it emits, in order (directives, alerts,
    dead letters)."""

    label: str
    outputs: list[Output]


def cluster_stage(state: ClusterState, item: StageOne, policy: Policy, partition: int, offset: int) -> Outcome:
    """Apply one stage-one result, the message at ``partition``/``offset``, to its cluster."""
    if item.output is not None:
        return Outcome(DEADLETTERED, [item.output])
    state.directives.positions[partition] = offset + 1  # a directive out of this message counts it
    out: list[Output] = []
    if item.update is not None:
        state.apply_node_update(item.update, policy, out)
        return Outcome(APPLIED, out)
    if item.event is not None:
        ignored = state.apply_cluster_event(item.event, policy, out)
        return Outcome(APPLIED if ignored is None else f"{IGNORED}:{ignored}", out)
    return Outcome(f"{IGNORED}:{item.reason}", out)


class Engine:
    """Both stages over a log in order, with the accounting of every message."""

    def __init__(self, policy: Policy | None = None, record: bool = False, start: StartPlan | None = None,
                 reference: bool = False) -> None:
        self.policy = policy or Policy()
        self.reference = reference
        """Run the reference algorithms (every node's holds and every member's abort problems
        walked after every event): slow, the outputs the fast paths are tested against."""
        self.start = start or StartPlan()
        """How clusters met for the first time start (seeded and recovering after a lost checkpoint)."""
        self.nodes: dict[tuple[str, str], NodeState] = {}
        self.gates: dict[str, dict[str, int]] = {}
        self.clusters: dict[str, ClusterState] = {}
        self.counts: Counter[str] = Counter()
        self.labels: Counter[str] = Counter()
        """Every message's final label: applied, ignored:<reason>, deadlettered:<code>."""
        self.outcomes: list[tuple[int, int, str]] | None = [] if record else None
        """With ``record``: (partition, offset, label) of every message, in order."""

    def process(self, value: bytes | str | None, pos: Position) -> list[Output]:
        """One message through both stages: what it emits."""
        item = node_stage(self.nodes, value, pos, self.policy, self.gates, self.reference)
        self.labels[item.label] += 1
        if self.outcomes is not None:
            self.outcomes.append((pos.partition, pos.offset, item.label))
        if item.output is not None:
            self.counts[DEADLETTERED] += 1
            return [item.output]
        state = self.clusters.get(item.cluster)
        if state is None:
            state = self.clusters[item.cluster] = ClusterState.starting(item.cluster, self.start)
            state.reference = self.reference
        outcome = cluster_stage(state, item, self.policy, pos.partition, pos.offset)
        self.counts[outcome.label] += 1
        return outcome.outputs

    def cluster(self, name: str) -> ClusterState | None:
        return self.clusters.get(name)
