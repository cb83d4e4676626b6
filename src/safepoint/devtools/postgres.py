"""Local PostgreSQL servers, as the tests, the PostgreSQL example and the demo start them: Debian's
PostgreSQL 15 (``scripts/setup.sh`` installs ``postgresql``), each server in a directory of its own
on a loopback port, a primary and its streaming standbys (``pg_basebackup``), stopped, killed and
started again.

PostgreSQL refuses to run as root: when the caller is root, every server command runs as the
``postgres`` user (``runuser``) in a directory that user owns (made with ``tempfile.mkdtemp``: a
test's own temporary directory is not reachable by another user).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safepoint.devtools.broker import free_port
from safepoint.errors import SafepointError

if TYPE_CHECKING:
    import psycopg

__all__ = ["LocalPostgres", "Writer", "pg_bin", "postgres_missing"]

SERVER_CONF = {
    "listen_addresses": "127.0.0.1",
    "max_prepared_transactions": "10",  # PREPARE TRANSACTION
    "wal_level": "logical",  # logical replication slots
    "max_replication_slots": "10",
    "max_wal_senders": "10",
    "hot_standby_feedback": "on",  # a standby's snapshots hold its primary's horizon (its walsender's xmin)
    "wal_receiver_status_interval": "1s",  # ... told every second (10 s by default)
    "autovacuum_naptime": "10s",
    "fsync": "off",  # throwaway servers: durability is not what is tested
    "shared_buffers": "32MB",
}


def pg_bin(name: str) -> str | None:
    """The path of a PostgreSQL server program (Debian keeps them off the PATH), or None."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return versions[-1] if versions else None


def postgres_missing() -> str | None:
    """None when PostgreSQL's server programs are installed, else what to do."""
    if pg_bin("initdb") is None or pg_bin("pg_ctl") is None:
        return "Debian's postgresql is not installed (scripts/setup.sh installs it as root)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres user to run PostgreSQL as"
    return None


