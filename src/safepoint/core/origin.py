"""Where a message came from: the events topic, the control topic, or a file.

Node events and the cluster's own events (topology, catalog versions, index builds, rebalances)
travel on the **events topic**, which every database node may write. Control events (service
holds, releases, pause, resume, gap acknowledgements) travel on the **control topic**, which Kafka
ACLs give to operators and holders alone (``docs/security.md``). The job reads both in one source;
inside a batch a message is placed by its *routed partition*: an events partition ``p`` is ``p``,
a control partition ``p`` is ``control_partition(p)`` (below ``GAP_PARTITION``, so the two never
meet), which is how the core tells the topics apart without knowing their names.

A message on the wrong topic is **misrouted** (``misrouted``): a control event on the events topic
(anyone who can write the events topic could otherwise drop an operator's hold or pause
compaction) unless the cluster's ``control_on_events_topic`` allows old publishers, and a node or
cluster event on the control topic. The router marks it with its dead letter; the cluster refuses
it (``ClusterState.refuse_misrouted``: the dead letter, a critical ``event_misrouted`` alert naming
the topic and key, and the action's outcome ``refused``). A file (``safepoint replay``) has no
topics: its messages are never misrouted.
"""

from __future__ import annotations

from typing import Final

from safepoint.core.event_records import Event
from safepoint.core.events import is_control_event
from safepoint.core.outputs import dead_letter

__all__ = ["CONTROL", "EVENTS", "FILE", "MISROUTED", "control_partition", "is_control", "kafka_partition", "misrouted",
           "position_key", "routed_of", "routed_partition"]

EVENTS = "events"
CONTROL = "control"
FILE = "file"
"""A message's origin: the events topic, the control topic, or a file without topics."""
MISROUTED: Final = "misrouted"
"""The field of a misrouted event that carries its dead letter (set by the router; never on the wire)."""
_CONTROL_BASE = -2


def control_partition(partition: int) -> int:
    """The routed partition of the control topic's ``partition``."""
    return _CONTROL_BASE - partition


def routed_partition(origin: str, partition: int) -> int:
    """The routed partition of Kafka ``partition`` of a topic of ``origin``."""
    return control_partition(partition) if origin == CONTROL else partition


def is_control(partition: int | None) -> bool:
    """A routed partition of the control topic."""
    return partition is not None and partition <= _CONTROL_BASE


def kafka_partition(partition: int) -> int:
    """The Kafka partition number of a routed partition (of either topic)."""
    return _CONTROL_BASE - partition if partition <= _CONTROL_BASE else partition


def position_key(partition: int) -> str:
    """A routed partition as a compaction directive's ``positions`` names it: ``"3"`` (the events
    topic's partition 3) or ``"control:0"`` (the control topic's partition 0)."""
    return f"control:{kafka_partition(partition)}" if is_control(partition) else str(partition)


def routed_of(key: str) -> int:
    """The routed partition of a ``positions`` key (``position_key``)."""
    return control_partition(int(key[8:])) if key.startswith("control:") else int(key)


def misrouted(event: Event, origin: str, value: bytes | str | None, key: bytes | str | None, topic: str,
              partition: int, offset: int) -> None:
    """Mark ``event`` (validated; from ``topic``'s Kafka ``partition`` at ``offset``) with its dead
    letter when it is on the wrong topic. A control event on the events topic is marked too: its
    cluster's policy decides (``control_on_events_topic``)."""
    if origin == FILE:
        return
    control = is_control_event(event)
    if control == (origin == CONTROL):
        return
    why = (f"misrouted: a {event['type']} event on the events topic {topic}; control events belong on the control "
           "topic" if control else
           f"misrouted: a {event['type']} event on the control topic {topic}; only control events belong there")
    out = dead_letter(why, value, key, topic, partition, offset)
    event[MISROUTED] = {"key": out.key, "value": out.value}
