"""Local MariaDB servers, as the tests, the MariaDB example and the demo start them: Debian's
MariaDB 10.11 (``scripts/setup.sh`` installs ``mariadb-server``), each server in a directory of its
own on a loopback port (``mariadb-install-db``, then ``mariadbd``), stopped, killed and started
again.

MariaDB refuses to run as root: ``mariadbd --user=mysql`` drops to the ``mysql`` user, in a
directory that user owns (made with ``tempfile.mkdtemp``: a test's own temporary directory is not
reachable by another user). The server keeps the InnoDB metric ``trx_rseg_current_size`` on (off
by default), which gives the agent the undo logs' size.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from safepoint.devtools.broker import free_port
from safepoint.errors import SafepointError

__all__ = ["LocalMariaDB", "MariaWriter", "mariadb_missing"]

INSTALL_DB = "mariadb-install-db"
SERVER = "/usr/sbin/mariadbd"
SERVER_FLAGS = [
    "--skip-name-resolve",
    "--innodb-log-file-size=8M",  # throwaway servers: 8 MB of redo, not 100
    "--innodb-buffer-pool-size=32M",
    "--innodb-monitor-enable=trx_rseg_current_size",  # the undo logs' size, for the agent's figures
    "--innodb-flush-log-at-trx-commit=2",  # durability is not what is tested
]


def _server() -> str | None:
    return SERVER if os.path.exists(SERVER) else shutil.which("mariadbd")


def mariadb_missing() -> str | None:
    """None when MariaDB's server programs and the PyMySQL driver are installed, else what to do."""
    if _server() is None or shutil.which(INSTALL_DB) is None:
        return "Debian's mariadb-server is not installed (scripts/setup.sh installs it as root)"
    try:
        import pymysql  # noqa: F401 - the mariadb extra
    except ImportError:
        return "PyMySQL is not installed (pip install -e '.[mariadb]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("mysql")
        except KeyError:
            return "running as root, and there is no mysql user to run MariaDB as"
    return None


