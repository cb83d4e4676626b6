"""``safepoint agent postgres``: one PostgreSQL instance's vacuum horizon, seen, explained and steered.

One agent per instance (a primary or a standby), one node of the safepoint cluster the fleet
reports as. Once per poll (default 1 s) it reads the instance (``connectors/postgres_holds.py``):

* **Its holds**, in 64-bit transaction ids (``xid8``; a 32-bit ``backend_xmin`` or ``xmin`` is
  converted with the current epoch, right across the 32-bit wrap): each backend's snapshot and xid
  (labelled with ``application_name``, user, database, state, the first characters of the query,
  and when its transaction began), each prepared transaction (published prepared, with its gid),
  each replication slot's ``xmin`` and ``catalog_xmin`` (an inactive slot marked), and on a primary
  each standby's ``hot_standby_feedback``. It publishes what changed: a hold that appeared opens,
  one that went closes (a moved ``xmin`` is one of each). A new agent's first poll publishes them
  all; its reporter's repair snapshot restates them after a failed delivery. A backend that went
  idle in its transaction (or back to work) since its hold opened, or a slot whose reader went (or
  came), is restated with a snapshot, so that the hold's label marks it ``IDLE IN TRANSACTION`` or
  ``INACTIVE`` (or no longer).
* **A heartbeat** with ``mvcc_now`` = the next xid8 (``pg_current_snapshot()``'s ``xmax``: reading it
  takes no xid), ``pinned_bytes`` = the estimated bytes of dead tuples, ``history_above`` = the
  bytes of versions superseded since each of the last readings (what a hold at that xid alone
  keeps), and ``wraparound_left`` = transactions left before the 32-bit ids would wrap.

A poll that fails (the server down, a timeout) says so once, publishes nothing (no close, no
heartbeat: the job holds the safe point when the node goes stale), and the agent reconnects with
back-off. A restart of the agent is a new incarnation: the job drops the old one's backends'
holds and keeps its prepared transactions until the new agent restates them.

Acting, each opt-in and audited (a warning with a structured record, a counter; the job's
``forced_expiry`` alert is the alert):

* ``terminate``: a forced-expiry directive naming a backend's hold ends that backend with
  ``pg_terminate_backend``: ``idle-in-transaction`` ends only sessions idle in a transaction (no
  statement runs: nothing is cut short), ``any`` also a running one when the expiry is ``hard``.
  The backend is checked to be the same one (its ``backend_start``) and, where idleness is asked, to
  be idle in its transaction at the moment it is ended (its state when the hold was first seen does
  not count: the statement that took the snapshot was often still running). A prepared
  transaction, a slot or a standby is never touched: their expiry is logged and counted only.
* ``vacuum``: when a directive's ``safe_ts`` passes a hold that went since the last vacuum, ``VACUUM``
  the tables with the most dead tuples (at most ``vacuum_tables``, at most once per
  ``vacuum_every_s``), so the space comes back before autovacuum's next turn.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from safepoint.connectors.directive_models import Directive, ExpireDirective
from safepoint.connectors.handles import Handle, Reader, Transaction
from safepoint.connectors.listener import DirectiveListener
from safepoint.connectors.postgres_holds import IDLE_IN_TX, History, Instance, PgHold, Superseded, holds_of, read_instance
from safepoint.connectors.reporter import DEFAULT_EVENTS_TOPIC, Reporter
from safepoint.errors import SafepointError

__all__ = ["PostgresAgent", "PostgresAgentStats", "TERMINATE_MODES", "public_dsn"]

log = logging.getLogger("safepoint.agent.postgres")

TERMINATE_MODES = ("off", "idle-in-transaction", "any")
MAX_BACKOFF_S = 10.0


@dataclass
class PostgresAgentStats:
    polls: int = 0
    heartbeats: int = 0
    failures: int = 0
    """Polls that could not read the instance."""
    holds: int = 0
    """Holds of the last poll."""
    opened: int = 0
    closed: int = 0
    next_xid8: int = 0
    dead_bytes: int = 0
    wraparound_left: int = 0
    directive_seq: int = 0
    safe_ts: int = 0
    expiries: int = 0
    """Forced-expiry directives for this agent's holds."""
    terminated: int = 0
    """Backends ended with ``pg_terminate_backend``."""
    relabeled: int = 0
    """Holds restated with a new label (their backend went idle in its transaction or back to work,
    their slot's reader went or came)."""
    expiries_not_acted: int = 0
    """Expiries the agent did not act on: terminate off, a running backend under ``idle-in-transaction``,
    a prepared transaction, a slot, a standby, a backend gone or another one meanwhile."""
    vacuums: int = 0
    vacuumed_tables: int = 0
    vacuum_failures: int = 0


