"""The pure core: no Spark, no Kafka, no clock. Time comes from the events."""

from safepoint.core.cluster import ClusterState
from safepoint.core.engine import Engine, Outcome, Position, step
from safepoint.core.events import Rejected, parse
from safepoint.core.node import NodeState, NodeUpdate
from safepoint.core.outputs import ALERTS, DEADLETTER, DIRECTIVES, Output
from safepoint.core.policy import Policy

__all__ = [
    "ALERTS",
    "DEADLETTER",
    "DIRECTIVES",
    "ClusterState",
    "Engine",
    "NodeState",
    "NodeUpdate",
    "Outcome",
    "Output",
    "Policy",
    "Position",
    "Rejected",
    "parse",
    "step",
]
