"""``safepoint agent mariadb``: one MariaDB server's purge horizon, seen, named and steered.

One agent per server, one node of the safepoint cluster it reports as, in InnoDB's own unit:
transaction numbers (``mvcc_unit = "trx"``). Once per poll (default 1 s) it reads the server
(``connectors/mariadb_holds.py``):

* **Its holds**: each session's read view (at the view's lower limit, labelled with the session's
  thread id, user, host, database, command, isolation level and the first characters of its
  query; a session idle inside its transaction is marked ``IDLE IN TRANSACTION``), each active
  read-write transaction, and each prepared XA transaction (published prepared: its coordinator
  decides it; never expired). It publishes what changed: a hold that appeared opens, one that went
  closes (a moved read view is one of each). A session that went idle (or back to work) since its
  hold opened is restated with a snapshot so that its label says so.
* **A heartbeat** with ``mvcc_now`` = the ``Trx id counter`` (the next transaction number),
  ``purged_ts`` = the purge point (``Purge done for trx's n:o < N``), ``history_length`` = the
  history list length, ``pinned_bytes`` = the undo logs' size where the server counts it (the
  InnoDB metric ``trx_rseg_current_size``), and ``history_above`` = the bytes each hold alone keeps
  (the redo written since its transaction number, scaled to the undo kept).

A poll that fails (the server down, a timeout) says so once, publishes nothing (no close, no
heartbeat: the job holds the safe point when the node goes stale), and the agent reconnects with
back-off. A restart of the agent is a new incarnation: the job drops the old one's sessions'
holds and keeps its prepared transactions until the new agent restates them.

Acting, opt-in and audited (a warning with a structured record, a counter; the job's
``forced_expiry`` alert is the alert): ``--kill idle-in-transaction`` ends a force-expired session
with ``KILL CONNECTION``, only while it is still the same session (its thread id, with the same
read view or transaction in the status text) and idle inside its transaction (``Sleep`` in the
process list) at that moment; ``--kill any`` also a running one on a hard expiry. A prepared XA
transaction is never touched: its expiry is logged and counted only.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from safepoint.connectors.directive_models import ExpireDirective
from safepoint.connectors.engine_agent import AgentStats, EngineAgent
from safepoint.connectors.handles import Handle
from safepoint.connectors.mariadb_holds import (
    IDLE_COMMAND,
    MdbHold,
    Server,
    UndoHistory,
    holds_of,
    parse_innodb_status,
    read_server,
)
from safepoint.connectors.reporter import DEFAULT_EVENTS_TOPIC
from safepoint.errors import ConfigError

__all__ = ["KILL_MODES", "MariaDBAgent", "MariaDBAgentStats", "connect_args", "public_dsn"]

log = logging.getLogger("safepoint.agent.mariadb")

KILL_MODES = ("off", "idle-in-transaction", "any")


def connect_args(dsn: str, password: str | None = None) -> dict[str, Any]:
    """PyMySQL's arguments from ``mysql://USER[:PASSWORD]@HOST[:PORT][/DB]`` (``mariadb://`` too);
    ``password`` (from the environment) stands in for one the DSN does not give."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("mysql", "mariadb") or not parts.hostname:
        msg = f"a MariaDB DSN is mysql://USER[:PASSWORD]@HOST[:PORT][/DB], got {public_dsn(dsn)!r}"
        raise ConfigError(msg)
    return {"host": parts.hostname, "port": parts.port or 3306, "user": unquote(parts.username or "root"),
            "password": unquote(parts.password) if parts.password is not None else (password or ""),
            "database": parts.path.lstrip("/") or None}


def public_dsn(dsn: str) -> str:
    """The DSN without a password."""
    try:
        parts = urlsplit(dsn)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{unquote(parts.username or '')}@{parts.hostname or ''}{port}{parts.path}"
    except ValueError:
        return "mysql://?"


@dataclass
class MariaDBAgentStats(AgentStats):
    next_trx: int = 0
    purged_ts: int = 0
    history_length: int = 0
    undo_bytes: int = 0
    killed: int = 0
    """Sessions ended with ``KILL CONNECTION``."""


