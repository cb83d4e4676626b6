"""safepoint sees, names and steers a real MariaDB's purge horizon: the story in three steps.

    .venv/bin/python examples/mariadb/run.py            # after ./scripts/setup.sh (it installs MariaDB)
    .venv/bin/python examples/mariadb/run.py --keep-running   # then leaves the dashboard up until Ctrl-C

It starts, on 127.0.0.1 in a temp dir: the embedded broker, the job (``safepoint run`` with
``examples/mariadb/safepoint.toml``: cluster ``mdb-main`` counts in InnoDB's transaction numbers,
with pressure thresholds at the example's scale), a MariaDB server (Debian's, as the ``mysql``
user), a writer updating a table (undo piles up for purge) and ``safepoint agent mariadb --kill
idle-in-transaction`` beside it. Then:

1. **A forgotten session**: user ``report`` opens a ``REPEATABLE READ`` transaction, reads once and
   sits idle. The holds API names its read view with the session's user, state and cost; the safe
   point stays at it, and InnoDB's history list grows behind it.
2. **Expired and killed**: the undo reaches the critical band and the session is older than the
   policy allows; the job force-expires its read view and the agent ends it with ``KILL
   CONNECTION``. The safe point passes it and the history list falls.
3. **The dashboard** shows the cluster in transaction numbers and the node's history list.

Exit 0 when every step did what it says, 1 otherwise (the step that did not is printed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from safepoint.devtools.broker import EmbeddedBroker
from safepoint.devtools.mariadb import LocalMariaDB, MariaWriter, mariadb_missing
from safepoint.devtools.story import ClusterStory, answers, finish, start_job, stop_processes, wait_until

HERE = Path(__file__).resolve().parent
CLUSTER = "mdb-main"
NODE = "db1"
SAFEPOINT = [sys.executable, "-m", "safepoint.cli"]
AGENT_USER, AGENT_PASSWORD = "safepoint", "agent-secret"


def secret(user: str) -> str:
    """The example's users' passwords (throwaway, on a throwaway server)."""
    return f"{user}-secret"


def say(text: str) -> None:
    print(text, flush=True)


class Story(ClusterStory):
    """The example's three steps against one running job, server and agent."""

    def __init__(self, base: str, work: Path, server: LocalMariaDB) -> None:
        super().__init__(base, work, CLUSTER)
        self.server = server
        self.keep: list[Any] = []
        """Sessions the story holds open (closed with the server)."""

    def report_hold(self) -> dict[str, Any] | None:
        return next((h for h in self.holds() if "report@" in (h["label"] or "")), None)

    def forgotten(self) -> tuple[int, int]:
        """Step 1; (the session's thread id, its read view's number)."""
        say("\n1. A forgotten session: REPEATABLE READ, one read, then idle inside its transaction")
        report = self.server.snapshot("SELECT sum(total) FROM shop.orders", user="report", password=secret("report"))
        self.keep.append(report)
        thread = int(report.thread_id())
        wait_until(lambda: self.report_hold() is not None, 20, "the holds API to name the session")
        view = int(self.report_hold()["ts"])  # type: ignore[index]
        before = self.node(NODE).get("history_length", 0)
        wait_until(lambda: (self.report_hold() or {}).get("cost_bytes"), 30, "the session's cost")
        wait_until(lambda: self.node(NODE).get("history_length", 0) > before + 200, 30, "the history list to grow behind it")
        h, st, node = self.report_hold() or {}, self.status(), self.node(NODE)
        say(f"   trx {h.get('ts')}: {h.get('label')} (alone keeps {h.get('cost_bytes') or 0:,} bytes)")
        say(f"   safe point trx {st.get('safe_ts')}; history list {node.get('history_length'):,}, purged below trx "
            f"{node.get('purged_ts')}; undo {node.get('pinned_bytes') or 0:,} bytes")
        self.check(0 < st.get("safe_ts", 0) <= view, f"the safe point ({st.get('safe_ts')}) stays at the session's read view ({view})")
        self.check("IDLE IN TRANSACTION" in (h.get("label") or ""), "the label marks the session idle in its transaction")
        self.check(node.get("history_length", 0) > before, f"the history list grew behind it ({before} -> {node.get('history_length')})")
        return thread, view

    def expired(self, thread: int, view: int) -> None:
        say("\n2. Expired and killed: the undo reaches the critical band; the agent ends the session")
        seen = [self.node(NODE).get("history_length", 0)]

        def alive() -> bool:
            seen.append(self.node(NODE).get("history_length", 0))  # the history list's peak, while the session lives
            return bool(self.server.sql(f"SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = {int(thread)}"))  # noqa: S608

        wait_until(lambda: not alive(), 180, "the forgotten session to be ended")
        peak = max(seen)
        wait_until(lambda: self.agent_stats().get("killed", 0) >= 1, 10, "the agent's count")
        wait_until(lambda: self.status().get("safe_ts", 0) > view, 60, "the safe point to pass the session's view")
        wait_until(lambda: self.node(NODE).get("history_length", peak) < peak / 2, 60, "the history list to fall")
        stats, node = self.agent_stats(), self.node(NODE)
        say(f"   the agent ended thread {thread} (killed {stats.get('killed')}); safe point trx "
            f"{self.status().get('safe_ts')}; history list {peak:,} -> {node.get('history_length'):,}")
        self.check(stats.get("killed", 0) >= 1, "the agent ended the forgotten session (KILL CONNECTION)")
        self.check(self.status().get("safe_ts", 0) > view, "the safe point passed its read view")
        self.check(node.get("history_length", peak) < peak, "the history list fell once purge could go on")

    def dashboard(self) -> None:
        say("\n3. The dashboard and the status: a nightly export holds a read view now")
        export = self.server.snapshot("SELECT count(*) FROM shop.orders", user="export", password=secret("export"))
        self.keep.append(export)
        wait_until(lambda: any("export@" in (h["label"] or "") for h in self.holds()), 30, "the export's hold")
        node = self.node(NODE)
        say(f"   {self.base}/ shows cluster {CLUSTER} in transaction numbers ({self.status().get('mvcc_unit')}); node "
            f"{NODE}: history list {node.get('history_length')}, purged below trx {node.get('purged_ts')}")
        self.check(self.status().get("mvcc_unit") == "trx" and node.get("history_length") is not None,
                   "the status speaks in transaction numbers and shows the history list")