class LocalMariaDB:
    """One server: ``LocalMariaDB().start()`` makes a new data directory (``mariadb-install-db``)
    and starts ``mariadbd`` on ``127.0.0.1:port``; ``root`` connects without a password over TCP.
    Without ``base``, its directory is a new temporary one named from ``prefix``."""

    def __init__(self, base: str | os.PathLike[str] | None = None, *, port: int | None = None,
                 prefix: str = "safepoint-mariadb-", flags: list[str] | None = None) -> None:
        owned = base is None
        if base is None:
            base = tempfile.mkdtemp(prefix=prefix)
            os.chmod(base, 0o755)  # noqa: S103 - the mysql user must reach its data dir inside
            if os.geteuid() == 0:
                shutil.chown(base, "mysql", "mysql")
        self.base = Path(base)
        self.data = self.base / "data"
        self.socket = self.base / "mysqld.sock"
        self.pid_file = self.base / "mysqld.pid"
        self.log = self.base / "error.log"
        self.port = port or free_port()
        self.flags = [*SERVER_FLAGS, *(flags or [])]
        self.proc: subprocess.Popen[bytes] | None = None
        self._owned = owned

    # -- addresses ----------------------------------------------------------------------
    def dsn(self, user: str = "root", password: str | None = None, db: str = "") -> str:
        auth = f"{user}:{password}" if password else user
        return f"mysql://{auth}@127.0.0.1:{self.port}/{db}"

    def connect(self, user: str = "root", password: str = "", db: str | None = None, **kw: Any) -> Any:
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user=user, password=password, database=db,
                               autocommit=True, connect_timeout=5, **kw)

    def snapshot(self, query: str = "SELECT 1", db: str | None = None, user: str = "root", password: str = "") -> Any:
        """A session in a ``REPEATABLE READ`` transaction holding the read view its ``query`` made:
        it holds purge until the connection ends the transaction."""
        conn = self.connect(user, password, db)
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION")
            cur.execute(query)
            cur.fetchall()
        return conn

    def sql(self, *statements: str, db: str | None = None) -> list[Any]:
        """Run ``statements`` as root; the last one's rows."""
        conn = self.connect(db=db)
        try:
            rows: list[Any] = []
            with conn.cursor() as cur:
                for st in statements:
                    cur.execute(st)
                    rows = list(cur.fetchall())
            return rows
        finally:
            conn.close()

    # -- life -----------------------------------------------------------------------------
    def _tmpdir(self) -> Path:
        """The server's own temporary directory, which the ``mysql`` user owns. The bootstrap and the
        server both take it: ``TMPDIR`` may name a directory that user cannot write (a root-owned 755
        one, as many CI runners set it), and with two test servers side by side sharing /tmp, the
        agent's reading (an information_schema join, which spills to a temporary table) failed once
        with "Error on delete of '/tmp/#sql-temptable-...' (Errcode: 2)"."""
        tmp = self.base / "tmp"
        tmp.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(tmp, "mysql", "mysql")
        return tmp

    def init(self) -> LocalMariaDB:
        tmp = self._tmpdir()
        argv = [INSTALL_DB, "--no-defaults", f"--datadir={self.data}", "--auth-root-authentication-method=normal",
                "--skip-test-db", "--innodb-log-file-size=8M", f"--tmpdir={tmp}"]
        if os.geteuid() == 0:
            argv.append("--user=mysql")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "TMPDIR": str(tmp)})
        if done.returncode != 0:
            msg = f"mariadb-install-db failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}"
            raise SafepointError(msg)
        return self

    def start(self, timeout_s: float = 60) -> LocalMariaDB:
        if not (self.data / "mysql").exists():
            self.init()
        server = _server()
        if server is None:
            raise SafepointError(str(mariadb_missing()))
        tmp = self._tmpdir()
        argv = [server, "--no-defaults", f"--datadir={self.data}", f"--socket={self.socket}", f"--port={self.port}",
                "--bind-address=127.0.0.1", f"--pid-file={self.pid_file}", f"--log-error={self.log}", f"--tmpdir={tmp}",
                *self.flags]
        if os.geteuid() == 0:
            argv.append("--user=mysql")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                msg = f"mariadbd on port {self.port} exited ({self.proc.returncode}): {self.tail()}"
                raise SafepointError(msg)
            try:
                self.connect().close()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
                time.sleep(0.1)
        msg = f"MariaDB on port {self.port} not ready after {timeout_s:.0f} s ({last}): {self.tail()}"
        raise SafepointError(msg)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 60) -> None:
        """A clean shutdown (SIGTERM: InnoDB flushes; a prepared XA transaction is kept)."""
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """Stop at once (SIGKILL, as a crash would leave it)."""
        if self.running():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(30)

    def restart(self) -> LocalMariaDB:
        self.stop()
        return self.start()

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.kill()
        if self._owned:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> LocalMariaDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class MariaWriter(threading.Thread):
    """A steady write load: every ``every_s``, one autocommit transaction that updates ``per_tx``
    rows of ``table`` (made by ``create``: ``rows`` rows), moving through them; each leaves undo for
    purge. Stops with ``stop`` (or the event it was given); an error once stopped (the server going
    away under it) is not one. ``errors`` counts statements that failed while it ran (it
    reconnects: a server restarted under it is waited for)."""

    def __init__(self, server: LocalMariaDB, db: str = "shop", table: str = "orders", *, rows: int = 1000,
                 per_tx: int = 20, every_s: float = 0.02, stop: threading.Event | None = None) -> None:
        super().__init__(daemon=True, name="mariadb-writer")
        self.server, self.db, self.table = server, db, table
        self.rows, self.per_tx, self.every_s = rows, per_tx, every_s
        self.stop_ = stop if stop is not None else threading.Event()
        self.writes = 0
        self.errors = 0

    def create(self) -> MariaWriter:
        self.server.sql(f"CREATE DATABASE IF NOT EXISTS {self.db}",  # noqa: S608 - the test's own names
                        f"CREATE TABLE {self.db}.{self.table} (id INT PRIMARY KEY, total INT, note VARCHAR(80)) ENGINE=InnoDB",
                        f"INSERT INTO {self.db}.{self.table} SELECT seq, 0, REPEAT('x', 60) "  # noqa: S608
                        f"FROM {self.db}.seq_0_to_{self.rows - 1}")
        return self

    def stop(self) -> None:
        self.stop_.set()

    def run(self) -> None:
        conn = None
        i = 0
        while not self.stop_.wait(self.every_s):
            try:
                if conn is None:
                    conn = self.server.connect(db=self.db)
                lo = (i * self.per_tx) % self.rows
                with conn.cursor() as cur:
                    cur.execute(f"UPDATE {self.table} SET total = total + 1 WHERE id >= %s AND id < %s",  # noqa: S608
                                (lo, lo + self.per_tx))
                self.writes += 1
                i += 1
            except Exception:  # noqa: BLE001 - the server went away: try again
                self.errors += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
