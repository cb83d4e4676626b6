"""What holds a PostgreSQL instance's vacuum horizon back, read from its catalogs, in 64-bit xids.

``safepoint agent postgres`` (``connectors/postgres_agent.py``) reads this once per poll. Pure
apart from ``read_instance``, which runs the queries on one connection; the rules (an xid's 64-bit
form, a hold's id and label, the dead-tuple figures and the history curve) are functions of the
rows, tested without a server.

The holds, each published as a reader or a transaction of the agent's node:

=====================  ==========================================  =============================
what                   from                                        published as
=====================  ==========================================  =============================
a backend's snapshot   ``pg_stat_activity.backend_xmin``            reader ``backend-PID@XMIN``
a backend's xid        ``pg_stat_activity.backend_xid``             transaction ``xact-XID``
a prepared xact        ``pg_prepared_xacts.transaction``            prepared transaction
                                                                   ``prepared-GID``
a replication slot     ``pg_replication_slots.xmin``,               reader ``slot-NAME@XMIN``,
                       ``catalog_xmin``                             ``slot-NAME.catalog@XMIN``
a standby's feedback   ``pg_stat_replication.backend_xmin``         reader ``standby-NAME@XMIN``
=====================  ==========================================  =============================

A hold's id carries its xid where the xid can move (a backend's next statement, a slot's consumer,
a standby's feedback): a moved hold is one closed and another opened, and the job never sees a
hold's timestamp change under one id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Backend", "DeadTuples", "History", "Instance", "PgHold", "Superseded", "holds_of", "read_instance", "to_xid8"]

XID_MASK = 0xFFFFFFFF
HALF = 1 << 31
WRAP_LIMIT = HALF - 1
"""``age(datfrozenxid)`` at which the 32-bit xids would wrap: the wraparound distance is this minus the
oldest database's age (PostgreSQL stops assigning xids 3 million before it, and warns from 40 million)."""
QUERY_CHARS = 60
"""The first characters of a backend's query in its hold's label."""
IDLE_IN_TX = ("idle in transaction", "idle in transaction (aborted)")
HoldKind = Literal["reader", "tx", "prepared"]


def to_xid8(xid: int, next_xid8: int) -> int:
    """A 32-bit ``xid`` as the 64-bit one it is, given the instance's next ``xid8`` read at about the
    same time: the 64-bit id whose low 32 bits are ``xid`` nearest to it (within 2^31 either way:
    right across the 32-bit wrap, and for an xid assigned just after ``next_xid8`` was read)."""
    diff = (next_xid8 - xid) & XID_MASK  # how far behind, modulo 2^32
    if diff >= HALF:
        diff -= 1 << 32  # ahead of the reading (assigned since)
    return next_xid8 - diff


@dataclass(frozen=True)
class Backend:
    """A row of ``pg_stat_activity`` that holds something (a snapshot, an xid or both)."""

    pid: int
    xmin: int | None
    """``backend_xmin`` (32-bit)."""
    xid: int | None
    """``backend_xid`` (32-bit)."""
    state: str | None
    application_name: str
    user: str | None
    database: str | None
    xact_start_ms: int | None
    backend_start_ms: int | None
    query: str | None

    @property
    def idle_in_transaction(self) -> bool:
        return self.state in IDLE_IN_TX


@dataclass(frozen=True)
class PgHold:
    """One hold, as the agent publishes it."""

    kind: HoldKind
    id: str
    ts: int
    """The xid8 it holds."""
    label: str
    opened_wall_ms: int | None
    """When it began by the instance's clock (``xact_start``, ``prepared``, the walsender's
    ``backend_start``); None: not known (a slot), the agent's first sight of it."""
    pid: int | None = None
    """The backend that holds it (a backend's snapshot or xid): what a forced expiry may end."""
    backend_start_ms: int | None = None
    idle_in_transaction: bool = False
    marked: bool = False
    """What its label says in capitals, the state an operator hunts: a backend ``IDLE IN
    TRANSACTION``, a slot nobody reads (``INACTIVE``). The agent restates the hold when it changes."""


@dataclass(frozen=True)
class DeadTuples:
    """The dead tuples of one database's tables, and the versions they superseded so far."""

    dead_bytes: int
    """An estimate of the bytes of dead tuples now: ``n_dead_tup`` times each table's bytes per tuple."""
    tables: list[tuple[str, int]] = field(default_factory=list)
    """(table, ``n_dead_tup``), most dead tuples first: what a vacuum takes first."""
    changed: dict[str, tuple[int, float]] = field(default_factory=dict)
    """table -> (``n_tup_upd + n_tup_del``, its bytes per tuple now): the versions it superseded since
    its statistics began (``Superseded`` makes a counter of bytes of them)."""


