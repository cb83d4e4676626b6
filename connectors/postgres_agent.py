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
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from safepoint.connectors.directive_models import ExpireDirective
from safepoint.connectors.engine_agent import AgentStats, EngineAgent
from safepoint.connectors.handles import Handle
from safepoint.connectors.postgres_holds import IDLE_IN_TX, History, Instance, PgHold, Superseded, holds_of, read_instance
from safepoint.connectors.reporter import DEFAULT_EVENTS_TOPIC

__all__ = ["PostgresAgent", "PostgresAgentStats", "TERMINATE_MODES", "public_dsn"]

log = logging.getLogger("safepoint.agent.postgres")

TERMINATE_MODES = ("off", "idle-in-transaction", "any")


@dataclass
class PostgresAgentStats(AgentStats):
    next_xid8: int = 0
    dead_bytes: int = 0
    wraparound_left: int = 0
    terminated: int = 0
    """Backends ended with ``pg_terminate_backend``."""
    vacuums: int = 0
    vacuumed_tables: int = 0
    vacuum_failures: int = 0


class PostgresAgent(EngineAgent):
    engine = "postgres"
    what = "instance"

    def __init__(self, dsn: str, bootstrap: str, cluster: str, *, node: str = "postgres",
                 events_topic: str = DEFAULT_EVENTS_TOPIC, directives_topic: str = "safepoint.directives",
                 poll_s: float = 1.0, terminate: str = "off", vacuum: bool = False, vacuum_every_s: float = 60.0,
                 vacuum_tables: int = 5, vacuum_min_dead: int = 1000, stats_dsns: list[str] | None = None,
                 state_dir: str | None = None, client: str = "confluent", kafka_conf: dict[str, Any] | None = None,
                 timeout_s: float = 5.0, node_key: str | None = None, directive_key: str | None = None) -> None:
        if terminate not in TERMINATE_MODES:
            msg = f"terminate must be one of {', '.join(TERMINATE_MODES)}, got {terminate!r}"
            raise ValueError(msg)
        self.stats: PostgresAgentStats = PostgresAgentStats()
        super().__init__(bootstrap, cluster, node, self.stats, log, events_topic=events_topic,
                         directives_topic=directives_topic, poll_s=poll_s, state_dir=state_dir, client=client,
                         kafka_conf=kafka_conf, node_key=node_key, directive_key=directive_key)
        import psycopg  # the postgres extra

        self.read_errors = (psycopg.Error, OSError)
        self.dsn, self.stats_dsns = dsn, list(stats_dsns or [])
        self.timeout_s = timeout_s
        self.terminate, self.vacuum = terminate, vacuum
        self.vacuum_every_s, self.vacuum_tables, self.vacuum_min_dead = vacuum_every_s, vacuum_tables, vacuum_min_dead
        self.history = History()
        self.superseded = Superseded()
        self.instance: Instance | None = None
        self._conn: Any = None
        self._extra: list[Any] = []
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

    def _close(self, final: bool = False) -> None:
        if final and self._vacuum_thread is not None:
            self._vacuum_thread.join(30)
        self._close_conns()

    def observe(self) -> Instance:
        """One reading (connecting first where there is no connection)."""
        if self._conn is None or self._conn.closed:
            self._connect()
        inst = read_instance(self._conn, self._extra)
        self.instance = inst
        self.history.add(inst.next_xid8, self.superseded.add(inst.dead))
        return inst

    def holds(self, reading: Instance) -> dict[str, PgHold]:
        return holds_of(reading)

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

    def _read(self, inst: Instance) -> None:
        s = self.stats
        s.next_xid8, s.dead_bytes, s.wraparound_left = inst.next_xid8, inst.dead.dead_bytes, inst.wraparound_left

    def _closed(self, hold: PgHold) -> None:
        with self._lock:
            self._gone_below = max(self._gone_below or hold.ts, hold.ts)

    def _after_beat(self) -> None:
        self._maybe_vacuum()

    # -- start ------------------------------------------------------------------------------
    def start(self) -> PostgresAgent:
        inst = self.start_reporting()  # the first reading before anything is published (raises when it cannot)
        log.info("postgres agent %s of cluster %s: %s%s, next xid %d, %d holds; terminate %s, vacuum %s",
                 self.node, self.cluster, public_dsn(self.dsn), " (standby)" if inst.in_recovery else "",
                 inst.next_xid8, len(holds_of(inst)), self.terminate, "on" if self.vacuum else "off")
        return self

    # -- directives ---------------------------------------------------------------------------
    def _on_expire(self, handle: Handle, directive: ExpireDirective) -> None:
        """A forced expiry of one of this agent's holds (the listener's thread)."""
        ident, hold = self._expiry_of(directive)
        why = self._why_not(hold, directive.mode)
        record = self._record(ident, directive, hold, pid=hold.pid if hold else None)
        if why is not None:
            self._not_acted(ident, directive, why, record)
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
