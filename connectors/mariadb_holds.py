"""What holds a MariaDB server's purge back, read from InnoDB, in its transaction numbers.

``safepoint agent mariadb`` (``connectors/mariadb_agent.py``) reads this once per poll. Pure apart
from ``read_server``, which runs the statements on one connection; the rules (the status text's
transactions, a hold's id and label, the history curve) are functions of what the server printed,
tested without a server on its own outputs.

InnoDB keeps every row version in its undo logs until no read view may need it; purge removes
them in commit order. Transaction ids and commit numbers come from one counter (``Trx id
counter``, ``Innodb_max_trx_id``): the agent's MVCC unit (``mvcc_unit = "trx"``).

=====================================  ==================================================  =========================
what                                   from                                                published as
=====================================  ==================================================  =========================
a session's read view                  ``SHOW ENGINE INNODB STATUS``: ``Trx read view will   reader ``view-THREAD@Y``
                                       not see trx with id >= X, sees < Y`` under its
                                       ``MariaDB thread id``
a read-write transaction               ``---TRANSACTION ID, ACTIVE``                        transaction ``trx-ID``
a prepared XA transaction              ``---TRANSACTION ID, ACTIVE (PREPARED)`` (``XA        prepared transaction
                                       RECOVER`` names its xid)                              ``xa-ID``
=====================================  ==================================================  =========================

A read view is published at ``Y``, its lower limit: every transaction below it is visible to the
view, so the versions it may still need are those of transactions from ``Y`` on. The id carries
``Y``: a session whose next read view is newer (READ COMMITTED takes one per statement, a new
transaction another) closes one hold and opens another, and the job never sees a hold's timestamp
change under one id. No SQL view shows a read view's limits (``information_schema.INNODB_TRX``
has none), so they are read from the status text; ``INNODB_TRX`` and ``PROCESSLIST`` give each
session's user, host, database, command, query and when its transaction began.

A read view is printed while it is open: an idle REPEATABLE READ transaction after its first
read keeps it (the forgotten session), a READ COMMITTED one only while a statement runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["InnodbStatus", "MdbHold", "Server", "Session", "TrxBlock", "UndoHistory", "holds_of", "parse_innodb_status",
           "read_server"]

QUERY_CHARS = 60
"""The first characters of a session's query in its hold's label."""
IDLE_COMMAND = "Sleep"
"""``PROCESSLIST.COMMAND`` of a session between statements: inside a transaction, the forgotten one."""
HoldKind = Literal["reader", "tx", "prepared"]

_COUNTER = re.compile(r"^Trx id counter (\d+)", re.M)
_PURGE = re.compile(r"^Purge done for trx's n:o < (\d+)", re.M)
_HISTORY = re.compile(r"^History list length (\d+)", re.M)
_TRX = re.compile(r"^---TRANSACTION (?:(\d+)|\(0x[0-9a-f]+\)), (.*)$")
_THREAD = re.compile(r"^(?:MariaDB|MySQL) thread id (\d+),")
_VIEW = re.compile(r"^Trx read view will not see trx with id >= (\d+), sees < (\d+)")
_UNDO = re.compile(r"undo log entries (\d+)")


@dataclass(frozen=True)
class TrxBlock:
    """One ``---TRANSACTION`` block of the status text."""

    trx_id: int | None
    """Its transaction id; None before its first write (read-only so far: no id)."""
    active: bool
    """``ACTIVE`` (not ``not started``: a session's idle transaction object)."""
    prepared: bool
    """``ACTIVE (PREPARED)``: an XA transaction prepared, waiting for its coordinator's decision."""
    recovered: bool
    """``recovered trx``: no session owns it (a prepared XA transaction whose session went, or one
    found prepared at the server's start)."""
    thread_id: int | None
    """``MariaDB thread id``: the session (``PROCESSLIST.ID``); None for a recovered transaction."""
    view_low: int | None = None
    """``will not see trx with id >= X``: the counter when its read view was made."""
    view_up: int | None = None
    """``sees < Y``: every transaction below it is visible to the view (its lower limit)."""
    undo_entries: int = 0


@dataclass(frozen=True)
class InnodbStatus:
    """The TRANSACTIONS section of ``SHOW ENGINE INNODB STATUS``."""

    trx_counter: int
    """``Trx id counter``: the next transaction number."""
    purge_done: int
    """``Purge done for trx's n:o < N``: purge has removed the undo of transactions committed below N."""
    history_length: int
    """``History list length``: undo logs of committed transactions not yet purged."""
    transactions: list[TrxBlock] = field(default_factory=list)


def parse_innodb_status(text: str) -> InnodbStatus:
    """The transactions section of the status text (MariaDB 10.11's wording; MySQL's ``MySQL thread
    id`` is read too). Raises ValueError when the section's three figures are missing."""
    found = [rx.search(text) for rx in (_COUNTER, _PURGE, _HISTORY)]
    if not all(found):
        msg = "SHOW ENGINE INNODB STATUS has no TRANSACTIONS section with the trx id counter, purge and history list"
        raise ValueError(msg)
    counter, purge, history = (int(m.group(1)) for m in found if m is not None)
    blocks: list[TrxBlock] = []
    cur: dict[str, Any] | None = None
    section = text[text.find("LIST OF TRANSACTIONS FOR EACH SESSION:"):]
    for raw in section.splitlines()[1:]:
        line = raw.strip()
        if line.startswith("--------"):  # the next section
            break
        m = _TRX.match(line)
        if m:
            if cur is not None:
                blocks.append(TrxBlock(**cur))
            rest = m.group(2)
            cur = {"trx_id": int(m.group(1)) if m.group(1) else None, "active": rest.startswith("ACTIVE"),
                   "prepared": "(PREPARED)" in rest, "recovered": "recovered trx" in rest, "thread_id": None}
            continue
        if cur is None:
            continue
        if (t := _THREAD.match(line)) is not None:
            cur["thread_id"] = int(t.group(1))
        elif (v := _VIEW.match(line)) is not None:
            cur["view_low"], cur["view_up"] = int(v.group(1)), int(v.group(2))
        elif (u := _UNDO.search(line)) is not None:
            cur["undo_entries"] = int(u.group(1))
    if cur is not None:
        blocks.append(TrxBlock(**cur))
    return InnodbStatus(counter, purge, history, blocks)


@dataclass(frozen=True)
class Session:
    """A row of ``information_schema.INNODB_TRX`` with its session's ``PROCESSLIST`` row."""

    thread_id: int
    started_ms: int | None
    """``trx_started`` (whole seconds)."""
    isolation: str | None
    user: str | None
    host: str | None
    db: str | None
    command: str | None
    """``Sleep`` between statements, ``Query`` while one runs."""
    query: str | None

    @property
    def idle(self) -> bool:
        """Inside its transaction with no statement running: the forgotten session."""
        return self.command == IDLE_COMMAND


@dataclass(frozen=True)
class MdbHold:
    """One hold, as the agent publishes it."""

    kind: HoldKind
    id: str
    ts: int
    """The transaction number it holds."""
    label: str
    opened_wall_ms: int | None
    """When its transaction began by the server's clock (``trx_started``); None: not known."""
    thread_id: int | None = None
    """The session that holds it: what a forced expiry may end (never a prepared XA transaction's)."""
    idle: bool = False
    marked: bool = False
    """Its label says ``IDLE IN TRANSACTION``: the agent restates the hold when that changes."""


@dataclass(frozen=True)
class Server:
    """One poll's reading."""

    own_thread: int
    status: InnodbStatus
    sessions: list[Session]
    xa: list[str]
    """``XA RECOVER FORMAT='SQL'``'s xids, as SQL (``'gtrid','bqual',formatID``)."""
    lsn: int
    """``Innodb_lsn_current``: bytes of redo written so far (the curve of ``UndoHistory``)."""
    undo_bytes: int | None
    """The undo logs' size beyond their headers: ``(trx_rseg_current_size - rollback segments) *
    page size``; None where that InnoDB metric is not enabled."""

    @property
    def next_trx(self) -> int:
        return self.status.trx_counter

    @property
    def purge_done(self) -> int:
        return self.status.purge_done

    @property
    def history_length(self) -> int:
        return self.status.history_length


def _short(text: str | None, n: int = QUERY_CHARS) -> str:
    one = " ".join((text or "").split())
    return one if len(one) <= n else one[: n - 1] + "…"


def session_label(thread_id: int, s: Session | None) -> str:
    """``thread 32 (app@127.0.0.1/lab, IDLE IN TRANSACTION, REPEATABLE READ): SELECT ...`` (no times: a
    label is restated only when the session's idleness changes; the hold's age comes from when its
    transaction began)."""
    if s is None:
        return f"thread {thread_id}"
    host = (s.host or "?").rsplit(":", 1)[0]
    who = f"{s.user or '?'}@{host}/{s.db or '-'}"
    state = "IDLE IN TRANSACTION" if s.idle else (s.command or "?").lower()
    iso = f", {s.isolation}" if s.isolation else ""
    head = f"thread {thread_id} ({who}, {state}{iso})"
    query = _short(s.query)
    return f"{head}: {query}" if query else head


def holds_of(server: Server) -> dict[str, MdbHold]:
    """Every hold of the server by id (the agent's own session left out)."""
    sessions = {s.thread_id: s for s in server.sessions}
    xa = ", ".join(server.xa[:3]) + (f" and {len(server.xa) - 3} more" if len(server.xa) > 3 else "")
    out: dict[str, MdbHold] = {}
    for b in server.status.transactions:
        if not b.active or (b.thread_id is not None and b.thread_id == server.own_thread):
            continue
        s = sessions.get(b.thread_id) if b.thread_id is not None else None
        started = s.started_ms if s is not None else None
        idle = bool(s is not None and s.idle)
        if b.prepared and b.trx_id is not None:
            owner = f"thread {b.thread_id}" if b.thread_id is not None else "no session"
            label = _short(f"prepared XA transaction {b.trx_id} ({owner}; XA RECOVER: {xa or 'none'})", 200)
            out[f"xa-{b.trx_id}"] = MdbHold("prepared", f"xa-{b.trx_id}", b.trx_id, label, started)
            continue
        if b.thread_id is None:
            continue  # a recovered transaction being rolled back: InnoDB ends it on its own
        label = session_label(b.thread_id, s)
        if b.view_up is not None:
            hid = f"view-{b.thread_id}@{b.view_up}"
            out[hid] = MdbHold("reader", hid, b.view_up, label, started, b.thread_id, idle, idle)
        if b.trx_id is not None:
            hid = f"trx-{b.trx_id}"
            out[hid] = MdbHold("tx", hid, b.trx_id, label, started, b.thread_id, idle, idle)
    return out


class UndoHistory:
    """The server's history curve for heartbeats' ``history_above``: readings of (next transaction
    number, redo bytes written so far, ``Innodb_lsn_current``). The versions a hold at ``ts`` alone
    keeps are those written since ``ts``; redo counts every change's bytes, so the curve is scaled by
    the undo kept per redo byte written since the purge point when the undo size is known (else it
    is the redo written: an upper bound of the same shape)."""

    def __init__(self, points: int = 64) -> None:
        self.points = points
        self._readings: list[tuple[int, int]] = []

    def add(self, trx: int, lsn: int) -> None:
        if self._readings and (lsn < self._readings[-1][1] or trx < self._readings[-1][0]):
            self._readings.clear()  # a server restored or replaced: start again
        if self._readings and self._readings[-1][0] == trx:
            self._readings[-1] = (trx, lsn)
        else:
            self._readings.append((trx, lsn))
        if len(self._readings) > self.points:  # the first and the last stay; the closest pair loses one
            r = self._readings
            k = min(range(1, len(r) - 1), key=lambda i: r[i + 1][0] - r[i - 1][0])
            del r[k]

    def lsn_at(self, trx: int) -> int | None:
        """The redo position when the counter was at ``trx`` (the last reading at or below it)."""
        found = None
        for t, lsn in self._readings:
            if t > trx:
                break
            found = lsn
        return found

    def curve(self, purge_done: int | None = None, undo_bytes: int | None = None) -> list[dict[str, int]]:
        """``history_above`` points: (ts, bytes kept above ts), oldest reading first."""
        if len(self._readings) < 2:
            return []
        now = self._readings[-1][1]
        scale = 1.0
        if undo_bytes is not None and purge_done is not None:
            since = self.lsn_at(purge_done)
            if since is not None and now > since:
                scale = min(1.0, undo_bytes / (now - since))
        return [{"ts": t, "bytes": int((now - lsn) * scale)} for t, lsn in self._readings]


# -- reading a server (PyMySQL) ----------------------------------------------------------------
Q_SESSIONS = """
SELECT t.trx_mysql_thread_id, CAST(UNIX_TIMESTAMP(t.trx_started) * 1000 AS SIGNED), t.trx_isolation_level,
       p.USER, p.HOST, p.DB, p.COMMAND, LEFT(p.INFO, 200)
  FROM information_schema.INNODB_TRX t
  LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
 WHERE t.trx_mysql_thread_id <> CONNECTION_ID()"""
Q_STATUS = "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_lsn_current', 'Innodb_page_size')"
Q_UNDO = "SELECT `COUNT`, `ENABLED` FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_current_size'"
ROLLBACK_SEGMENTS = 128
"""InnoDB's rollback segments, one header page each (what ``trx_rseg_current_size`` counts when no undo is kept)."""


def read_server(conn: Any) -> Server:
    """One reading on ``conn`` (PyMySQL, autocommit)."""
    with conn.cursor() as cur:
        cur.execute("SELECT CONNECTION_ID()")
        own = cur.fetchone()[0]
        cur.execute("SHOW ENGINE INNODB STATUS")
        status = parse_innodb_status(cur.fetchone()[2])
        cur.execute(Q_SESSIONS)
        sessions = [Session(int(r[0]), None if r[1] is None else int(r[1]), *r[2:]) for r in cur.fetchall()]
        cur.execute("XA RECOVER FORMAT='SQL'")
        xa = [str(r[3]) for r in cur.fetchall()]
        cur.execute(Q_STATUS)
        figures = {name: int(value) for name, value in cur.fetchall()}
        cur.execute(Q_UNDO)
        row = cur.fetchone()
        undo = None
        if row is not None and int(row[1]):
            page = figures.get("Innodb_page_size", 16384)
            undo = max(0, int(row[0]) - ROLLBACK_SEGMENTS) * page
    return Server(int(own), status, sessions, xa, figures.get("Innodb_lsn_current", 0), undo)
