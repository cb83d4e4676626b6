"""Alert ids and directive keys: ``/``-joined parts, each part escaped so that any id is unambiguous.

Node, reader, transaction and group ids are free text on the wire; ``/`` inside one would make two
different holds share an alert id (``horizon_violation/n1/reader/a/b`` could be reader ``a/b`` or
...) and a clear of one read as a clear of the other. Each part is escaped: ``%`` becomes ``%25``
and ``/`` becomes ``%2F`` (nothing else changes, so ordinary ids read as they are), then the
parts are joined with ``/``. ``split_id`` undoes it.
"""

from __future__ import annotations

__all__ = ["CLUSTER_HEADER", "escape", "hold_key", "join_id", "split_id", "unescape"]

CLUSTER_HEADER = "safepoint-cluster"
"""The Kafka record header in which a publisher names its event's cluster (the cluster id in UTF-8):
the job groups the record by it without reading the value (the contract's "Topics")."""


def escape(part: str) -> str:
    """One part of an id, with ``%`` and ``/`` escaped."""
    if "%" not in part and "/" not in part:
        return part
    return part.replace("%", "%25").replace("/", "%2F")


def unescape(part: str) -> str:
    return part.replace("%2F", "/").replace("%25", "%") if "%" in part else part


def join_id(*parts: str) -> str:
    """The id of ``parts``: each escaped, joined with ``/``."""
    plain = "".join(parts)
    if "/" not in plain and "%" not in plain:
        return "/".join(parts)  # nothing to escape: the common case, without a call per part
    return "/".join(escape(p) for p in parts)


def hold_key(kind: str, hid: str) -> str:
    """``join_id(kind, hid)`` for a hold's ``kind`` (``reader``, ``tx``: nothing to escape), the
    key of a hold in its node's record, without the general call's cost."""
    if "/" in hid or "%" in hid:
        return join_id(kind, hid)
    return kind + "/" + hid


def split_id(text: str) -> list[str]:
    """The parts of an id made by ``join_id``."""
    return [unescape(p) for p in text.split("/")]