class Superseded:
    """The bytes of tuple versions superseded so far, as a counter that never falls: each reading adds
    every table's new updates and deletes times that table's bytes per tuple at the time (a table's
    size per tuple moves as it bloats and is vacuumed; the versions already counted keep their
    bytes). A table whose statistics were reset counts from its new figure."""

    def __init__(self) -> None:
        self.total = 0
        self._seen: dict[str, int] = {}

    def add(self, dead: DeadTuples) -> int:
        for table, (changed, per) in dead.changed.items():
            before = self._seen.get(table)
            if before is not None and changed >= before:
                self.total += int((changed - before) * per)
            self._seen[table] = changed
        return self.total


@dataclass(frozen=True)
class Instance:
    """One poll's reading."""

    next_xid8: int
    """``pg_snapshot_xmax(pg_current_snapshot())``: the next xid to be assigned (no xid is taken to read it)."""
    in_recovery: bool
    now_ms: int
    backends: list[Backend]
    prepared: list[tuple[str, int, str | None, str | None, int | None]]
    """(gid, xid, owner, database, prepared at ms)."""
    slots: list[tuple[str, str, bool, int | None, int | None, str | None, str | None]]
    """(slot_name, slot_type, active, xmin, catalog_xmin, database, plugin)."""
    standbys: list[tuple[str, str | None, str | None, int, int | None]]
    """(application_name, client_addr, state, backend_xmin, backend_start ms)."""
    frozen_age: int
    """The oldest database's ``age(datfrozenxid)``."""
    dead: DeadTuples

    @property
    def wraparound_left(self) -> int:
        """Transactions left before the 32-bit xids would wrap (``WRAP_LIMIT`` minus ``frozen_age``)."""
        return max(0, WRAP_LIMIT - self.frozen_age)


def _short(text: str | None, n: int = QUERY_CHARS) -> str:
    one = " ".join((text or "").split())
    return one if len(one) <= n else one[: n - 1] + "…"


def backend_label(b: Backend) -> str:
    """``app (user@db, idle in transaction): SELECT ...``: who holds it, as an operator names it."""
    who = f"{b.user or '?'}@{b.database or '?'}"
    state = b.state or "?"
    state = state.upper() if b.idle_in_transaction else state
    head = f"{b.application_name or 'backend'} pid {b.pid} ({who}, {state})"
    query = _short(b.query)
    return f"{head}: {query}" if query else head


def holds_of(inst: Instance, own_pid: int | None = None) -> dict[str, PgHold]:
    """Every hold of the instance by id (the agent's own backend left out)."""
    out: dict[str, PgHold] = {}
    nxt = inst.next_xid8
    for b in inst.backends:
        if b.pid == own_pid:
            continue
        label = backend_label(b)
        if b.xmin is not None:
            xmin8 = to_xid8(b.xmin, nxt)
            h = PgHold("reader", f"backend-{b.pid}@{xmin8}", xmin8, label, b.xact_start_ms or b.backend_start_ms, b.pid,
                       b.backend_start_ms, b.idle_in_transaction, b.idle_in_transaction)
            out[h.id] = h
        if b.xid is not None:
            xid8 = to_xid8(b.xid, nxt)
            h = PgHold("tx", f"xact-{xid8}", xid8, label, b.xact_start_ms or b.backend_start_ms, b.pid,
                       b.backend_start_ms, b.idle_in_transaction, b.idle_in_transaction)
            out[h.id] = h
    for gid, xid, owner, database, at_ms in inst.prepared:
        xid8 = to_xid8(xid, nxt)
        h = PgHold("prepared", f"prepared-{gid}"[:256], xid8, _short(f"prepared {gid!r} ({owner or '?'}@{database or '?'})",
                   200), at_ms)
        out[h.id] = h
    for name, stype, active, xmin, catalog_xmin, database, plugin in inst.slots:
        what = f"{stype} slot {name}" + (f" ({plugin}, {database})" if plugin else "")
        what += "" if active else " INACTIVE"
        for suffix, slot_xid in (("", xmin), (".catalog", catalog_xmin)):
            if slot_xid is None:
                continue
            xid8 = to_xid8(slot_xid, nxt)
            hid = f"slot-{name}{suffix}@{xid8}"
            out[hid] = PgHold("reader", hid, xid8, f"{what}: {'catalog_xmin' if suffix else 'xmin'}", None,
                              marked=not active)
    for app, addr, state, xmin, start_ms in inst.standbys:
        xid8 = to_xid8(xmin, nxt)
        hid = f"standby-{app or addr or '?'}@{xid8}"
        out[hid] = PgHold("reader", hid, xid8, f"standby {app or '?'} ({addr or 'local'}, {state or '?'}): "
                          "hot_standby_feedback", start_ms)
    return out