class MariaDBAgent(EngineAgent):
    engine = "mariadb"

    def __init__(self, dsn: str, bootstrap: str, cluster: str, *, node: str = "mariadb", password: str | None = None,
                 events_topic: str = DEFAULT_EVENTS_TOPIC, directives_topic: str = "safepoint.directives",
                 poll_s: float = 1.0, kill: str = "off", state_dir: str | None = None, client: str = "confluent",
                 kafka_conf: dict[str, Any] | None = None, timeout_s: float = 5.0, node_key: str | None = None,
                 directive_key: str | None = None) -> None:
        if kill not in KILL_MODES:
            msg = f"kill must be one of {', '.join(KILL_MODES)}, got {kill!r}"
            raise ValueError(msg)
        self.stats: MariaDBAgentStats = MariaDBAgentStats()
        super().__init__(bootstrap, cluster, node, self.stats, log, events_topic=events_topic,
                         directives_topic=directives_topic, poll_s=poll_s, state_dir=state_dir, client=client,
                         kafka_conf=kafka_conf, node_key=node_key, directive_key=directive_key)
        import pymysql  # the mariadb extra

        self.read_errors = (pymysql.Error, OSError, ValueError)
        self.dsn = dsn
        self._args = connect_args(dsn, password)
        self.timeout_s, self.kill = timeout_s, kill
        self.history = UndoHistory()
        self.server: Server | None = None
        self._conn: Any = None

    # -- the server ----------------------------------------------------------------------
    def _connection(self) -> Any:
        """A connection in autocommit; connecting, reading and writing each within ``timeout_s``."""
        import pymysql

        t = max(1, int(self.timeout_s))
        return pymysql.connect(**self._args, autocommit=True, connect_timeout=t, read_timeout=t, write_timeout=t,
                               program_name="safepoint-agent")

    def _close(self, final: bool = False) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def observe(self) -> Server:
        """One reading (connecting first where there is no connection)."""
        if self._conn is None:
            self._conn = self._connection()
        srv = read_server(self._conn)
        self.server = srv
        self.history.add(srv.next_trx, srv.lsn)
        return srv

    def holds(self, reading: Server) -> dict[str, MdbHold]:
        return holds_of(reading)

    def _mvcc_now(self) -> int:
        return self.server.next_trx if self.server is not None else 0

    def _figures(self) -> dict[str, Any]:
        srv = self.server
        if srv is None:
            return {}
        figures: dict[str, Any] = {"purged_ts": srv.purge_done, "history_length": srv.history_length}
        if srv.undo_bytes is not None:
            figures["pinned_bytes"] = srv.undo_bytes
        curve = self.history.curve(srv.purge_done, srv.undo_bytes)
        if curve:
            figures["history_above"] = curve
        return figures

    def _read(self, srv: Server) -> None:
        s = self.stats
        s.next_trx, s.purged_ts, s.history_length = srv.next_trx, srv.purge_done, srv.history_length
        s.undo_bytes = srv.undo_bytes or 0

    # -- start ------------------------------------------------------------------------------
    def start(self) -> MariaDBAgent:
        srv = self.start_reporting()  # the first reading before anything is published (raises when it cannot)
        if srv.undo_bytes is None:
            log.warning("mariadb agent: the server does not count its undo logs' size (the InnoDB metric "
                        "trx_rseg_current_size is off): heartbeats carry no pinned_bytes; start mariadbd with "
                        "--innodb-monitor-enable=trx_rseg_current_size")
        log.info("mariadb agent %s of cluster %s: %s, next trx %d, purged below %d, history list %d, %d holds; kill %s",
                 self.node, self.cluster, public_dsn(self.dsn), srv.next_trx, srv.purge_done, srv.history_length,
                 len(holds_of(srv)), self.kill)
        return self

    # -- forced expiry ------------------------------------------------------------------------
    def _on_expire(self, handle: Handle, directive: ExpireDirective) -> None:
        """A forced expiry of one of this agent's holds (the listener's thread)."""
        ident, hold = self._expiry_of(directive)
        why = self._why_not(hold, directive.mode)
        record = self._record(ident, directive, hold, thread_id=hold.thread_id if hold else None)
        if why is not None:
            self._not_acted(ident, directive, why, record)
            return
        assert hold is not None and hold.thread_id is not None
        gone = self._kill(hold, directive.mode)
        if gone is None:
            self.stats.killed += 1
            log.warning("mariadb agent: ended session %d (%s) with KILL CONNECTION: %s expiry of %s, %s",
                        hold.thread_id, hold.label, directive.mode, ident, directive.reason,
                        extra={"safepoint": {**record, "acted": True}})
        else:
            self._not_acted(ident, directive, gone, record)

    def _why_not(self, hold: MdbHold | None, mode: str) -> str | None:
        """Why a forced expiry is not acted on, or None: it is."""
        if hold is None:
            return "not a hold of this agent now"
        if hold.thread_id is None or hold.kind == "prepared":
            return "a prepared XA transaction is never touched by the agent (only alerted): its coordinator must end it"
        if self.kill == "off":
            return "killing sessions is off (--kill)"
        return None

    def _needs_idle(self, mode: str) -> bool:
        """Whether a session must be idle inside its transaction to be ended by an expiry of this mode."""
        return self.kill == "idle-in-transaction" or mode != "hard"

    def _kill(self, hold: MdbHold, mode: str) -> str | None:
        """``KILL CONNECTION`` of the hold's session if it still holds what the hold is (the same read
        view or transaction under its thread id in the status text, which is never stale) and, when
        the mode asks it, is idle (``Sleep``) at this moment; on a connection of its own (the
        listener's thread). None: ended; else why not."""
        import pymysql

        thread = hold.thread_id
        if thread is None:
            return "no session holds it"
        try:
            conn = self._connection()
        except pymysql.Error as exc:
            return f"cannot connect to end it: {exc}"
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW ENGINE INNODB STATUS")
                status = parse_innodb_status(cur.fetchone()[2])
                same = any(b.thread_id == thread and b.active
                           and (b.view_up == hold.ts if hold.kind == "reader" else b.trx_id == hold.ts)
                           for b in status.transactions)
                if not same:
                    return "the session is gone or no longer holds it"
                cur.execute("SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = %s", (thread,))
                row = cur.fetchone()
                if row is None:
                    return "the session is gone"
                if self._needs_idle(mode) and row[0] != IDLE_COMMAND:
                    return ("it is running a statement (only sessions idle in a transaction are ended"
                            + (" under --kill idle-in-transaction)" if self.kill != "any" else " before a hard expiry)"))
                cur.execute(f"KILL CONNECTION {int(thread)}")
        except pymysql.Error as exc:
            log.error("mariadb agent: KILL CONNECTION %d failed: %s", thread, exc)
            return f"KILL CONNECTION failed: {exc}"
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        return None
