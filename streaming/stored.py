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
writes back the ones a batch touched.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from safepoint.core.batch import BucketNodes, Group, Raw, Routed
from safepoint.core.cluster import ClusterState
from safepoint.core.node import NodeState
from safepoint.errors import ConfigError

__all__ = [
    "BUCKET_STATE_VERSION",
    "bucket_entries",
    "decode_cluster",
    "encode_bucket",
    "encode_cluster",
    "pack_group",
    "stored_buckets",
    "stored_nodes",
    "unpack_group",
    "unpack_groups",
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
    return _PACK.encode([BUCKET_STATE_VERSION, buckets, [ns if isinstance(ns, list) else ns.to_stored() for ns in nodes]])


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


def stored_nodes(cluster: str, buckets: int, load: Callable[[int], bytes | None]) -> BucketNodes:
    """A ``BucketNodes`` over encoded buckets: ``load(bucket)`` gives a bucket's stored value or None."""

    def entries(bucket: int) -> dict[str, NodeState | list[Any]] | None:
        value = load(bucket)
        return None if value is None else bucket_entries(value, buckets)

    return BucketNodes(cluster, buckets, entries)


def stored_buckets(touched: Mapping[int, Iterable[NodeState | list[Any]]], buckets: int) -> dict[int, bytes]:
    """The stored value of each bucket a batch touched (``BucketNodes.dump``, a ``BatchResult``'s
    ``buckets``), written with ``buckets`` as ``node_buckets``."""
    return {bucket: encode_bucket(entries, buckets) for bucket, entries in touched.items()}