def start(work: Path, broker: EmbeddedBroker, server: LocalMariaDB, port: int,
          writer: MariaWriter) -> list[subprocess.Popen[Any]]:
    """The job, the server with its users and tables (the writer's among them), and the agent; the
    job's and the agent's processes."""
    kafka = ["--bootstrap", broker.bootstrap]
    base = f"http://127.0.0.1:{port}"
    job = start_job(work, broker.bootstrap, HERE / "safepoint.toml", port)
    server.start()
    writer.create()
    users = [f"CREATE USER '{u}'@'127.0.0.1' IDENTIFIED BY '{secret(u)}'" for u in ("report", "export")]
    server.sql(*users, *(f"GRANT SELECT ON shop.* TO '{u}'@'127.0.0.1'" for u in ("report", "export")),
               f"CREATE USER '{AGENT_USER}'@'127.0.0.1' IDENTIFIED BY '{AGENT_PASSWORD}'",
               f"GRANT PROCESS, CONNECTION ADMIN ON *.* TO '{AGENT_USER}'@'127.0.0.1'")
    say(f"MariaDB at {server.dsn()}; waiting for the job (a Spark session starts: about 30 s) ...")
    wait_until(lambda: answers(f"{base}/healthz"), 240, "the job's HTTP surface")
    agent = subprocess.Popen([*SAFEPOINT, "agent", "mariadb", "--dsn", server.dsn(AGENT_USER), *kafka, "--cluster", CLUSTER,
                              "--node", NODE, "--kill", "idle-in-transaction", "--poll", "0.5",
                              "--stats-file", str(work / "agent.json")],
                             stdout=(work / "agent.log").open("ab"), stderr=subprocess.STDOUT,
                             env={**os.environ, "SAFEPOINT_MARIADB_PASSWORD": AGENT_PASSWORD})
    return [job, agent]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--http-port", type=int, default=8080, help="the job's status API and dashboard (default 8080)")
    ap.add_argument("--keep-running", action="store_true", help="leave everything up at the end until Ctrl-C")
    args = ap.parse_args()
    if mariadb_missing():
        sys.exit(str(mariadb_missing()))
    work = Path(tempfile.mkdtemp(prefix="safepoint-mariadb-example-"))
    broker = EmbeddedBroker(data_dir=str(work / "broker")).start()
    server = LocalMariaDB()
    procs: list[subprocess.Popen[Any]] = []
    writer = MariaWriter(server, rows=2000, per_tx=50, every_s=0.02)  # each transaction leaves 50 old row versions
    base = f"http://127.0.0.1:{args.http_port}"
    try:
        say(f"work dir {work}; broker at {broker.bootstrap}")
        procs = start(work, broker, server, args.http_port, writer)
        writer.start()
        story = Story(base, work, server)
        wait_until(lambda: bool(story.status().get("safe_ts")), 120, "the first directive")
        say(f"the job, the agent and a writer run: safe point at trx {story.status()['safe_ts']} (logs in {work})")
        thread, view = story.forgotten()
        story.expired(thread, view)
        story.dashboard()
        return finish(story.failed, base, args.keep_running)
    finally:
        writer.stop()
        stop_processes(procs)  # the agent, then the job
        server.cleanup()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
