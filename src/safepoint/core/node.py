"""One node's active holds, identity and figures, and the rules that change them.

``engine.step`` hands each of a node's events, in offset order, to the node's ``NodeState``
(``NodeState.apply``). What its cluster needs to know comes out as a ``NodeUpdate``: a compact
summary, never the whole hold set.
"""

from __future__ import annotations

from typing import Any, cast

from safepoint.core.alerts import below_sent
from safepoint.core.clock import ClockWatch, log_time
from safepoint.core.cost import History
from safepoint.core.event_records import Heartbeat, NodeEvent, Snapshot, TxPrepare
from safepoint.core.holds import EVENTS, HELD_AS, KINDS, TX, HoldKind, HoldSet, blocker_kind
from safepoint.core.incarnations import LATE, TWIN, Incarnations, alt_key, own_id
from safepoint.core.leaks import LeakWatch
from safepoint.core.policy import Policy
from safepoint.core.pressure import Holds, Pressure
from safepoint.core.records import FLOOR_KINDS, Blocker, Hold, HoldRef, NodeUpdate, OpenedHold
from safepoint.core.signals import Compacted, Signal, SnapshotAsk

__all__ = ["NodeState", "NodeUpdate", "IGNORED_DUPLICATE", "IGNORED_OLDER_SEQ", "IGNORED_STALE_INCARNATION",
           "STORED_FIELDS"]

IGNORED_DUPLICATE = "duplicate"
IGNORED_OLDER_SEQ = "older_seq"
IGNORED_STALE_INCARNATION = "stale_incarnation"

INT64_MIN = -(1 << 63)

Moved = tuple[list[OpenedHold], list[HoldRef]]
"""The holds a step of ``NodeState.apply`` opened and closed, as it returns them (``apply`` gathers
them on the update, in the order the steps ran)."""

Quiet = tuple[()] | tuple[str, str, int | None]
"""What ``quiet`` changed: () nothing but the clock and ``seq`` (a closing of an unknown id),
(kind, id, ts) a hold opened, (kind, id, None) a hold closed."""

STORED_FIELDS = (
    "node", "incarnation", "seq", "last_wall_ms", "readers", "txs", "mvcc_now", "groups", "pinned_bytes", "debt_bytes",
    "summary", "pinned_band", "age_band", "in_doubt", "expiries", "expire_walls", "forecast", "debt_growing", "leak",
    "admission", "history", "clock", "incarnations", "parts", "wraparound_left", "more_holds", "engine",
)
"""The positional stored form's layout (``to_stored``; ``to_json`` gives the same fields by name): empty
ones as null, trailing ones left out; the cluster is the state value's own (its key). ``readers``,
``txs`` and ``more_holds`` are the hold set's (``HoldSet.to_stored``: a kind of hold registered
later than those two is kept in ``more_holds``, so a new kind changes no layout). A field added
later goes last, so that a value stored before it reads as before."""
_STORED_LEN = len(STORED_FIELDS)
_ABSENT: list[Any] = [None] * _STORED_LEN


