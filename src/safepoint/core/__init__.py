"""The pure core: no Spark, no Kafka, no clock. Time comes from the events.

Its modules run compiled when the checkout's build of them is current (``core/compiled.py``);
``CORE`` says which runs and ``CORE_WHY`` why.
"""

from safepoint.core.compiled import select

CORE, CORE_WHY = select(__path__)

# the imports below come after the choice above
# ruff: noqa: E402
from safepoint.core.cluster import ClusterState
from safepoint.core.engine import Engine, Outcome, Position, step
from safepoint.core.events import Rejected, parse
from safepoint.core.node import NodeState, NodeUpdate
from safepoint.core.outputs import ALERTS, DEADLETTER, DIRECTIVES, Output
from safepoint.core.policy import Policy

__all__ = [
    "ALERTS",
    "CORE",
    "CORE_WHY",
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
