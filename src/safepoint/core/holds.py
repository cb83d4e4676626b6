"""A node's open holds, of every kind: the one place that knows which kinds of hold there are.

A hold is a ``Hold`` (``core/records.py``): a timestamp a node needs kept, when it opened, its
label, the process that opened it and, for a kind that can be prepared, its two-phase commit
fields. Each kind of hold is a ``HoldKind`` registered in ``KINDS``: the events that open and
close one, the fields that name it and its timestamp on the wire, the snapshot's list of them,
the heartbeat's count of them and whether it can be prepared. A node's ``HoldSet`` keeps its holds
by kind and answers what the rules ask of all of them (the earliest opening, the longest open,
the layer above a timestamp, the stored form); nothing outside this module names the kinds one by
one, so a new kind of hold is one ``HoldKind`` here (``docs/architecture.md`` says what else it
needs: its events' schemas, its stored field, the client's calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec import UnsetType

from safepoint.core.event_structs import ReaderOpenStruct, TxBeginStruct
from safepoint.core.records import Hold

__all__ = ["EVENTS", "HELD_AS", "HELD_KINDS", "KIND", "KINDS", "READER", "TX", "HoldKind", "HoldSet", "Oldest",
           "blocker_kind"]

NEVER = float("inf")

Oldest = tuple[str, str, int, str | None]
"""(kind, id, opened_wall, label) of the longest-open hold."""


class HoldKind:
    """One kind of hold as the wire and the rules know it."""

    __slots__ = ("name", "noun", "plural", "opens", "closes", "id_field", "ts_field", "listed", "counted", "preparable",
                 "prepared_name")

    def __init__(self, name: str, noun: str, plural: str, opens: str, closes: str, id_field: str, ts_field: str, listed: str,
                 counted: str, preparable: bool) -> None:
        self.name = name
        """Its name in ``HoldRef``, ``OpenedHold``, a blocker's kind and an expiry."""
        self.noun = noun
        """What a message calls one (``reader``, ``tx``)."""
        self.plural = plural
        """What a message calls a number of them (``3 reader(s)``)."""
        self.opens = opens
        """The event that opens one (its ``type``)."""
        self.closes = closes
        """The event that closes one."""
        self.id_field = id_field
        """The field that names one, in its events, a snapshot's entries and an ``expire`` directive."""
        self.ts_field = ts_field
        """The field of the timestamp it holds, in its opening event and a snapshot's entries."""
        self.listed = listed
        """A snapshot's list of them (and a snapshot part's)."""
        self.counted = counted
        """The heartbeat's count of the node's open ones (the leak watch compares it, ``core/leaks.py``)."""
        self.preparable = preparable
        """It can be prepared (``tx_prepare``): then never expired, and its fate is its coordinator's."""
        self.prepared_name = f"prepared_{name}" if preparable else name
        """What a blocker, a status entry and a cost call a prepared one (``prepared_tx``)."""

    # A kind's fields are named by the registry, so its events are read through these (an event
    # record's own fields are read by name: core/event_records.py).
    def id_of(self, event: Mapping[str, Any]) -> str:
        """The id of the hold an event of this kind opens or closes."""
        hid: str = event[self.id_field]
        return hid

    def listed_in(self, snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A snapshot's (or a snapshot part's) entries of this kind."""
        entries: list[dict[str, Any]] = snapshot[self.listed]
        return entries

    def count_in(self, heartbeat: Mapping[str, Any]) -> int | None:
        """The heartbeat's count of the node's open ones (None: it does not say)."""
        count: int | None = heartbeat.get(self.counted)
        return count

    def opened(self, event: Mapping[str, Any], wall: int, incarnation: int) -> Hold:
        """The hold its opening event opens."""
        return Hold(event[self.ts_field], event.get("opened_wall_ms", wall), event.get("label"), incarnation,
                    namespace=event.get("namespace"))

    def opened_struct(self, event: ReaderOpenStruct | TxBeginStruct, incarnation: int) -> Hold:
        """``opened`` of an opening decoded as a struct (``core/event_structs.py``)."""
        ts: int = getattr(event, self.ts_field)
        opened, label, namespace = event.opened_wall_ms, event.label, event.namespace
        return Hold(ts, event.wall_ms if isinstance(opened, UnsetType) else opened,
                    None if isinstance(label, UnsetType) else label, incarnation,
                    namespace=None if isinstance(namespace, UnsetType) else namespace)

    def listed_hold(self, entry: dict[str, Any], old: Hold | None, wall: int, incarnation: int) -> Hold:
        """The hold a snapshot's entry restates; ``old``: the one held under its key until now, whose
        opening time (and, for a preparable kind, prepared state and namespace) an entry may leave out."""
        opened_wall = entry.get("opened_wall_ms", old.opened_wall if old else wall)
        if not self.preparable:
            return Hold(entry[self.ts_field], opened_wall, entry.get("label"), incarnation,
                        namespace=entry.get("namespace"))
        prepared = bool(entry.get("prepared", old.prepared if old else False))
        prep_wall = old.prepared_wall if old else None  # wall_ms 0 is a time, not "unset"
        if prep_wall is None and prepared:
            prep_wall = wall
        return Hold(entry[self.ts_field], opened_wall, entry.get("label"), incarnation, prepared,
                    entry.get("coordinator", old.coordinator if old else None),
                    entry.get("participants", old.participants if old else None), prep_wall,
                    entry.get("namespace", old.namespace if old else None))


KINDS: list[HoldKind] = []
"""Every kind of hold, in the order the rules walk them (the first of two holds at one timestamp
is the blocker) and the order they were registered."""
KIND: dict[str, HoldKind] = {}
"""A kind's name -> the kind."""
HELD_KINDS: list[str] = []
"""The kinds a blocker, a status entry or a cost names a hold by: every kind's name, then the
prepared names of the kinds that can be prepared (the status's order)."""
HELD_AS: dict[str, str] = {}
"""A blocker's kind -> the kind of hold it is (``prepared_tx`` is a ``tx``)."""
EVENTS: dict[str, tuple[HoldKind, bool]] = {}
"""Event type -> (the kind of hold it opens or closes, True for an opening)."""
STORED_APART = ("reader", "tx")
"""The kinds whose holds have a field of their own in a node's stored form (``readers``, ``txs``);
any other kind's holds are kept in its ``more_holds`` map, by kind (``HoldSet.to_stored``)."""


