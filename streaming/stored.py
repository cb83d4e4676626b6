"""The job's bytes: how the router hands a cluster's records to its operator, and how the operator
stores a cluster's state and its nodes' buckets in Spark's state store.

The core (``core/batch.py``) works on records and states; this module alone turns them into bytes
and back, so that a layout change is made here and nowhere in the core.

- **The router's hand-off** (``pack_group``, ``unpack_group``): one cluster's ``Group`` of one
  micro-batch (the ``Routed`` records the router parsed, the ``Raw`` ones it handed through
  unread), MessagePack, or a pickle where MessagePack cannot carry a value as it is.
- **A bucket** (``encode_bucket``, ``bucket_entries``): ``[version, node_buckets, [each node's compact
  stored form (NodeState.to_stored: its fields by position)]]`` in MessagePack; values of state
  version 3 (JSON text, the first layout of one operator) are still read.
- **A cluster** (``encode_cluster``, ``decode_cluster``): ``ClusterState.to_json``'s value in
  MessagePack (JSON text, the older layout, still read).

``stored_nodes`` reads a ``BucketNodes``'s buckets from their stored values, and ``stored_buckets``
(``written_buckets``, keeping them) writes back the ones a batch touched; ``stored_cluster`` and
``written_cluster`` do the same for a cluster's value.

**Kept states** (``Kept``, one per process: ``KEPT``): what an operator wrote at the end of a batch,
its bytes beside the states they were made from. When the store gives back the very bytes this
process last wrote for a cluster or a bucket, the next batch takes the states as they are instead of
decoding them (a byte comparison instead of a decode); any other bytes (another worker's, a retried
batch's older version, a restart) are decoded as before. A state is taken out when read and put back
only with the bytes made from it, so one a failed batch changed is never used again.
"""

from __future__ import annotations

import json
import pickle
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from safepoint.core.batch import BucketNodes, Group, Raw, Routed
from safepoint.core.cluster import ClusterState
from safepoint.core.node import NodeState
from safepoint.errors import ConfigError

__all__ = [
    "BUCKET_STATE_VERSION",
    "KEPT",
    "Kept",
    "bucket_entries",
    "decode_cluster",
    "encode_bucket",
    "encode_cluster",
    "pack_group",
    "stored_buckets",
    "stored_cluster",
    "stored_nodes",
    "unpack_group",
    "unpack_groups",
    "written_buckets",
    "written_cluster",
]

BUCKET_STATE_VERSION = 4
"""The layout of a bucket's stored value (above); 3: JSON text, still read. A newer version than
this one is refused."""

_PACK = msgspec.msgpack.Encoder()
_UNPACK = msgspec.msgpack.Decoder()
_UNPACK_GROUP = msgspec.msgpack.Decoder(tuple[list[Routed], list[Raw]])
_PICKLED = b"\x80"
"""The first byte of a pickle (protocol 2 and later); a MessagePack array never starts with it."""


def pack_group(group: Group) -> bytes:
    """One cluster's ``Group`` as the router hands it to the operator, within one micro-batch:
    MessagePack (about 15 times faster to write than a pickle and 2.5 times faster to read back as
    records), or a pickle where MessagePack cannot carry a parsed value as it is (a number with a
    fraction, kept as its own type by the parser, an integer beyond 64 bits, text with a lone
    surrogate). A ``Raw`` record's key and value are bytes, which it always carries."""
    try:
        return _PACK.encode(group)
    except (TypeError, OverflowError, UnicodeEncodeError):
        return pickle.dumps(tuple(group), 5)


def unpack_group(blob: bytes) -> Group:
    """The ``Group`` of ``pack_group``'s value."""
    if blob[:1] == _PICKLED:
        routed, raw = pickle.loads(blob)  # noqa: S301 - packed by this query's router
        return Group(routed, raw)
    return Group(*_UNPACK_GROUP.decode(blob))


