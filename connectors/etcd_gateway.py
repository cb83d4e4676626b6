"""etcd's v3 API through its HTTP gateway (JSON; every etcd 3.4+ member serves it on its client URL).

What the etcd agent (``connectors/etcd_agent.py``) and the revision holders
(``connectors/etcd_holds.py``) need, and no more: the store's current revision, the members and
their status (``dbSize``, ``dbSizeInUse``), the compacted revision, ``Compact``, ``Defragment``, a
range read at a revision, a watch, and what a member was started with (its auto-compaction).

``EtcdGateway`` takes several endpoints (the members' client URLs) and sends each request to the
one that answered last, trying the others in turn when it cannot be reached: a member's or the
leader's restart costs one failed attempt, not an error. Every endpoint down raises
``EtcdUnavailable``; an answer of etcd's own (a compacted revision, a future one) raises
``EtcdError`` with etcd's message, never retried on another member (it would say the same).

The gateway writes 64-bit integers as strings and keys and values as base64: this module turns
them back into ints and bytes.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from safepoint.errors import SafepointError

__all__ = ["EtcdError", "EtcdGateway", "EtcdUnavailable", "MemberStatus", "RevisionCompacted", "parse_endpoints"]

log = logging.getLogger("safepoint.etcd")

OUT_OF_RANGE = 11
"""gRPC's OutOfRange: etcd's code for a compacted (or a future) revision."""
TRANSIENT = (4, 14)
"""gRPC's DeadlineExceeded and Unavailable: no leader, the leader changed, a request timed out."""
ROUNDS = 3
ROUND_PAUSE_S = 0.3


class EtcdUnavailable(SafepointError):
    """No endpoint of the etcd cluster answered."""


class EtcdError(SafepointError):
    """etcd answered with an error of its own (``code``: gRPC's, ``message``: etcd's)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class RevisionCompacted(EtcdError):
    """"mvcc: required revision has been compacted": the revision asked for is below the compacted one."""


@dataclass(frozen=True)
class MemberStatus:
    endpoint: str
    member_id: str
    leader: str
    revision: int
    db_size: int
    db_size_in_use: int
    raft_index: int

    @property
    def is_leader(self) -> bool:
        return self.member_id == self.leader

    @property
    def free_bytes(self) -> int:
        """Pages compaction freed that only a defragmentation gives back to the file system."""
        return max(0, self.db_size - self.db_size_in_use)


def parse_endpoints(text: str | Sequence[str]) -> list[str]:
    """``http://a:2379,http://b:2379`` (or a list) as a list of base URLs without a trailing slash."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = [e.strip().rstrip("/") for e in items if e.strip()]
    if not out:
        msg = "no etcd endpoint given (--endpoints http://127.0.0.1:2379[,...])"
        raise ValueError(msg)
    for e in out:
        if not e.startswith(("http://", "https://")):
            msg = f"etcd endpoint {e!r} is not an http(s) URL (the agent speaks etcd's HTTP gateway)"
            raise ValueError(msg)
    return out


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