def register(kind: HoldKind) -> HoldKind:
    """Make ``kind`` a kind of hold: the rules walk it from then on. Its name, events and fields must
    be new (a ``ValueError`` says which is not). The tables above are changed in place, so a module
    that imported them sees the new kind."""
    taken = [what for what, known in (("name", kind.name in KIND), ("opening event", kind.opens in EVENTS),
                                      ("closing event", kind.closes in EVENTS),
                                      ("id field", any(k.id_field == kind.id_field for k in KINDS)),
                                      ("snapshot list", any(k.listed == kind.listed for k in KINDS)))
             if known]
    if taken:
        msg = f"hold kind {kind.name!r}: its {', '.join(taken)} belong to a registered kind"
        raise ValueError(msg)
    KINDS.append(kind)
    KIND[kind.name] = kind
    HELD_AS[kind.name] = kind.name
    HELD_AS[kind.prepared_name] = kind.name
    HELD_KINDS[:] = [*(k.name for k in KINDS), *(k.prepared_name for k in KINDS if k.preparable)]
    EVENTS[kind.opens] = (kind, True)
    EVENTS[kind.closes] = (kind, False)
    return kind


READER = register(HoldKind("reader", "reader", "reader(s)", "reader_open", "reader_close", "reader_id", "read_ts",
                           "readers", "active_readers", False))
"""A snapshot reader: it needs the versions visible at its ``read_ts``."""
TX = register(HoldKind("tx", "tx", "transaction(s)", "tx_begin", "tx_end", "tx_id", "begin_ts", "txs", "active_txs",
                       True))
"""A transaction: it needs the versions visible at its ``begin_ts``; it can be prepared (``tx_prepare``)."""


def blocker_kind(kind: HoldKind, hold: Hold) -> str:
    """The kind a blocker, a status entry and a cost name a hold by: a prepared one is ``prepared_tx``."""
    return kind.prepared_name if hold.prepared else kind.name