class History:
    """The instance's history curve for heartbeats' ``history_above``: readings of (next xid8, bytes
    superseded so far); the bytes only a hold at ``ts`` keeps are those superseded since ``ts``,
    which no vacuum can take while the hold stands."""

    def __init__(self, points: int = 64) -> None:
        self.points = points
        self._readings: list[tuple[int, int]] = []

    def add(self, xid8: int, superseded: int) -> None:
        if self._readings and superseded < self._readings[-1][1]:
            self._readings.clear()  # the statistics were reset: start again
        if self._readings and self._readings[-1][0] == xid8:
            self._readings[-1] = (xid8, superseded)
        else:
            self._readings.append((xid8, superseded))
        if len(self._readings) > self.points:  # the first and the last stay; the closest pair loses one
            r = self._readings
            k = min(range(1, len(r) - 1), key=lambda i: r[i + 1][0] - r[i - 1][0])
            del r[k]

    def curve(self) -> list[dict[str, int]]:
        """``history_above`` points: (ts, bytes superseded after ts), oldest reading first."""
        if len(self._readings) < 2:
            return []
        now = self._readings[-1][1]
        return [{"ts": ts, "bytes": now - s} for ts, s in self._readings]


# -- reading an instance (psycopg) ----------------------------------------------------------
Q_NOW = ("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_is_in_recovery(), pg_backend_pid(), "
         "(extract(epoch from clock_timestamp()) * 1000)::bigint")
Q_BACKENDS = """
SELECT pid, backend_xmin::text::bigint, backend_xid::text::bigint, state, coalesce(application_name, ''),
       usename, datname, (extract(epoch from xact_start) * 1000)::bigint,
       (extract(epoch from backend_start) * 1000)::bigint, left(query, 200)
  FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)"""
Q_PREPARED = """
SELECT gid, transaction::text::bigint, owner, database, (extract(epoch from prepared) * 1000)::bigint
  FROM pg_prepared_xacts"""
Q_SLOTS = """
SELECT slot_name, slot_type, active, xmin::text::bigint, catalog_xmin::text::bigint, database, plugin
  FROM pg_replication_slots WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL"""
Q_STANDBYS = """
SELECT coalesce(application_name, ''), client_addr::text, state, backend_xmin::text::bigint,
       (extract(epoch from backend_start) * 1000)::bigint
  FROM pg_stat_replication WHERE backend_xmin IS NOT NULL"""
Q_FROZEN = "SELECT coalesce(max(age(datfrozenxid)), 0) FROM pg_database WHERE datallowconn"
Q_DEAD = """
SELECT s.schemaname || '.' || s.relname, s.n_dead_tup, s.n_live_tup, s.n_tup_upd + s.n_tup_del,
       pg_relation_size(s.relid)
  FROM pg_stat_user_tables s"""


def dead_tuples(rows: list[tuple[str, int, int, int, int]]) -> DeadTuples:
    """The dead-tuple figures of ``Q_DEAD``'s rows: each table's bytes per tuple is its size over its
    live and dead tuples (a table with none counts a page's worth, 8 kB, per 100 tuples)."""
    dead = 0
    tables: list[tuple[str, int]] = []
    changes: dict[str, tuple[int, float]] = {}
    for name, n_dead, n_live, changed, size in rows:
        tuples = (n_live or 0) + (n_dead or 0)
        per = size / tuples if tuples and size else 82
        dead += int((n_dead or 0) * per)
        changes[name] = (int(changed or 0), per)
        if n_dead:
            tables.append((name, int(n_dead)))
    tables.sort(key=lambda t: (-t[1], t[0]))
    return DeadTuples(dead, tables, changes)


def read_instance(conn: Any, extra: list[Any] | None = None) -> Instance:
    """One reading on ``conn`` (psycopg, autocommit); the dead tuples of ``extra`` connections' databases
    are added to those of ``conn``'s."""
    nxt, recovery, _own, now_ms = conn.execute(Q_NOW).fetchone()
    backends = [Backend(*row) for row in conn.execute(Q_BACKENDS).fetchall()]
    prepared = [tuple(r) for r in conn.execute(Q_PREPARED).fetchall()]
    slots = [tuple(r) for r in conn.execute(Q_SLOTS).fetchall()]
    standbys = [] if recovery else [tuple(r) for r in conn.execute(Q_STANDBYS).fetchall()]
    frozen = max(0, int(conn.execute(Q_FROZEN).fetchone()[0]))  # negative only after pg_resetwal moved the ids
    rows = list(conn.execute(Q_DEAD).fetchall())
    for other in extra or []:
        rows += other.execute(Q_DEAD).fetchall()
    return Instance(int(nxt), bool(recovery), int(now_ms), backends, prepared, slots, standbys, frozen, dead_tuples(rows))
