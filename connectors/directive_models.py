"""What the job tells nodes, as the node client reads it: the directive models and the apply rule.

``Directive`` is a compaction directive (its ``safe_ts`` and ``catalog_floor``), ``ExpireDirective``
a forced expiry of one reader or transaction, ``compact_up_to`` the contract's apply rule and
``ListenerStats`` what a ``DirectiveListener`` counted. The
schemas in ``schemas/outputs/`` say what is valid; ``validator(name)`` checks a decoded message
against one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import fastjsonschema

from safepoint.schemas import load

__all__ = [
    "BAND",
    "DEFAULT_DIRECTIVES_TOPIC",
    "SNAPSHOT_REQUEST",
    "Directive",
    "ExpireDirective",
    "ListenerStats",
    "compact_up_to",
    "validator",
]

DEFAULT_DIRECTIVES_TOPIC = "safepoint.directives"
SNAPSHOT_REQUEST = "snapshot_request"
BAND = "band"


@dataclass(frozen=True, slots=True)
class Directive:
    """A compaction directive (contract: Directives). ``raw`` is the whole JSON object."""

    cluster: str
    seq: int
    safe_ts: int
    catalog_floor: int | None
    cluster_wall_ms: int
    blocker: dict[str, Any] | None
    basis: dict[str, Any]
    raw: dict[str, Any] = field(repr=False, compare=False)
    namespace_safe_ts: int | None = None
    """The bound of a namespace without holds of its own (None: the cluster has no namespaced holds)."""
    namespaces: dict[str, int] = field(default_factory=dict)
    """The bound of each namespace with holds of its own."""
    emergency: dict[str, Any] | None = None
    """While the cluster is in emergency: ``since_wall_ms`` and ``compaction_budget``, the multiple of
    its normal compaction budget a node should raise its effort up to (None: no emergency)."""
    generation: str | None = None
    """The job's generation: the id of its state's lifetime (None: a job that gives none)."""

    def bound(self, namespace: str | None) -> int:
        """What a hold of ``namespace`` may compact up to (``safe_ts`` for no namespace)."""
        if namespace is None or self.namespace_safe_ts is None:
            return self.safe_ts
        return self.namespaces.get(namespace, self.namespace_safe_ts)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Directive:
        return cls(
            cluster=obj["cluster"],
            seq=obj["seq"],
            safe_ts=obj["safe_ts"],
            catalog_floor=obj["catalog_floor"],
            cluster_wall_ms=obj["cluster_wall_ms"],
            blocker=obj["blocker"],
            basis=obj["basis"],
            raw=obj,
            namespace_safe_ts=obj.get("namespace_safe_ts"),
            namespaces=dict(obj.get("namespaces") or {}),
            emergency=dict(obj["emergency"]) if isinstance(obj.get("emergency"), dict) else None,
            generation=obj.get("generation"),
        )


@dataclass(frozen=True, slots=True)
class ExpireDirective:
    """A forced expiry of one reader (``reader_id``) or transaction (``tx_id``) on ``node``."""

    cluster: str
    seq: int
    node: str
    reader_id: str | None
    tx_id: str | None
    reason: str
    mode: str
    """``graceful`` (let it finish its current step) or ``hard`` (stop it now)."""
    raw: dict[str, Any] = field(repr=False, compare=False)
    cluster_wall_ms: int | None = None
    """The cluster time when the job decided (optional in the schema)."""

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ExpireDirective:
        return cls(
            cluster=obj["cluster"],
            seq=obj["seq"],
            node=obj["node"],
            reader_id=obj.get("reader_id"),
            tx_id=obj.get("tx_id"),
            reason=obj["reason"],
            mode=obj["mode"],
            raw=obj,
            cluster_wall_ms=obj.get("cluster_wall_ms"),
        )


def compact_up_to(directive: Directive | Mapping[str, Any] | int, oldest_local_hold: int | None,
                  namespace: str | None = None) -> int:
    """The contract's apply rule: compact up to min(``safe_ts``, the node's own oldest local hold).

    ``oldest_local_hold`` is the smallest ``read_ts``/``begin_ts`` the node itself still serves
    (None when it has none). A node never compacts past its own holds, whatever the directive says.
    With ``namespace``, the bound is that namespace's (``namespaces[ns]``, else ``namespace_safe_ts``,
    else ``safe_ts``): pass the namespace's own oldest local hold then.
    """
    if isinstance(directive, Directive):
        safe_ts = directive.bound(namespace)
    elif isinstance(directive, int):
        safe_ts = directive
    else:  # a directive's JSON object (only safe_ts is needed; the namespace fields when given)
        safe_ts = int(directive["safe_ts"])
        if namespace is not None and directive.get("namespace_safe_ts") is not None:
            safe_ts = int((directive.get("namespaces") or {}).get(namespace, directive["namespace_safe_ts"]))
    if oldest_local_hold is None:
        return safe_ts
    return min(safe_ts, oldest_local_hold)


@dataclass(frozen=True, slots=True)
class ListenerStats:
    """Counters of one listener (since it was made)."""

    received: int
    """Messages read from the topic (any cluster)."""
    delivered: int
    """Compaction directives delivered (their seq advanced)."""
    repeats: int
    """Directives of this cluster ignored because their seq did not advance."""
    superseded: int
    """Backlog directives skipped at start because a newer one followed."""
    other_clusters: int
    """Messages for other clusters."""
    invalid: int
    """Messages that are not a valid directive (logged and skipped)."""
    expires_delivered: int
    """Expiry directives for this node (or, without a node, this cluster) handed to the reporter and on_expire."""
    backlog_expires_skipped: int
    """Expiry directives of the backlog at start naming a reader or transaction the reporter does not
    have open (they died with an earlier process); only with ``reporter=``."""
    handler_failures: int
    """Exceptions raised by on_directive, on_expire or the reporter's expire (logged)."""
    snapshot_requests: int = 0
    """Snapshot requests for this node (after a start of the job on empty state) answered with the
    reporter's snapshot; requests met in the backlog at start are answered once, after it."""
    bands: int = 0
    """Band directives for this node handed to the reporter (its admission control follows them)."""
    unsigned: int = 0
    """Directives without a signature, not acted on (the listener has a ``directive_key``)."""
    bad_signatures: int = 0
    """Directives whose signature none of the listener's keys gives (forged, or signed by a key rotated
    out): not acted on."""
    generations: int = 0
    """Times a new generation of the job (a job that started on empty state) was taken up."""
    held_back: int = 0
    """Directives of a new generation not taken because their ``safe_ts`` lies below the one this node
    already has: the node does not go back; the new job's safe point catches up."""


@cache
def validator(name: str) -> Callable[[Any], Any]:
    validate: Callable[[Any], Any] = fastjsonschema.compile(load("outputs", name))
    return validate
