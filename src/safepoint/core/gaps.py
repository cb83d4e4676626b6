"""Events lost from the log before the job read them: what a gap is, and what a cluster does about it.

The job's source compares where it stands in each events partition with the partition's first
and last offsets whenever it plans a batch (``streaming/kafka_source.py``). A **gap** is what it
finds there, numbered in the order found (``id``):

* ``lost``: the next offset to read lies below the partition's first offset (retention, deleted
  records, an unclean leader election truncated it): offsets ``first`` .. ``end`` are gone;
* ``gone_back``: the partition ends below where the job stands (the topic was deleted and made
  again, its offsets reset): nothing of it can be trusted, and it is read from its new start
  (``end``);
* ``partitions``: the topic's partition count changed, so a node's events may have moved
  partitions (``partition`` is -1: every partition).

Each gap reaches every cluster before the cluster's next message (``Gaps.take``), and a cluster
met for the first time within a lease of a gap takes it too (its first events may be what was
lost). Nothing that may have been in a gap is trusted:

* every node whose events live in the gap's partitions (known by the partition of its last
  event; a node whose partition is not known yet counts) must **restate** its holds with a
  snapshot before the round counts it again (``core/recovery.py``: the round aborts with
  ``awaiting_snapshot`` meanwhile, and the node is asked with a ``snapshot_request``); so must a
  node first seen on those partitions within a lease after the gap;
* the cluster's own events share its key's partition, in each topic (``core/origin.py``): its
  topology and catalog events that of the events topic, its control events that of the control
  topic. When the events partition is in the gap (or not known yet), every node live then or seen
  since counts as a member until the next topology and the catalog floor holds. When the control
  partition is (or, with ``control_on_events_topic``, the events one), a service hold may have
  been set there, unseen: the safe point holds (``control_lost``) until every hold set in the gap
  would have run out, ``max_service_hold_ttl_ms`` of log time after the gap was found, or until an
  operator acknowledges the gap (``gap_ack``); meanwhile no known hold expires either (a renewal
  may be what was lost). A topology, a pause or a resume lost there cannot be known at all, so
  such a gap stays listed, and alerted, until acknowledged. A gap of the control topic owes no
  node a snapshot: no node event lives there.

A critical ``events_lost`` alert names each gap (topic, partition, the offsets gone, the nodes
that owe a snapshot) and clears once they all restated and, where control events may have been
lost, once an operator acknowledged it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from safepoint.core.alerts import AlertBook
from safepoint.core.ids import join_id
from safepoint.core.origin import control_partition, is_control
from safepoint.core.outputs import Output
from safepoint.core.signals import AlertBody

__all__ = ["GAP_KINDS", "GAP_PARTITION", "NAMED", "Gap", "Gaps"]

GAP_KINDS = ("lost", "gone_back", "partitions")
GAP_PARTITION = -1
"""The ``Routed`` partition of a gap record in a cluster's batch (a gap is no message of a partition)."""
NAMED = 10
"""Nodes an ``events_lost`` alert names (all are counted)."""


class Gap(NamedTuple):
    """A stretch of the events or the control topic the job could not read (see the module's docstring)."""

    id: int
    topic: str
    partition: int
    """-1: every partition (``partitions``)."""
    first: int
    """The first offset gone (``gone_back``: where the job stood)."""
    end: int
    """The offset after the last one gone: where reading resumed (``gone_back``: the new start)."""
    kind: str
    ms: int
    """When the job found it (the planning driver's clock, kept in the checkpoint's offsets)."""
    control: bool = False
    """A gap of the control topic (``partition`` is its Kafka partition)."""

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Gap:
        return cls(int(data["id"]), str(data["topic"]), int(data["partition"]), int(data["first"]), int(data["end"]),
                   str(data["kind"]), int(data["ms"]), bool(data.get("control")))

    def to_json(self) -> dict[str, Any]:
        data = self._asdict()
        if not self.control:
            del data["control"]
        return data

    def covers(self, partition: int | None) -> bool:
        """Events of routed ``partition`` (``core/origin.py``; None: not known) may have been in the gap."""
        if partition is None:
            return True
        if is_control(partition) != self.control:
            return False
        return self.partition == GAP_PARTITION or partition == (control_partition(self.partition) if self.control
                                                                  else self.partition)

    def what(self) -> str:
        where = f"{self.topic} (every partition)" if self.partition == GAP_PARTITION else f"{self.topic} partition {self.partition}"
        if self.kind == "lost":
            return f"offsets {self.first}..{self.end - 1} of {where} were lost before the job read them ({self.end - self.first} events)"
        if self.kind == "gone_back":
            return (f"{where} ends below offset {self.first}, where the job stood: the topic was made again or its "
                    f"offsets reset; it is read again from offset {self.end}")
        return f"the partition count of {self.topic} changed: a node's events may have moved partitions"