class NodeState:
    """The job's view of one node: identity, open holds, last figures."""

    __slots__ = (
        "cluster",
        "node",
        "incarnation",
        "seq",
        "holds",
        "mvcc_now",
        "groups",
        "pinned_bytes",
        "debt_bytes",
        "last_wall_ms",
        "_summary",
        "pressure",
        "leak",
        "admission",
        "history",
        "clock",
        "incs",
        "parts",
        "wraparound_left",
        "engine",
        "_low",
        "_restored",
        "_since",
    )

    def __init__(self, cluster: str, node: str, pressure: Pressure | None = None,
                 leak: LeakWatch | None = None, clock: ClockWatch | None = None,
                 incs: Incarnations | None = None) -> None:
        """A new node (``from_stored`` passes the stored ``pressure``, ``leak``, ``clock`` and ``incs``
        parts in, so that none is built only to be replaced)."""
        self.cluster = cluster
        self.node = node
        self.incarnation = -1
        self.seq = -1
        self.holds = HoldSet()
        """Its open holds of every kind (``core/holds.py``)."""
        self.mvcc_now: int | None = None
        self.groups: dict[str, list[Any]] = {}  # group -> [leader, published_min_tx_time]
        self.pinned_bytes: int | None = None
        self.debt_bytes: int | None = None
        self.last_wall_ms = -1
        self._summary: tuple[Any, ...] | None = None
        self.pressure = Pressure() if pressure is None else pressure
        """Bands, in-doubt transactions and forced expiries (``core/pressure.py``)."""
        self.leak = LeakWatch(node) if leak is None else leak
        """Since when the job holds more than the node reports (``core/leaks.py``)."""
        self.clock = ClockWatch(node) if clock is None else clock
        """Its clock's offset against the log's time, and the skew band (``core/clock.py``)."""
        self.incs = Incarnations(node) if incs is None else incs
        """Its incarnations besides the newest that may still speak (``core/incarnations.py``)."""
        self.parts: list[Any] | None = None
        """A snapshot sent in parts, received so far: [incarnation, cut, parts, next part, then each
        hold kind's entries in ``KINDS`` order] (``_collect``); None: none under way."""
        self.admission: list[int] | None = None
        """[throttled, refused]: the node's admission control's counts, as its last heartbeat said."""
        self.wraparound_left: int | None = None
        """Transactions left before the engine's 32-bit ids would wrap, as its last heartbeat said (a
        PostgreSQL agent's); None: the node does not say."""
        self.engine: list[int | None] | None = None
        """[purged_ts, history_length]: the engine's own purge point and history not yet purged, as
        its last heartbeat said (a MariaDB agent's); None: the node does not say."""
        self.history: History | None = None
        """The history curve of the last heartbeat that carried one (``core/cost.py``): with it the
        node's holds have costs, and every event walks its holds (the cost of its lowest hold
        depends on the next one)."""
        self._low: tuple[Blocker, Blocker] | None = None
        """(floor, lowest hold) of the last walk while the node holds nothing namespaced (not stored)."""
        self._restored = False
        """Read from the store and not walked since: ``_low`` is not known yet (``quiet`` walks)."""
        self._since: tuple[float, float, float] | None = None
        """(no hold opened before, no transaction prepared before, the node's clock below which
        ``Pressure.still_until`` says the pressure has nothing to decide): lower bounds
        ``quiet`` keeps for the pressure's clocks, and the bound they give; None after
        ``apply`` (the next shortcut walks the holds once; not stored)."""

    # -- persistence ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The node's state as a map: the stored form's fields by name (``to_stored``: empty and
        default fields are left out, and so is a quiet pressure band; ``from_json`` restores both as
        new), with the cluster."""
        stored = self.to_stored()
        data: dict[str, Any] = {"cluster": self.cluster, **dict(zip(STORED_FIELDS[:4], stored[:4], strict=True))}
        data.update((f, v) for f, v in zip(STORED_FIELDS[4:], stored[4:], strict=False) if v is not None)
        return data

    def open_holds(self) -> list[tuple[str, str, int]]:
        """(kind, id, ts) of every open hold (a transaction prepared or not)."""
        return [(kind, hid, h.ts) for kind, hid, h in self.holds.items()]

    def to_stored(self) -> list[Any]:
        """The compact stored form: the fields of ``STORED_FIELDS`` by position, without the cluster,
        empty ones as null and trailing ones left out (``to_json`` names them). Every node a
        micro-batch touches is written back in this form at its end."""
        summary = self._summary
        history = self.history
        readers, txs, more = self.holds.to_stored()
        stored = [self.node, self.incarnation, self.seq, self.last_wall_ms, readers, txs,
                  self.mvcc_now, self.groups or None, self.pinned_bytes, self.debt_bytes,
                  None if summary is None else list(summary) or None,
                  *self.pressure.to_stored(),
                  self.leak.state or None, self.admission or None,
                  None if history is None else history.to_json() or None,
                  self.clock.to_stored(), self.incs.to_stored(), self.parts, self.wraparound_left, more, self.engine]
        while stored[-1] is None:
            stored.pop()
        return stored

    @classmethod
    def from_stored(cls, cluster: str, stored: list[Any]) -> NodeState:
        """The state ``to_stored`` wrote, taking over its lists and maps (a bucket's freshly decoded
        value; fields past ``STORED_FIELDS``, from a newer layout, are not read)."""
        (node, incarnation, seq, last_wall_ms, readers, txs, mvcc_now, groups, pinned_bytes, debt_bytes, summary,
         pinned_band, age_band, in_doubt, expiries, expire_walls, forecast, debt_growing,
         leak, admission, history, clock, incs, parts, wraparound_left, more, engine) = stored[:_STORED_LEN] if len(stored) >= _STORED_LEN else stored + _ABSENT[len(stored):]
        pressure = Pressure.from_stored(pinned_band, age_band, in_doubt, expiries, expire_walls, forecast, debt_growing)
        # (a compiled class has no bare __new__: __init__ takes the stored parts and the fields below replace its own)
        state = cls(cluster, node, pressure, LeakWatch(node, leak), ClockWatch(node, clock),
                    Incarnations(node, incs))
        state.incarnation = incarnation
        state.seq = seq
        state.holds = HoldSet.from_stored(readers, txs, more)
        state.mvcc_now = mvcc_now
        state.groups = groups or {}
        state.pinned_bytes = pinned_bytes
        state.debt_bytes = debt_bytes
        state.last_wall_ms = last_wall_ms
        state._summary = None if summary is None else tuple(summary)
        state.admission = admission
        state.history = None if history is None else History(history)
        state.parts = parts
        state.wraparound_left = wraparound_left
        state.engine = engine
        state._restored = True
        return state

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeState:
        """The state ``to_json`` wrote (a freshly decoded value: its lists and maps are taken over, as
        ``from_stored`` does): its fields by position, read as the stored form."""
        head = [data["node"], data["incarnation"], data["seq"], data["last_wall_ms"]]
        return cls.from_stored(data["cluster"], head + [data.get(f) for f in STORED_FIELDS[len(head):]])

    # -- the rules --------------------------------------------------------------------
    def check_order(self, event: NodeEvent) -> str | None:
        """Return why the event is ignored (stale or duplicate), or None to apply it."""
        return self.order_of(event["incarnation"], event["seq"])

    def order_of(self, incarnation: int, seq: int) -> str | None:
        """``check_order`` of an event of ``incarnation`` and ``seq``."""
        if incarnation < self.incarnation:
            return IGNORED_STALE_INCARNATION
        if incarnation == self.incarnation:
            if seq == self.seq:
                return IGNORED_DUPLICATE
            if seq < self.seq:
                return IGNORED_OLDER_SEQ
        return None

    def apply(self, event: NodeEvent, policy: Policy, lost: bool = False) -> NodeUpdate | str:
        """Apply one validated node event. Returns the update, or the reason it was ignored. ``lost``:
        the node's events may have been lost before this one (it owes a snapshot after a gap): an
        incarnation it never heard from may have spoken in them (``Incarnations.lost_since``), and a
        newer incarnation's start is known only as late as this event (``_supersede``)."""
        if lost:
            self.incs.lost_since(self.incarnation)
        incarnation = event["incarnation"]
        twin = incarnation < self.incarnation  # an older process that still speaks (core/incarnations.py)
        verdict = self.incs.order(incarnation, event["seq"], event["wall_ms"]) if twin else self.check_order(event)
        if verdict is not None and verdict != TWIN and verdict != LATE:
            return verdict
        self._since = None
        kind = event["type"]
        if self.parts is not None and not (event["type"] == "snapshot" and event.get("part", 0) > 0):
            self.parts = None  # another event between a snapshot's parts: they are not one set any more
        log = log_time(event)
        restarted, said, (opened, closed) = self._identity(event, verdict == TWIN or not twin, log, policy, lost)
        restarted = restarted or twin
        wall = event["wall_ms"]
        if wall > self.last_wall_ms:
            self.last_wall_ms = wall
        groups_changed = False
        quiet = False  # the event cannot change the node's lowest holds (see _update)
        whole = True
        if event["type"] == "heartbeat":
            groups_changed = self._heartbeat(event)
            if "compacted_ts" in event:  # the store's own compaction: the cluster refuses holds below it
                said.append(Compacted(event["compacted_ts"]))
        elif event["type"] == "snapshot":
            full = self._collect(event) if event.get("parts", 1) > 1 else event
            whole = full is not None
            if full is not None:
                more_opened, more_closed = self._replace(full, wall, incarnation, twin)
                opened += more_opened
                closed += more_closed
        elif event["type"] == "tx_prepare":
            self._prepare(event, wall, self._key(self.holds.of(TX.name), TX.id_of(event), incarnation, twin))
        else:
            keeps, more_opened, more_closed = self._hold_event(event, kind, twin, wall)
            quiet = keeps and not restarted
            opened += more_opened
            closed += more_closed
        if self.incs:
            for inc in self.incs.due(log, policy, self.incarnation):
                closed += self._drop_incarnation(inc)
                self.incs.drop(inc)
            cleared = self.incs.settle(self.incarnation, log, policy)
            if cleared is not None:
                said.append(cleared)
        if opened and closed:  # a hold opened and closed within this step (with no incarnation grace, an
            # older process's holds moved aside and dropped at once) never lived past it: no rule sees it open
            opened = [o for o in opened if o.id in self.holds.of(o.kind)]
        update = self._update(log, opened, closed, groups_changed, policy, quiet)
        update.snapshot = kind == "snapshot" and whole
        update.sender = incarnation
        if self.incs:
            update.lives = self.incs.live(self.incarnation)
        update.signals += said
        skew = self.clock.take(wall, log, policy)
        if skew is not None:
            update.signals.append(skew)
        held = Holds(self.node, self.holds, self.pinned_bytes, self.incarnation)
        update.signals += self.pressure.step(held, self.last_wall_ms, kind == "heartbeat" and "pinned_bytes" in event,
                                             closed, policy, self.debt_bytes)
        if whole and not self.leak.still(kind, policy):
            own = self.holds
            if self.incs:  # each process counts its own
                own = HoldSet({kind: {k: h for k, h in holds.items() if h.incarnation == incarnation}
                               for kind, holds in own.maps()})
            update.signals += self.leak.check(own, event, self.last_wall_ms, policy)
        return update

    def _identity(self, event: NodeEvent, speaks: bool, log: int,
                  policy: Policy, lost: bool = False) -> tuple[bool, list[Signal], Moved]:
        """The event's process: a newer incarnation supersedes the newest (``_supersede``), an older one
        that speaks after it (``speaks``; or the newest after its holds went) is a second live process;
        the newest's ``seq`` moves on. Returns (the incarnations changed or others live: no shortcut,
        what it says: ``duplicate_node`` raised, a snapshot asked of a process whose holds went; the
        holds a supersession moved)."""
        incarnation = event["incarnation"]
        twin = incarnation < self.incarnation
        said: list[Signal] = []
        moved: Moved = ([], [])
        if twin and not speaks:
            return True, said, moved  # the older process's late word (``Incarnations.order`` took its seq)
        others = bool(self.incs)
        restarted = not self.incs.still(incarnation)
        if incarnation > self.incarnation:
            if self.incarnation >= 0:
                moved = self._supersede(log, event["wall_ms"], lost)
                restarted = True
            self.incarnation = incarnation
            self.seq = -1
        if twin or (self.incs.gone and self.incs.dropped(incarnation)):
            raise_now, was_dropped = self.incs.speak(incarnation, event["seq"], log, self.incarnation, self.seq)
            if raise_now:
                said.append(self.incs.alert("raised", self.incarnation, log, policy))
            if was_dropped:  # its holds went with its silence: it must restate them
                said.append(SnapshotAsk("duplicate_node"))
            restarted = True
        if not twin:
            self.seq = event["seq"]
            if others:
                self.incs.heard(incarnation, self.seq, log)
        return restarted, said, moved

    def _hold_event(self, event: NodeEvent, kind: str, twin: bool,
                    wall: int) -> tuple[bool, list[OpenedHold], list[HoldRef]]:
        """A hold opened or closed (by the newest process, or by an older one under ``id@incarnation``).
        Returns (whether it cannot change the node's lowest holds: ``_update``'s shortcut, the holds
        it opened, those it closed)."""
        incarnation = event["incarnation"]
        what, opening = EVENTS[kind]
        hkind = what.name
        holds = self.holds.of(hkind)
        hid = what.id_of(event)
        if opening:
            key = alt_key(hid, incarnation) if twin else hid
            closed = [HoldRef(hkind, key)] if key in holds else []
            hold = holds[key] = what.opened(event, wall, incarnation)
            return (not closed and self._keeps_lowest(hold.ts, hold.namespace),
                    [OpenedHold(hkind, key, hold.ts, hold.namespace)], closed)
        key = self._key(holds, hid, incarnation, twin)
        gone = holds.pop(key, None)
        if gone is None:
            return True, [], []
        return self._keeps_lowest(gone.ts, gone.namespace), [], [HoldRef(hkind, key)]

    def _collect(self, event: Snapshot) -> Snapshot | None:
        """A part of a snapshot sent in several messages: kept until the last, which gives the whole
        snapshot (its holds of every kind, all parts'); None until then, or when the part does not
        continue the parts received (another cut, a part skipped: nothing is applied, and the node is
        asked again where a snapshot is owed)."""
        part, parts, cut = event["part"], event["parts"], event["cut"]
        pending = self.parts
        if part == 0:
            pending = self.parts = [event["incarnation"], cut, parts, 0, *([] for _ in KINDS)]
        elif pending is None or pending[:4] != [event["incarnation"], cut, parts, part]:
            self.parts = None
            return None
        pending[3] = part + 1
        if len(pending) < 4 + len(KINDS):  # parts begun before a kind of hold was registered
            pending += [[] for _ in range(4 + len(KINDS) - len(pending))]
        for i, k in enumerate(KINDS):
            pending[4 + i] += k.listed_in(event)
        if pending[3] < parts:
            return None
        self.parts = None
        whole: dict[str, Any] = {**event, **{k.listed: pending[4 + i] for i, k in enumerate(KINDS)}}
        return cast(Snapshot, whole)

    def _key(self, holds: dict[str, Hold], hid: str, incarnation: int, twin: bool) -> str:
        """The key of hold ``hid`` of ``incarnation``: its own id for the newest process; for an older
        one that still speaks, ``id@incarnation``, or its own id where that is one of its prepared
        transactions, which the newest process took over when it started."""
        if not twin:
            return hid
        key = alt_key(hid, incarnation)
        if key not in holds:
            own = holds.get(hid)
            if own is not None and own.incarnation == incarnation:
                return hid
        return key

    def _supersede(self, log: int, wall: int, lost: bool = False) -> Moved:
        """A newer incarnation appeared: the newest one's unprepared holds stay held, under
        ``id@incarnation``, until it has been silent for the grace (``core/incarnations.py``; where
        the node's events may have been lost, ``lost``, for a lease, as a second live process's:
        it may have spoken after the newer one's unseen start); its prepared transactions pass to
        the new process, which must learn their decision. The holds it moved (each closed under its
        id, opened under the new key)."""
        opened: list[OpenedHold] = []
        closed: list[HoldRef] = []
        old = self.incarnation
        self.incs.supersede(old, self.seq, log, None if lost else wall)
        for kind, holds in self.holds.maps():
            mine = [k for k, h in holds.items() if h.incarnation == old and not h.prepared]
            for hid in mine:
                hold = holds.pop(hid)
                key = alt_key(hid, old)
                holds[key] = hold
                closed.append(HoldRef(kind, hid))
                opened.append(OpenedHold(kind, key, hold.ts, hold.namespace))
        return opened, closed

    def _drop_incarnation(self, incarnation: int) -> list[HoldRef]:
        """An incarnation fell silent: its unprepared holds died with it (those it returns); its
        prepared transactions stay held (under their own id again, where that is free)."""
        closed: list[HoldRef] = []
        for kind, holds in self.holds.maps():
            for key in [k for k, h in holds.items() if h.incarnation == incarnation]:
                hold = holds[key]
                if not hold.prepared:
                    del holds[key]
                    closed.append(HoldRef(kind, key))
                elif incarnation != self.incarnation:
                    plain = own_id(key, incarnation)
                    if plain is not None and plain not in holds:
                        del holds[key]
                        holds[plain] = hold
        return closed

    def quiet(self, kind: str, what: HoldKind, opening: bool, wall: int, incarnation: int, seq: int, hid: str,
              hold: Hold | None, policy: Policy, safe_ts: int | None, member: bool, log: int) -> Quiet | None:
        """Apply a hold's opening or closing that changes nothing but the node's holds, ``seq`` and
        clock; None when it might (nothing is changed then: ``apply`` takes the event). The event is
        given by its fields: its ``kind`` (type), the hold kind ``what`` it opens (``opening``) or
        closes (``core/holds.py``: ``EVENTS[kind]``), ``wall`` ms, ``incarnation``, ``seq``, the id of
        the hold it opens or closes and, for an opening, the ``hold`` it opens (``ClusterState.take_quiet``
        reads them from a map, ``take_quiet_typed`` from a struct).

        It states no condition of its own: each is the one its step of ``apply`` begins with, so the
        two cannot drift apart. The event is the newest process's next (``check_order``), with no
        other process to settle (``Incarnations.still``), no snapshot in parts, a clock and a leak
        watch with nothing to say (``ClockWatch.still``, ``LeakWatch.still``), the pressure's
        clocks short of their bound (``Pressure.still_until``, kept as holds come), and a hold that
        keeps the node's lowest hold (``_keeps_lowest``, with the last walk ``_update`` keeps,
        ``_kept_low``). For the cluster: a hold it opens is not below ``safe_ts`` (``below_sent``: no
        violation), and, for a ``member``, the node's floor is not either (``check_floor`` has
        nothing to say)."""
        if (incarnation != self.incarnation or self.order_of(incarnation, seq) is not None
                or self.parts is not None or not self.incs.still(incarnation)
                or not self.leak.still(kind, policy) or not self.clock.still(wall, log, policy)):
            return None
        low = self._kept_low()
        if low is None:
            if not self._restored or self.history is not None:
                return None
            self._walk(policy)  # what the node's last walk gave before it was stored (its holds are the same)
            low = self._kept_low()
            if low is None:
                return None
        if member and below_sent(low[0].ts, safe_ts):
            return None
        hkind = what.name
        holds = self.holds.of(hkind)
        now = wall if wall > self.last_wall_ms else self.last_wall_ms
        since = self._since
        if since is None:
            first, prepared = self.holds.earliest()
            since = self._since = (first, prepared, self.pressure.still_until(first, prepared, policy))
        change: Quiet = ()
        if opening:
            if (hold is None or hid in holds or not self._keeps_lowest(hold.ts, hold.namespace)
                    or below_sent(hold.ts, safe_ts)):
                return None
            if hold.opened_wall < since[0]:  # the node's earliest opening now: the pressure's bound moves
                since = (hold.opened_wall, since[1], self.pressure.still_until(hold.opened_wall, since[1], policy))
            if now >= since[2]:
                return None
            holds[hid] = hold
            self._since = since
            change = (hkind, hid, hold.ts)
        else:
            gone = holds.get(hid)
            if (gone is not None and not self._keeps_lowest(gone.ts, gone.namespace)) or now >= since[2]:
                return None
            if gone is not None:
                del holds[hid]
                change = (hkind, hid, None)
        self.seq = seq
        self.last_wall_ms = now
        self.clock.take(wall, log, policy)  # (still: it only sets the offset)
        return change

    def _prepare(self, event: TxPrepare, wall: int, key: str) -> None:
        """A transaction is prepared: its fate now belongs to its coordinator (never expired)."""
        tx = self.holds.of(TX.name).get(key)
        if tx is not None:
            tx.prepared = True
            tx.coordinator = event["coordinator"]
            tx.participants = list(event["participants"])
            if tx.prepared_wall is None:
                tx.prepared_wall = wall

    def _heartbeat(self, event: Heartbeat) -> bool:
        """Take a heartbeat's figures and groups; True when the groups or the ones it leads changed."""
        self.mvcc_now = event["mvcc_now"]
        if "pinned_bytes" in event:
            self.pinned_bytes = event["pinned_bytes"]
        if "debt_bytes" in event:
            self.debt_bytes = event["debt_bytes"]
        if "history_above" in event:
            self.history = History.of(event["history_above"])
        if "wraparound_left" in event:
            self.wraparound_left = event["wraparound_left"]
        if "purged_ts" in event or "history_length" in event:
            self.engine = [event.get("purged_ts"), event.get("history_length")]
        elif self.engine is not None:
            self.engine = None  # a node that stopped saying (another engine's agent under its name)
        if "admission_throttled" in event or "admission_refused" in event:
            self.admission = [event.get("admission_throttled", 0), event.get("admission_refused", 0)]
        elif self.admission is not None:
            self.admission = None  # a new process counts from zero and says nothing until it has something
        if "groups" not in event:
            return False
        new_groups: dict[str, list[Any]] = {}
        for g in event["groups"]:
            entry = [bool(g.get("leader", False)), g.get("published_min_tx_time")]
            twin = new_groups.get(g["group"])
            if twin is not None:  # listed twice: leader if either says so, the lower (or unknown) time
                low = None if twin[1] is None or entry[1] is None else min(twin[1], entry[1])
                entry = [twin[0] or entry[0], low]
            new_groups[g["group"]] = entry
        changed = set(new_groups) != set(self.groups) or _led(new_groups) != _led(self.groups)
        self.groups = new_groups
        return changed

    def _keeps_lowest(self, ts: int, namespace: str | None) -> bool:
        """A hold at ``ts`` (in ``namespace``), coming or going, changes neither the node's lowest hold
        nor a tie: it is not namespaced and lies strictly above the lowest hold of the last walk,
        while nothing is namespaced (``_low``)."""
        low = self._low
        return namespace is None and low is not None and ts > low[1].ts

    def _kept_low(self) -> tuple[Blocker, Blocker] | None:
        """(floor, lowest hold) of the last walk, which an event that keeps the lowest hold
        (``_keeps_lowest``) keeps too; None where the node must walk again: no walk kept, or a cost
        curve (the lowest hold's cost depends on the next one)."""
        return self._low if self.history is None else None

    def _theirs(self, key: str, hold: Hold) -> bool:
        """The hold is another incarnation's than the newest (kept under ``id@incarnation``)."""
        return hold.incarnation != self.incarnation and own_id(key, hold.incarnation) is not None

    def _replace(
        self,
        event: Snapshot,
        wall: int,
        incarnation: int,
        twin: bool,
    ) -> Moved:
        """A snapshot: the complete set of the sending process's holds replaces what the job held for
        that process (the newest, or an older one that still speaks); the holds of the node's other
        incarnations stay. The holds it opened and closed (one whose ts changed is both)."""
        opened: list[OpenedHold] = []
        closed: list[HoldRef] = []
        def mine(key: str, hold: Hold) -> bool:
            return (hold.incarnation == incarnation and self._theirs(key, hold)) if twin else not self._theirs(key, hold)

        for what in KINDS:
            kind = what.name
            held = self.holds.of(kind)
            old_map = {k: h for k, h in held.items() if mine(k, h)}
            new_map: dict[str, Hold] = {}
            for entry in what.listed_in(event):
                hid = entry[what.id_field]
                key = alt_key(hid, incarnation) if twin else hid
                same = new_map.get(key)
                if same is not None and same.ts <= entry[what.ts_field]:
                    continue  # listed twice: the lower entry holds (the safer reading)
                new_map[key] = what.listed_hold(entry, old_map.get(key), wall, incarnation)
            for hid, hold in old_map.items():
                if hid not in new_map or new_map[hid].ts != hold.ts:
                    closed.append(HoldRef(kind, hid))
            for hid, hold in new_map.items():
                if hid not in old_map or old_map[hid].ts != hold.ts:
                    opened.append(OpenedHold(kind, hid, hold.ts, hold.namespace))
            if len(old_map) < len(held):
                new_map.update((k, h) for k, h in held.items() if k not in old_map and k not in new_map)
            self.holds.put(kind, new_map)
        return opened, closed

    def floor_hold(self, policy: Policy) -> Blocker | str:
        """The lowest of the node's own bounds, the retention bound and its groups' published times;
        or why it is unknown."""
        if self.mvcc_now is None:
            return "no heartbeat yet"
        # clamped: a timestamp is a signed 64-bit integer on the wire, and nothing is older than the smallest one
        best = Blocker("retention", None, max(self.mvcc_now - policy.retention, INT64_MIN), None, None)
        for gid, (leader, published) in self.groups.items():
            if published is None:
                if leader:
                    return f"group {gid} it leads has no published min tx time"
                continue
            if published < best.ts:
                best = Blocker("group", gid, published, None, None)
        return best

    def local_min(self, policy: Policy) -> tuple[int | None, str | None, Blocker | None]:
        """(local_min, why unknown, blocker)."""
        floor, best, _ns = self._lowest(policy)
        if isinstance(floor, str):
            return None, floor, None
        assert best is not None
        return best.ts, None, best

    def _lowest(self, policy: Policy) -> tuple[Blocker | str, Blocker | None, list[Any] | None]:
        """(the node's own floor or why it is unknown, its lowest hold of all, and with namespaced
        holds [the lowest of what pins every namespace, {namespace: its lowest hold}])."""
        floor = self.floor_hold(policy)
        if isinstance(floor, str):
            return floor, None, None
        best = floor
        base = floor.ts
        mins: dict[str, int] | None = None
        for what in KINDS:
            for hid, h in self.holds.of(what.name).items():
                if h.ts < best.ts or (h.ts == best.ts and best.kind in FLOOR_KINDS):
                    best = Blocker(blocker_kind(what, h), hid, h.ts, h.opened_wall, h.label)
                if h.namespace is None:
                    base = min(base, h.ts)
                else:
                    mins = {} if mins is None else mins
                    mins[h.namespace] = min(mins.get(h.namespace, h.ts), h.ts)
        return floor, best, None if mins is None else [base, dict(sorted(mins.items()))]

    def _walk(self, policy: Policy) -> tuple[Blocker | str, Blocker | None, list[Any] | None]:
        """``_lowest``, with the lowest hold's cost where the node sent a history curve; keeps
        (floor, lowest hold) in ``_low`` while nothing is namespaced."""
        floor, blocker, ns = self._lowest(policy)
        if self.history is not None and blocker is not None and blocker.kind in HELD_AS:
            blocker = blocker._replace(cost=self._cost_of(blocker, floor))
        self._low = (floor, blocker) if ns is None and blocker is not None and not isinstance(floor, str) else None
        self._restored = False
        return floor, blocker, ns

    def _cost_of(self, blocker: Blocker, floor: Blocker | str) -> int:
        """The layer of the node's lowest hold (``core/cost.py``): from its ts to the next younger
        hold or the node's floor, shared with the holds at its ts."""
        assert self.history is not None
        ts = blocker.ts
        top = floor.ts if not isinstance(floor, str) else self.mvcc_now
        upper, ties = self.holds.layer(ts, top)
        if top is not None and ts >= top:
            return 0
        layer = self.history.above(ts, self.mvcc_now) - (self.history.above(upper, self.mvcc_now) if upper is not None else 0)
        return max(layer, 0) // max(ties, 1)

    def _update(
        self,
        log: int,
        opened: list[OpenedHold],
        closed: list[HoldRef],
        groups_changed: bool,
        policy: Policy,
        quiet: bool = False,
    ) -> NodeUpdate:
        low = self._kept_low() if quiet else None
        floor: Blocker | str
        blocker: Blocker | None
        if low is not None:
            floor, blocker, ns = low[0], low[1], None
        else:
            floor, blocker, ns = self._walk(policy)
        lmin, unknown = (None, floor) if isinstance(floor, str) else (blocker.ts if blocker else None, None)
        summary = (lmin, unknown) if ns is None else (lmin, unknown, ns)
        changed = groups_changed or summary != self._summary
        self._summary = summary
        return NodeUpdate(
            node=self.node,
            log_ms=log,
            incarnation=self.incarnation,
            seq=self.seq,
            local_min=lmin,
            unknown=unknown,
            blocker=blocker,
            groups=sorted(self.groups) if groups_changed else None,
            led=_led(self.groups) if groups_changed else None,
            opened=opened,
            closed=closed,
            changed=changed,
            floor=None if floor is None or isinstance(floor, str) else floor.floor,
            ns=ns,
        )



def _led(groups: dict[str, list[Any]]) -> list[str]:
    """The groups a node says it leads. A group no member leads has no current leader's time, so
    the cluster cannot know the group's (``core/cluster.py`` aborts the round); a leader that has
    not published yet makes its own minimum unknown (``floor_hold``)."""
    return sorted(g for g, (leader, _published) in groups.items() if leader)