def unpack_groups(blobs: Iterable[bytes]) -> Group:
    """One cluster's ``Group`` of a micro-batch from the values ``pack_group`` made of its parts (one
    per read task and chunk)."""
    routed: list[Routed] = []
    raw: list[Raw] = []
    for blob in blobs:
        group = unpack_group(blob)
        routed.extend(group.routed)
        raw.extend(group.raw)
    return Group(routed, raw)


def encode_bucket(nodes: Iterable[NodeState | list[Any]], buckets: int) -> bytes:
    """A bucket's stored value: the states of its nodes, each in its compact form (a node given in
    that form already is written as it is)."""
    return _bucket_value(_forms(nodes), buckets)


def _bucket_value(forms: list[list[Any]], buckets: int) -> bytes:
    """A bucket's stored value of its nodes' compact forms."""
    return _PACK.encode([BUCKET_STATE_VERSION, buckets, forms])


def _forms(nodes: Iterable[NodeState | list[Any]]) -> list[list[Any]]:
    """Each node's compact stored form (one given in that form already as it is)."""
    return [ns if isinstance(ns, list) else ns.to_stored() for ns in nodes]


def bucket_entries(stored: bytes, buckets: int) -> dict[str, NodeState | list[Any]]:
    """A bucket's nodes by name, each in its compact stored form (``NodeState.from_stored`` makes
    the state), or as a state where the value has the older layout (refused: another
    ``node_buckets``, a newer version)."""
    if stored[:1] == b"{":  # state version 3: JSON, each node by name
        data = json.loads(stored)
        version, written_with, nodes = data.get("v", 1), data.get("b"), data["nodes"]
    else:
        version, written_with, nodes = _UNPACK.decode(stored)
    if version > BUCKET_STATE_VERSION:
        msg = (f"this checkpoint's state was written by a newer safepoint (state version {version}, this one "
               f"reads up to {BUCKET_STATE_VERSION}): run that version, or start from a new checkpoint")
        raise ConfigError(msg)
    if written_with != buckets:
        msg = (f"node_buckets is {buckets} but this checkpoint's state was written with {written_with}: "
               "keep the old value or start from a new checkpoint")
        raise ConfigError(msg)
    if version < 4:
        return {raw["node"]: NodeState.from_json(raw) for raw in nodes}
    return {raw[0]: raw for raw in nodes}  # STORED_FIELDS begins with the node's name


def encode_cluster(state: ClusterState) -> bytes:
    """A cluster's stored value."""
    return _PACK.encode(state.to_json())


def decode_cluster(stored: bytes) -> ClusterState:
    """The cluster state of ``encode_cluster``'s value (or of the older JSON text)."""
    return ClusterState.from_json(json.loads(stored) if stored[:1] == b"{" else _UNPACK.decode(stored))


def stored_cluster(cluster: str, stored: bytes, kept: Kept | None = None, scope: str = "") -> ClusterState:
    """The cluster's state of its stored value (``decode_cluster``); with ``kept``, the state this
    process kept with those very bytes (``written_cluster``, under ``scope``) where it has it."""
    state: ClusterState | None = None if kept is None else kept.take((scope, cluster, Kept.CLUSTER), stored)
    return decode_cluster(stored) if state is None else state


def written_cluster(state: ClusterState, kept: Kept | None = None, scope: str = "") -> bytes:
    """``encode_cluster`` of a batch's cluster state, and with ``kept`` the state kept with it."""
    value = encode_cluster(state)
    if kept is not None:
        kept.wrote((scope, state.name, Kept.CLUSTER), value, state)
    return value


def stored_nodes(cluster: str, buckets: int, load: Callable[[int], bytes | None],
                 kept: Kept | None = None, scope: str = "") -> BucketNodes:
    """A ``BucketNodes`` over encoded buckets: ``load(bucket)`` gives a bucket's stored value or None.
    With ``kept``, a bucket whose value is the one this process last wrote for it (``Kept.wrote``,
    under ``scope``) comes back as the states it was made from."""

    def entries(bucket: int) -> dict[str, NodeState | list[Any]] | None:
        value = load(bucket)
        if value is None:
            return None
        if kept is not None:
            found: tuple[dict[str, NodeState | list[Any]], dict[str, list[Any]]] | None = kept.take(
                (scope, cluster, bucket), value)
            if found is not None:
                states, forms = found
                nodes.written.update(forms)
                return states
        return bucket_entries(value, buckets)

    nodes = BucketNodes(cluster, buckets, entries)
    return nodes