class HoldSet:
    """A node's open holds, by kind (each a map from the hold's key to the hold)."""

    __slots__ = ("_by",)

    def __init__(self, by: dict[str, dict[str, Hold]] | None = None) -> None:
        self._by: dict[str, dict[str, Hold]] = by if by is not None else {k.name: {} for k in KINDS}

    def of(self, kind: str) -> dict[str, Hold]:
        """The holds of one kind, by key (the map itself: the rules change it in place)."""
        return self._by[kind]

    def put(self, kind: str, holds: dict[str, Hold]) -> None:
        """Replace the holds of one kind (a snapshot's restatement)."""
        self._by[kind] = holds

    def maps(self) -> list[tuple[str, dict[str, Hold]]]:
        """(kind, its holds by key) for every kind, in ``KINDS`` order."""
        return [(k.name, self._by[k.name]) for k in KINDS]

    def items(self) -> list[tuple[str, str, Hold]]:
        """(kind, key, hold) of every open hold, kind by kind."""
        return [(kind, key, h) for kind, holds in self.maps() for key, h in holds.items()]

    def preparable(self) -> list[tuple[str, Hold]]:
        """(key, hold) of every hold of a kind that can be prepared (transactions)."""
        return [(key, h) for k in KINDS if k.preparable for key, h in self._by[k.name].items()]

    def count(self) -> int:
        return sum(len(holds) for holds in self._by.values())

    def earliest(self) -> tuple[float, float]:
        """(the earliest ``opened_wall`` of a hold, the earliest ``prepared_wall`` of a prepared one):
        infinity for none."""
        first: float = NEVER
        prepared: float = NEVER
        for holds in self._by.values():
            for h in holds.values():
                if h.opened_wall < first:
                    first = float(h.opened_wall)
                if h.prepared and h.prepared_wall is not None and h.prepared_wall < prepared:
                    prepared = float(h.prepared_wall)
        return first, prepared

    def oldest(self) -> Oldest | None:
        """The longest-open hold (the earliest ``opened_wall``; then by kind and key)."""
        best: Oldest | None = None
        best_wall = 0
        for kind, holds in self.maps():
            for hid, h in holds.items():
                wall = h.opened_wall
                if best is None or wall < best_wall or (wall == best_wall and (kind, hid) < (best[0], best[1])):
                    best, best_wall = (kind, hid, wall, h.label), wall
        return best

    def layer(self, ts: int, top: int | None) -> tuple[int | None, int]:
        """(the lowest hold's timestamp above ``ts`` and below ``top``, else ``top``; how many holds
        are at ``ts``): the layer of history a hold at ``ts`` keeps, and who shares it."""
        upper, ties = top, 0
        for holds in self._by.values():
            for h in holds.values():
                if h.ts == ts:
                    ties += 1
                elif h.ts > ts and (upper is None or h.ts < upper):
                    upper = h.ts
        return upper, ties

    def to_stored(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
        """(the readers, the transactions, {kind: its holds} of every other kind), each by key in their
        stored form; None: none."""
        readers, txs = (self._stored(kind) for kind in STORED_APART)
        more = {k.name: held for k in KINDS if k.name not in STORED_APART and (held := self._stored(k.name))}
        return readers, txs, more or None

    def _stored(self, kind: str) -> dict[str, Any] | None:
        return {key: h.to_json() for key, h in self._by[kind].items()} or None

    @classmethod
    def from_stored(cls, readers: dict[str, Any] | None, txs: dict[str, Any] | None,
                    more: dict[str, Any] | None) -> HoldSet:
        """The set ``to_stored`` wrote (a kind not registered now is refused: its holds would be lost)."""
        by: dict[str, dict[str, Hold]] = {k.name: {} for k in KINDS}
        for kind, data in (("reader", readers), ("tx", txs), *(more or {}).items()):
            if data:
                if kind not in by:
                    msg = f"the stored state holds holds of kind {kind!r}, which is not registered"
                    raise ValueError(msg)
                by[kind] = {key: Hold.from_json(h) for key, h in data.items()}
        return cls(by)