class PostgresAgent:
    def __init__(self, dsn: str, bootstrap: str, cluster: str, *, node: str = "postgres",
                 events_topic: str = DEFAULT_EVENTS_TOPIC, directives_topic: str = "safepoint.directives",
                 poll_s: float = 1.0, terminate: str = "off", vacuum: bool = False, vacuum_every_s: float = 60.0,
                 vacuum_tables: int = 5, vacuum_min_dead: int = 1000, stats_dsns: list[str] | None = None,
                 state_dir: str | None = None, client: str = "confluent", kafka_conf: dict[str, Any] | None = None,
                 timeout_s: float = 5.0, node_key: str | None = None, directive_key: str | None = None) -> None:
        if terminate not in TERMINATE_MODES:
            msg = f"terminate must be one of {', '.join(TERMINATE_MODES)}, got {terminate!r}"
            raise ValueError(msg)
        self.dsn, self.stats_dsns = dsn, list(stats_dsns or [])
        self.bootstrap, self.cluster, self.node = bootstrap, cluster, node
        self.events_topic, self.directives_topic = events_topic, directives_topic
        self.poll_s, self.timeout_s = poll_s, timeout_s
        self.terminate, self.vacuum = terminate, vacuum
        self.vacuum_every_s, self.vacuum_tables, self.vacuum_min_dead = vacuum_every_s, vacuum_tables, vacuum_min_dead
        self.state_dir, self.client, self.kafka_conf, self.node_key = state_dir, client, kafka_conf or {}, node_key
        self.directive_key = directive_key
        self.stats = PostgresAgentStats()
        self.history = History()
        self.superseded = Superseded()
        self.instance: Instance | None = None
        self.reporter: Reporter | None = None
        self.listener: DirectiveListener | None = None
        self.on_beat: Callable[[], None] | None = None
        """Called after each heartbeat (``safepoint agent postgres --stats-file`` writes the counters)."""
        self._conn: Any = None
        self._extra: list[Any] = []
        self._handles: dict[str, tuple[PgHold, Handle]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        """Between the listener's thread (directives, expiries) and the loop."""
        self._down_since: float | None = None
        self._backoff_s = poll_s
        self._gone_below: int | None = None
        """The highest ts of a hold that went since the last vacuum (a safe_ts past it is worth one)."""
        self._vacuum_at: float | None = None
        self._vacuum_thread: threading.Thread | None = None

    # -- the instance -------------------------------------------------------------------
    def _connection(self, dsn: str, application_name: str = "safepoint-agent", timed: bool = True) -> Any:
        """A connection in autocommit, named in ``pg_stat_activity``; ``timed``: each statement and the
        connecting within ``timeout_s`` (not a VACUUM, which takes what it takes)."""
        import psycopg  # the postgres extra

        options = f"-c statement_timeout={int(self.timeout_s * 1000)}" if timed else ""
        return psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(self.timeout_s)), options=options,
                               application_name=application_name)

    def _connect(self) -> None:
        self._close_conns()
        self._conn = self._connection(self.dsn)
        self._extra = [self._connection(d) for d in self.stats_dsns]

    def _close_conns(self) -> None:
        for c in (self._conn, *self._extra):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self._conn, self._extra = None, []

    def observe(self) -> Instance:
        """One reading (connecting first where there is no connection)."""
        if self._conn is None or self._conn.closed:
            self._connect()
        inst = read_instance(self._conn, self._extra)
        self.instance = inst
        self.history.add(inst.next_xid8, self.superseded.add(inst.dead))
        return inst

    def _mvcc_now(self) -> int:
        return self.instance.next_xid8 if self.instance is not None else 0

    def _figures(self) -> dict[str, Any]:
        inst = self.instance
        if inst is None:
            return {}
        figures: dict[str, Any] = {"pinned_bytes": inst.dead.dead_bytes, "wraparound_left": inst.wraparound_left}
        curve = self.history.curve()
        if curve:
            figures["history_above"] = curve
        return figures

    # -- start and stop -------------------------------------------------------------------
    def start(self) -> PostgresAgent:
        inst = self.observe()  # the first reading before anything is published (raises when it cannot)
        self.reporter = Reporter(self.bootstrap, self.node, cluster=self.cluster, mvcc_clock=self._mvcc_now,
                                 figures=self._figures, heartbeat_interval_s=None, topic=self.events_topic,
                                 state_dir=self.state_dir, client=self.client, kafka_conf=self.kafka_conf,
                                 node_key=self.node_key, observer=True, on_expire=self._on_expire)
        self.listener = DirectiveListener(self.bootstrap, self.cluster, topic=self.directives_topic,
                                          on_directive=self._take, reporter=self.reporter,
                                          kafka_conf=self.kafka_conf, client=self.client,
                                          directive_key=self.directive_key).start()
        log.info("postgres agent %s of cluster %s: %s%s, next xid %d, %d holds; terminate %s, vacuum %s",
                 self.node, self.cluster, public_dsn(self.dsn), " (standby)" if inst.in_recovery else "",
                 inst.next_xid8, len(holds_of(inst)), self.terminate, "on" if self.vacuum else "off")
        return self

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.reporter is not None:
            self.reporter.close()
        if self._vacuum_thread is not None:
            self._vacuum_thread.join(30)
        self._close_conns()
        log.info("postgres agent %s stopped: %s", self.node, json.dumps(asdict(self.stats)))

    def run(self, until: float | None = None) -> None:
        """Poll, publish and act until ``stop()`` (or the monotonic time ``until``)."""
        assert self.reporter is not None, "start() first"
        try:
            while not self._stop.is_set() and (until is None or time.monotonic() < until):
                wait = self.poll()
                self._stop.wait(wait)
        finally:
            self.close()

    # -- one poll ----------------------------------------------------------------------------
    def poll(self) -> float:
        """Read, publish what changed and a heartbeat; the time to the next poll."""
        assert self.reporter is not None
        import psycopg

        try:
            inst = self.observe() if self.stats.polls else self.instance or self.observe()
        except (psycopg.Error, OSError) as exc:
            self.stats.failures += 1
            self._close_conns()
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.error("postgres agent: the instance cannot be read (%s); nothing is published until it can "
                          "(the job holds the safe point when this node goes stale); retrying with back-off",
                          str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)
            return self._backoff_s
        self.stats.polls += 1
        if self._down_since is not None:
            log.warning("postgres agent: the instance answers again after %.1f s", time.monotonic() - self._down_since)
            self._down_since = None
            self._backoff_s = self.poll_s
        try:
            self._sync(holds_of(inst))
        except SafepointError:  # a change not published (the broker away): the next poll tries again, and
            # the reporter restates every hold it has once deliveries work (its repair snapshot)
            log.warning("postgres agent: a change of holds not published; retrying at the next poll", exc_info=True)
        s = self.stats
        s.next_xid8, s.dead_bytes, s.wraparound_left = inst.next_xid8, inst.dead.dead_bytes, inst.wraparound_left
        try:
            self.reporter.heartbeat()
            s.heartbeats += 1
        except SafepointError:  # the broker is away: the reporter reconnects and restates its holds
            log.warning("postgres agent: heartbeat not published; retrying in %.1f s", self.poll_s, exc_info=True)
        if self.on_beat is not None:
            self.on_beat()
        self._maybe_vacuum()
        return self.poll_s

    def _sync(self, now: dict[str, PgHold]) -> None:
        """Close the holds that went, open those that came (lowest first: a close never comes before
        the open that replaces it, so the node's minimum never rises past a hold still there), and
        restate every hold (a snapshot: no hold closes or opens) once one's marked state changed (a
        backend went idle in its transaction or back to work, a slot's reader went or came), so that
        its label says what it does now."""
        assert self.reporter is not None
        came = sorted((h for hid, h in now.items() if hid not in self._handles), key=lambda h: (h.ts, h.id))
        relabeled = 0
        for hid, (held, handle) in list(self._handles.items()):
            fresh = now.get(hid)
            if fresh is not None and fresh.marked != held.marked:
                handle.label = fresh.label
                self._handles[hid] = (fresh, handle)
                relabeled += 1
        for h in came:
            self._open(h)
        went = [hid for hid in self._handles if hid not in now]
        for hid in went:
            hold, handle = self._handles.pop(hid)
            if isinstance(handle, Reader):
                handle.close()
            elif isinstance(handle, Transaction):
                handle.end("abort" if handle.expired else "commit")
            self.stats.closed += 1
            with self._lock:
                self._gone_below = max(self._gone_below or hold.ts, hold.ts)
        self.stats.holds = len(self._handles)
        if relabeled:
            self.reporter.snapshot()
            self.stats.relabeled += relabeled

    def _open(self, h: PgHold) -> None:
        assert self.reporter is not None
        handle: Handle
        if h.kind == "reader":
            handle = self.reporter.reader(h.ts, reader_id=h.id, label=h.label)
        else:
            handle = self.reporter.transaction(h.ts, tx_id=h.id, label=h.label)
        handle.opened_wall_ms = h.opened_wall_ms
        if isinstance(handle, Reader):
            handle.open()
        else:
            assert isinstance(handle, Transaction)
            handle.begin()
            if h.kind == "prepared":  # its fate is its client's (COMMIT / ROLLBACK PREPARED): never expired
                handle.prepare(self.node, [self.node])
        self._handles[h.id] = (h, handle)
        self.stats.opened += 1

    # -- directives ---------------------------------------------------------------------------
    def _take(self, directive: Directive) -> None:
        """The newest directive the listener delivered (its seq advanced, or a new generation's)."""
        with self._lock:
            self.stats.directive_seq, self.stats.safe_ts = directive.seq, directive.safe_ts

    def _on_expire(self, handle: Handle, directive: ExpireDirective) -> None:
        """A forced expiry of one of this agent's holds (the listener's thread)."""
        self.stats.expiries += 1
        ident = directive.reader_id or directive.tx_id or ""
        entry = self._handles.get(ident)
        hold = entry[0] if entry else None
        why = self._why_not(hold, directive.mode)
        record = {"event": "forced_expiry", "engine": "postgres", "cluster": self.cluster, "node": self.node,
                  "id": ident, "mode": directive.mode, "reason": directive.reason, "seq": directive.seq,
                  "label": hold.label if hold else None, "pid": hold.pid if hold else None}
        if why is not None:
            self.stats.expiries_not_acted += 1
            log.warning("postgres agent: expiry of %s (%s) not acted on: %s", ident, directive.mode, why,
                        extra={"safepoint": {**record, "acted": False, "why": why}})
            return
        assert hold is not None and hold.pid is not None
        ended = self._terminate(hold, directive.mode)
        if ended:
            self.stats.terminated += 1
            log.warning("postgres agent: ended backend %d (%s) with pg_terminate_backend: %s expiry of %s, %s",
                        hold.pid, hold.label, directive.mode, ident, directive.reason,
                        extra={"safepoint": {**record, "acted": True}})
        else:
            self.stats.expiries_not_acted += 1
            log.warning("postgres agent: backend %d of %s is gone, another one now or no longer idle; nothing ended",
                        hold.pid, ident,
                        extra={"safepoint": {**record, "acted": False, "why": "gone"}})

    def _why_not(self, hold: PgHold | None, mode: str) -> str | None:
        """Why a forced expiry is not acted on, or None: it is."""
        if hold is None:
            return "not a hold of this agent now"
        if hold.pid is None:
            what = "a prepared transaction" if hold.kind == "prepared" else "a replication slot or a standby's feedback"
            return f"{what} is never touched by the agent (only alerted): its owner must end it"
        if self.terminate == "off":
            return "terminating backends is off (--terminate)"
        if not self._idle_now(hold) and self._needs_idle(mode):
            return ("the backend is running a statement (only sessions idle in a transaction are ended"
                    + (" under --terminate idle-in-transaction)" if self.terminate != "any" else " before a hard expiry)"))
        return None

    def _needs_idle(self, mode: str) -> bool:
        """Whether a backend must be idle in a transaction to be ended by an expiry of this mode."""
        return self.terminate == "idle-in-transaction" or mode != "hard"

    def _idle_now(self, hold: PgHold) -> bool:
        """Whether the hold's backend was idle in a transaction at the last reading (its state when the
        hold was first seen may have been ``active``: the statement that took the snapshot was running)."""
        inst = self.instance
        if inst is None:
            return hold.idle_in_transaction
        return any(b.pid == hold.pid and b.backend_start_ms == hold.backend_start_ms and b.idle_in_transaction
                   for b in inst.backends)

    def _terminate(self, hold: PgHold, mode: str) -> bool:
        """``pg_terminate_backend`` of the hold's backend, if it is still the same backend (and, when the
        mode asks it, still idle in a transaction at this moment); on a connection of its own (the
        listener's thread)."""
        import psycopg

        states = list(IDLE_IN_TX) if self._needs_idle(mode) else None
        try:
            with self._connection(self.dsn) as conn:
                row = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s "
                    "AND (extract(epoch from backend_start) * 1000)::bigint = %s "
                    "AND (%s::text[] IS NULL OR state = ANY(%s::text[]))",
                    (hold.pid, hold.backend_start_ms, states, states),
                ).fetchone()
        except psycopg.Error as exc:
            log.error("postgres agent: pg_terminate_backend(%d) failed: %s", hold.pid, exc)
            return False
        return bool(row and row[0])

    # -- vacuum ---------------------------------------------------------------------------------
    def _maybe_vacuum(self) -> None:
        if not self.vacuum or self.instance is None or self.instance.in_recovery:
            return
        if self._vacuum_thread is not None and self._vacuum_thread.is_alive():
            return
        now = time.monotonic()
        if self._vacuum_at is not None and now - self._vacuum_at < self.vacuum_every_s:
            return
        with self._lock:
            gone, safe = self._gone_below, self.stats.safe_ts
            if gone is None or safe <= gone:
                return  # no hold went that the safe point has passed since the last vacuum
            self._gone_below = None
        tables = [t for t, n in self.instance.dead.tables if n >= self.vacuum_min_dead][: self.vacuum_tables]
        if not tables:
            return
        self._vacuum_at = now
        self._vacuum_thread = threading.Thread(target=self._vacuum, args=(tables, safe, gone), daemon=True,
                                               name="safepoint-vacuum")
        self._vacuum_thread.start()

    def _vacuum(self, tables: list[str], safe: int, gone: int) -> None:
        import psycopg
        from psycopg import sql

        try:
            with self._connection(self.dsn, "safepoint-vacuum", timed=False) as conn:
                for table in tables:
                    schema, _, name = table.partition(".")
                    start = time.monotonic()
                    conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(schema, name)))
                    self.stats.vacuumed_tables += 1
                    log.info("postgres agent: VACUUM %s in %.2f s (the safe point %d passed a hold at %d that went)",
                             table, time.monotonic() - start, safe, gone)
            self.stats.vacuums += 1
        except psycopg.Error as exc:
            self.stats.vacuum_failures += 1
            log.error("postgres agent: VACUUM failed: %s", exc)


def public_dsn(dsn: str) -> str:
    """The DSN without a password."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - only for the log line
        return "postgresql"
    return f"postgresql://{parts.get('user', '')}@{parts.get('host', '')}:{parts.get('port', '5432')}/{parts.get('dbname', '')}"