def written_buckets(nodes: BucketNodes, touched: Mapping[int, Iterable[NodeState | list[Any]]], buckets: int,
                    kept: Kept | None = None, scope: str = "") -> dict[int, bytes]:
    """``stored_buckets`` of a batch's ``nodes`` (``touched``: their ``dump``), and with ``kept``
    each bucket's states kept with the value written, and the stored form each was written in (a
    state the next batch does not look up is written in that form again, not made again)."""
    out: dict[int, bytes] = {}
    for bucket, entries in touched.items():
        forms = _forms(entries)
        value = out[bucket] = _bucket_value(forms, buckets)
        if kept is not None:
            states = nodes.loaded[bucket]
            kept.wrote((scope, nodes.cluster, bucket), value,
                       (states, {name: form for (name, e), form in zip(states.items(), forms, strict=True)
                                 if isinstance(e, NodeState)}))
    return out


class Kept:
    """The states this process last wrote, each with its stored bytes, by (scope, cluster, bucket)
    (the cluster's own state at bucket -1): the oldest dropped past ``limit`` bytes of stored values
    (16 MB: about 70,000 nodes with their clusters' values, at about 220 B stored a node in the
    bench's workload; kept as states they take about sixteen times their stored bytes, so some
    250 MB of a worker).
    ``hits`` and ``misses`` count the reads that found a state kept, and those that found none or
    other bytes."""

    CLUSTER = -1

    def __init__(self, limit: int = 16 << 20) -> None:
        self.limit = limit
        self.entries: OrderedDict[tuple[str, str, int], tuple[bytes, Any]] = OrderedDict()
        self.size = 0
        """The stored values' bytes of ``entries``."""
        self.hits = 0
        self.misses = 0

    def take(self, key: tuple[str, str, int], stored: bytes) -> Any:
        """What was kept at ``key`` if ``stored`` is the value it was kept with, else None; either
        way nothing stays kept there (the caller may change what it takes)."""
        kept = self.entries.pop(key, None)
        if kept is not None:
            self.size -= len(kept[0])
            if kept[0] == stored:
                self.hits += 1
                return kept[1]
        self.misses += 1
        return None

    def wrote(self, key: tuple[str, str, int], stored: bytes, value: Any) -> None:
        """Keep ``value``, the state ``stored`` was just made from (it must not change after)."""
        old = self.entries.pop(key, None)
        if old is not None:
            self.size -= len(old[0])
        self.entries[key] = (stored, value)
        self.size += len(stored)
        while self.size > self.limit and self.entries:
            _key, (dropped, _value) = self.entries.popitem(last=False)
            self.size -= len(dropped)

    def forget(self, scope: str | None = None, which: Callable[[tuple[str, str, int]], bool] | None = None) -> None:
        """Drop every state kept (under ``scope``: that scope's only; with ``which``, those it picks)."""
        for key in [k for k in self.entries if (scope is None or k[0] == scope) and (which is None or which(k))]:
            self.size -= len(self.entries.pop(key)[0])


KEPT = Kept()
"""This process's kept states (a Python worker runs batch after batch: ``spark.python.worker.reuse``)."""


def stored_buckets(touched: Mapping[int, Iterable[NodeState | list[Any]]], buckets: int) -> dict[int, bytes]:
    """The stored value of each bucket a batch touched (``BucketNodes.dump``, a ``BatchResult``'s
    ``buckets``), written with ``buckets`` as ``node_buckets``."""
    return {bucket: encode_bucket(entries, buckets) for bucket, entries in touched.items()}