def _as_owner(argv: list[str]) -> list[str]:
    """``argv`` as the ``postgres`` user when this process is root (PostgreSQL refuses root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], timeout: float = 120) -> str:
    done = subprocess.run(_as_owner(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        msg = f"{Path(argv[0]).name} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}"
        raise SafepointError(msg)
    return done.stdout


def _program(name: str) -> str:
    path = pg_bin(name)
    if path is None:
        raise SafepointError(str(postgres_missing()))
    return path


class LocalPostgres:
    """One server: ``LocalPostgres().start()`` makes a new cluster (``initdb``) and starts it; a standby
    of it: ``primary.standby()`` (``pg_basebackup -R``, streaming on loopback). ``conf`` adds or
    replaces ``postgresql.conf`` settings (``SERVER_CONF``); without ``base``, its directory is a new
    temporary one named from ``prefix`` (the demo's, ``safepoint-demo-engines-pg-``, tells its servers
    from a test's)."""

    def __init__(self, base: str | os.PathLike[str] | None = None, *, port: int | None = None,
                 conf: dict[str, str] | None = None, name: str = "pg", prefix: str = "safepoint-pg-") -> None:
        if base is None:
            base = tempfile.mkdtemp(prefix=prefix)
            if os.geteuid() == 0:
                shutil.chown(base, "postgres", "postgres")
        self.base = Path(base)
        self.name = name
        self.data = self.base / name
        self.port = port or free_port()
        self.conf = {**SERVER_CONF, **(conf or {})}
        self.log = self.base / f"{name}.log"
        self._owned = True

    # -- addresses ----------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str = "postgres", application_name: str | None = None) -> str:
        app = f"?application_name={application_name}" if application_name else ""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}{app}"

    def snapshot(self, application_name: str, query: str = "SELECT 1") -> psycopg.Connection[Any]:
        """A session (``application_name``) in a ``REPEATABLE READ`` transaction holding the snapshot
        its ``query`` took: it pins the horizon until the connection ends the transaction."""
        import psycopg

        conn = psycopg.connect(self.dsn(application_name=application_name))
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute(query)
        return conn

    # -- life -----------------------------------------------------------------------------
    def init(self) -> LocalPostgres:
        _run([_program("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
        self._write_conf()
        hba = self.data / "pg_hba.conf"
        lines = hba.read_text()
        if "replication postgres 127.0.0.1/32" not in lines:
            _append(hba, "host replication postgres 127.0.0.1/32 trust\n")
        return self

    def _write_conf(self) -> None:
        settings = "".join(f"{k} = '{v}'\n" for k, v in {**self.conf, "port": str(self.port),
                                                           "unix_socket_directories": str(self.base)}.items())
        _append(self.data / "postgresql.conf", "\n# safepoint's local server\n" + settings)

    def start(self) -> LocalPostgres:
        if not (self.data / "PG_VERSION").exists():
            self.init()
        _run([_program("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"])
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(SafepointError, subprocess.TimeoutExpired):
                _run([_program("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def kill(self) -> None:
        """Stop at once (``immediate``: no checkpoint, as a crash would leave it)."""
        self.stop("immediate")

    def running(self) -> bool:
        done = subprocess.run(_as_owner([_program("pg_ctl"), "-D", str(self.data), "status"]), capture_output=True,
                              check=False)
        return done.returncode == 0

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready = subprocess.run([_program("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                   capture_output=True, check=False)
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        msg = f"PostgreSQL on port {self.port} not ready after {timeout_s:.0f} s: {self.tail()}"
        raise SafepointError(msg)

    def standby(self, name: str = "standby") -> LocalPostgres:
        """A streaming standby of this server (``pg_basebackup -R``: ``primary_conninfo`` set,
        ``hot_standby_feedback`` on), started."""
        other = LocalPostgres(self.base, conf=self.conf, name=name)
        _run([_program("pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-D",
              str(other.data), "-R", "-X", "stream", "--no-sync", "-c", "fast",
              "-d", f"application_name={name}"])
        other._owned = False  # the primary's directory: cleaned with it
        conf = other.data / "postgresql.auto.conf"
        _append(conf, f"primary_conninfo = 'host=127.0.0.1 port={self.port} user=postgres application_name={name}'\n")
        other._write_conf()
        return other.start()

    def reset_xid(self, next_xid8: int) -> None:
        """Move the server's next transaction id to ``next_xid8`` (``pg_resetwal -e/-x``: the epoch and
        the 32-bit id), for a test near a 32-bit wrap: every database is frozen first (``vacuumdb
        --all --freeze``: rows of older xids would otherwise lie in the future after the move), the
        server stopped, moved, and the commit log's segment it needs made; start it again after."""
        if not self.running():
            self.start()
        _run([_program("vacuumdb"), "--all", "--freeze", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"])
        self.stop()
        epoch, xid = next_xid8 >> 32, next_xid8 & 0xFFFFFFFF
        xact = self.data / "pg_xact"
        segment = xact / f"{xid // (8192 * 4 * 32):04X}"  # 4 xids a byte, 8 kB pages, 32 pages a segment
        _run([_program("pg_resetwal"), "-e", str(epoch), "-x", str(xid), "-f", "-D", str(self.data)])
        if not segment.exists():
            _run(["dd", "if=/dev/zero", f"of={segment}", "bs=262144", "count=1", "status=none"])

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.stop("immediate")
        if self._owned:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _append(path: Path, text: str) -> None:
    """Append as whoever can (the file belongs to ``postgres`` when this process is root: root may)."""
    with path.open("a") as f:
        f.write(text)


class Writer(threading.Thread):
    """The write load of the example, the demo and the tests: every ``every_s``, one transaction that
    updates ``per_tx`` rows of ``table``, moving through its ``rows`` rows (ids 0..rows-1, made by
    ``create``); each takes an xid and leaves dead row versions. Stops with ``stop`` (or the event it
    was given); an error once stopped (the server going away under it) is not one."""

    def __init__(self, dsn: str, table: str = "orders", *, rows: int = 1000, per_tx: int = 100, every_s: float = 0.1,
                 application_name: str = "writer", stop: threading.Event | None = None) -> None:
        super().__init__(daemon=True, name=f"pg-{application_name}")
        self.dsn, self.table, self.rows, self.per_tx, self.every_s = dsn, table, rows, per_tx, every_s
        self.application_name = application_name
        self.stop_ = stop if stop is not None else threading.Event()

    def create(self) -> Writer:
        """Make the table: ``rows`` rows of (id, total 0, a 60-character note)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, total int, note text)").format(sql.Identifier(self.table)))
            c.execute(sql.SQL("INSERT INTO {} SELECT g, 0, repeat('x', 60) FROM generate_series(0, %s) g")
                      .format(sql.Identifier(self.table)), (self.rows - 1,))
        return self

    def stop(self) -> None:
        self.stop_.set()

    def run(self) -> None:
        import psycopg
        from psycopg import sql

        update = sql.SQL("UPDATE {} SET total = total + 1 WHERE id >= %s AND id < %s").format(sql.Identifier(self.table))
        try:
            with psycopg.connect(self.dsn, autocommit=True, application_name=self.application_name) as c:
                i = 0
                while not self.stop_.wait(self.every_s):
                    lo = (i * self.per_tx) % self.rows
                    c.execute(update, (lo, lo + self.per_tx))
                    i += 1
        except psycopg.Error:
            if not self.stop_.is_set():
                raise