class Gaps:
    """A cluster's gaps: the newest id taken, the gaps still open, and the partitions of its own key.

    Invariant: a gap stays open while a node it names owes a snapshot or, where control events may
    have been lost, until it is acknowledged; its ``events_lost`` alert is raised exactly while it
    is open."""

    __slots__ = ("seen", "open", "key_partition", "control_partition")

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self.seen = 0
        """The newest gap id taken (gaps arrive again with every batch: older ones are skipped)."""
        self.open: dict[int, dict[str, Any]] = {}
        """id -> {gap, owed (nodes that must restate), control (control events may be lost), until
        (cluster time the freeze ends; None: none), acked}."""
        self.key_partition: int | None = None
        """The events partition of the cluster's own events (topology, catalog; control events too with
        ``control_on_events_topic``): None until one is seen."""
        self.control_partition: int | None = None
        """The routed partition of the cluster's last control event (the control topic's, or an events
        partition where old publishers write them): None until one is seen."""
        if data:
            self.seen = int(data.get("seen") or 0)
            self.key_partition = data.get("key_partition")
            self.control_partition = data.get("control_partition")
            self.open = {int(k): {**v, "owed": set(v["owed"])} for k, v in (data.get("open") or {}).items()}

    def __bool__(self) -> bool:
        return bool(self.seen or self.open or self.key_partition is not None or self.control_partition is not None)

    def to_json(self) -> dict[str, Any]:
        return {"seen": self.seen, "key_partition": self.key_partition, "control_partition": self.control_partition,
                "open": {str(k): {**v, "owed": sorted(v["owed"])} for k, v in self.open.items()}}

    def home(self, partition: int, control: bool) -> None:
        """The cluster's own event (``control``: a control event) came from routed ``partition``."""
        if control:
            self.control_partition = partition
        if not is_control(partition):
            self.key_partition = partition

    def skip(self, gid: int) -> None:
        """Gap ``gid`` cannot concern the cluster (met later than a lease after it): mark it seen."""
        self.seen = max(self.seen, gid)

    def frozen(self, now: int | None) -> bool:
        """A gap may hide a service hold and its window has not run out, unacknowledged: the safe point holds."""
        return any(g["until"] is not None and not g["acked"] and (now is None or now < g["until"]) for g in self.open.values())

    def take(self, gap: Gap, owed: Iterable[str], own: bool, holds: bool, now: int | None, max_ttl: int,
             book: AlertBook) -> Output:
        """Open ``gap``: ``owed`` must restate; ``own``: the cluster's own events may be in it (it stays
        open until acknowledged); ``holds``: a service hold may be (the safe point holds ``max_ttl``).
        Its ``events_lost`` alert's message."""
        self.seen = max(self.seen, gap.id)
        at = gap.ms if now is None else now
        entry = {"gap": gap.to_json(), "owed": set(owed), "control": own,
                 "until": at + max_ttl if own and holds and max_ttl else None, "acked": False}
        self.open[gap.id] = entry
        return book.raise_(self._body(gap.id, entry, at), at)

    def _body(self, gid: int, entry: dict[str, Any], now: int) -> AlertBody:
        gap = Gap.of(entry["gap"])
        owed = sorted(entry["owed"])
        nodes = ", ".join(owed[:NAMED]) + (f" and {len(owed) - NAMED} more" if len(owed) > NAMED else "")
        detail = gap.what() + (f"; nodes whose events live there must restate their holds (a snapshot): {nodes}"
                               if owed else "" if gap.control else "; no known node's events live there")
        if entry["control"]:
            lost = ("the cluster's control events (service holds, pause, resume)" if gap.control else
                    "the cluster's own events (topology, catalog" + (", control events)" if entry["until"] is not None
                                                                     else ")"))
            consequences = [] if gap.control else ["every node live then or seen since counts as a member until the "
                                                   "next topology", "the catalog floor holds"]
            if entry["until"] is not None:
                consequences.append(f"the safe point holds until cluster time {entry['until']} "
                                    "(max_service_hold_ttl_ms after the gap)")
            detail += (f"; {lost} may have been lost" + (": " + ", ".join(consequences) if consequences else "") +
                       "; the gap stays open until an operator acknowledges it (safepoint ack-gap)")
        return {"id": join_id("events_lost", str(gid)), "kind": "events_lost", "node": None, "severity": "critical",
                "value": max(gap.end - gap.first, 0) if gap.kind == "lost" else None, "threshold": None, "since": now,
                "detail": detail}

    def restated(self, node: str) -> None:
        for entry in self.open.values():
            entry["owed"].discard(node)

    def ack(self, gid: int | None) -> list[int]:
        """An operator acknowledged gap ``gid`` (None: every open one): the ids it applied to."""
        ids = [gid] if gid is not None and gid in self.open else sorted(self.open) if gid is None else []
        for i in ids:
            self.open[i]["acked"] = True
        return ids

    def settle(self, members: set[str] | None, now: int, book: AlertBook) -> tuple[bool, list[Output]]:
        """Close the gaps that are resolved (their alert cleared); ``members``: the member set when a
        topology names it (a node that left it owes nothing). Returns (a gap closed, the clearing
        messages). (A freeze that ends needs no word: the round it held kept the cluster dirty.)"""
        moved = False
        out: list[Output] = []
        for gid in sorted(self.open):
            entry = self.open[gid]
            if members is not None and entry["owed"]:
                entry["owed"] &= members
            if entry["owed"] or (entry["control"] and not entry["acked"]):
                continue
            del self.open[gid]
            cleared = book.clear(join_id("events_lost", str(gid)), now)
            if cleared is not None:
                out.append(cleared)
            moved = True
        return moved, out

    def status(self) -> list[dict[str, Any]]:
        """The open gaps as the cluster's status lists them."""
        out = []
        for _gid, entry in sorted(self.open.items()):
            owed = sorted(entry["owed"])
            out.append({**entry["gap"], "owed": len(owed), "owed_nodes": owed[:NAMED], "control_lost": entry["control"],
                        "holds_until": entry["until"], "acknowledged": entry["acked"]})
        return out