class EtcdGateway:
    def __init__(self, endpoints: str | Sequence[str], timeout_s: float = 5.0) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s)
        self._preferred = 0

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EtcdGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport --------------------------------------------------------------------
    def _order(self) -> list[int]:
        n = len(self.endpoints)
        return [(self._preferred + i) % n for i in range(n)]

    def call(self, path: str, body: dict[str, Any] | None = None, endpoint: str | None = None) -> dict[str, Any]:
        """POST ``body`` to ``path`` on ``endpoint`` (or on the members in turn) and return the answer.
        A member that cannot be reached, or answers that it cannot serve now (503: no leader, the
        leader changed, a timeout), is passed for the next; ``ROUNDS`` passes over the members, a
        short wait apart, ride out an election. A request to one ``endpoint`` is tried once."""
        tried: list[str] = []
        for round_ in range(ROUNDS if endpoint is None else 1):  # one member asked: once (a hung one costs one timeout)
            if round_:
                time.sleep(ROUND_PAUSE_S)
            for i in ([None] if endpoint is not None else self._order()):
                url = endpoint if endpoint is not None else self.endpoints[i]  # type: ignore[index]
                try:
                    resp = self._client.post(url + path, content=json.dumps(body or {}))
                    got = _answer(resp)
                except httpx.HTTPError as exc:
                    tried.append(f"{url}: {exc.__class__.__name__} {exc}".rstrip())
                    continue
                except EtcdError as exc:
                    if exc.code not in TRANSIENT and resp.status_code != 503:
                        raise
                    tried.append(f"{url}: {exc}")
                    continue
                if i is not None:
                    self._preferred = i
                return got
        msg = f"no etcd endpoint answered {path}: " + "; ".join(tried[-len(self.endpoints):])
        raise EtcdUnavailable(msg)

    # -- the store -----------------------------------------------------------------------
    def revision(self) -> int:
        """The store's current revision (a serializable read of any member)."""
        header = self.call("/v3/kv/range", {"key": b64("\0"), "count_only": True, "serializable": False})["header"]
        return int(header.get("revision", 0))

    def put(self, key: str | bytes, value: str | bytes) -> int:
        """Write one key; the revision it made."""
        return int(self.call("/v3/kv/put", {"key": b64(key), "value": b64(value)})["header"]["revision"])

    def range(self, key: str | bytes, range_end: str | bytes | None = None, *, revision: int | None = None,
              limit: int = 0) -> tuple[list[tuple[bytes, bytes, int]], bool, int]:
        """Keys from ``key`` to ``range_end`` at ``revision`` (None: the newest): ([(key, value,
        mod_revision)], more, the header's revision). Raises ``RevisionCompacted`` below the
        compacted revision."""
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        if revision is not None:
            body["revision"] = str(revision)
        if limit:
            body["limit"] = str(limit)
        got = self.call("/v3/kv/range", body)
        kvs = [(unb64(kv.get("key")), unb64(kv.get("value")), int(kv.get("mod_revision", 0))) for kv in got.get("kvs", [])]
        return kvs, bool(got.get("more")), int(got["header"].get("revision", 0))

    def readable(self, revision: int) -> bool:
        """A read at ``revision`` works (it is at or above the compacted revision)."""
        try:
            self.call("/v3/kv/range", {"key": b64("\0"), "count_only": True, "revision": str(revision)})
        except RevisionCompacted:
            return False
        return True

    def compacted_revision(self, at_least: int = 0) -> int:
        """The store's compacted revision (0: never compacted): the lowest revision a read still
        works at. ``at_least``: a revision known to be at or below it (what was compacted before);
        one request when nothing moved since, else a halving up to the current revision."""
        low = max(at_least, 1)
        if self.readable(low):
            return at_least
        high = self.revision()  # a read at the current revision always works
        while high - low > 1:  # low: not readable, high: readable
            mid = (low + high) // 2
            if self.readable(mid):
                high = mid
            else:
                low = mid
        return high

    def compact(self, revision: int, physical: bool = False) -> None:
        """etcd's Compact: drop the history below ``revision`` (a read at it still works)."""
        self.call("/v3/kv/compaction", {"revision": str(revision), "physical": physical})

    # -- members -------------------------------------------------------------------------
    def members(self) -> list[dict[str, Any]]:
        """The cluster's members (``ID``, ``name``, ``clientURLs``, ``peerURLs``)."""
        return list(self.call("/v3/cluster/member/list").get("members", []))

    def member_endpoints(self) -> list[str]:
        """The client URLs of every member (what the cluster says, else the endpoints given)."""
        try:
            urls = [u.rstrip("/") for m in self.members() for u in m.get("clientURLs", [])[:1]]
        except (EtcdUnavailable, EtcdError):
            return list(self.endpoints)
        return urls or list(self.endpoints)

    def status(self, endpoint: str) -> MemberStatus:
        got = self.call("/v3/maintenance/status", endpoint=endpoint)
        header = got.get("header", {})
        return MemberStatus(endpoint, str(header.get("member_id", "")), str(got.get("leader", "")),
                            int(header.get("revision", 0)), int(got.get("dbSize", 0)),
                            int(got.get("dbSizeInUse", got.get("dbSize", 0))), int(got.get("raftIndex", 0)))

    def defragment(self, endpoint: str) -> None:
        """etcd's Defragment of one member (it blocks that member's reads and writes meanwhile)."""
        self.call("/v3/maintenance/defragment", endpoint=endpoint)

    def auto_compaction(self, endpoint: str) -> str | None:
        """The auto-compaction a member was started with, from its command line (Go's ``/debug/vars``):
        ``"periodic 1h"`` and the like, None when it is off, or ``"unknown: why"`` when the command
        line cannot tell (a config file, an endpoint without ``/debug/vars``)."""
        try:
            resp = self._client.get(endpoint + "/debug/vars")
            cmdline = resp.json().get("cmdline") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            return f"unknown: {endpoint}/debug/vars could not be read ({exc.__class__.__name__})"
        if not isinstance(cmdline, list):
            return f"unknown: {endpoint}/debug/vars has no command line"
        flags = _flags([str(a) for a in cmdline[1:]])
        if "config-file" in flags:
            return f"unknown: started with --config-file {flags['config-file']}"
        retention = flags.get("auto-compaction-retention", "0")
        if retention.strip() in ("", "0", "0s", "0m", "0h"):
            return None
        return f"{flags.get('auto-compaction-mode', 'periodic')} {retention}"

    def watch(self, key: str | bytes, range_end: str | bytes | None, start_revision: int,
              endpoint: str | None = None) -> Iterator[dict[str, Any]]:
        """The watch's responses (each ``{"events": [...], "header": ...}``) from ``start_revision``
        on, on one member, until the caller stops iterating. A watch below the compacted revision
        ends with ``RevisionCompacted``."""
        create: dict[str, Any] = {"key": b64(key), "start_revision": str(start_revision)}
        if range_end is not None:
            create["range_end"] = b64(range_end)
        url = endpoint or self.endpoints[self._preferred]
        with httpx.Client(timeout=httpx.Timeout(self.timeout_s, read=None)) as client, client.stream(
                "POST", url + "/v3/watch", content=json.dumps({"create_request": create})) as resp:
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                result = json.loads(line).get("result") or {}
                if result.get("canceled"):
                    compact = int(result.get("compact_revision", 0))
                    if compact:
                        msg = f"watch from revision {start_revision}: compacted up to {compact}"
                        raise RevisionCompacted(msg, OUT_OF_RANGE)
                    msg_0 = f"watch canceled: {result.get('cancel_reason', '')}"
                    raise EtcdError(msg_0)
                if result.get("events"):
                    yield result


def _flags(args: list[str]) -> dict[str, str]:
    """``--name value`` and ``--name=value`` as {name: value}."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-"):
            name = a.lstrip("-")
            if "=" in name:
                k, v = name.split("=", 1)
                out[k] = v
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                out[name] = args[i + 1]
                i += 1
            else:
                out[name] = "true"
        i += 1
    return out


def _answer(resp: httpx.Response) -> dict[str, Any]:
    try:
        got = resp.json()
    except ValueError:
        got = None
    if resp.status_code == 200 and isinstance(got, dict) and "error" not in got:
        return got
    message = (got or {}).get("message") or (got or {}).get("error") if isinstance(got, dict) else None
    message = message or f"HTTP {resp.status_code}: {resp.text[:200]}"
    code = got.get("code") if isinstance(got, dict) else None
    if code == OUT_OF_RANGE and "compacted" in message:
        raise RevisionCompacted(message, code)
    raise EtcdError(message, code)
