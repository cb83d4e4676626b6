"""safepoint sees, explains and steers a real PostgreSQL's vacuum horizon: the story in four steps.

    .venv/bin/python examples/postgres/run.py            # after ./scripts/setup.sh (it installs PostgreSQL)
    .venv/bin/python examples/postgres/run.py --keep-running   # then leaves the dashboard up until Ctrl-C

It starts, on 127.0.0.1 in a temp dir: the embedded broker, the job (``safepoint run`` with
``examples/postgres/safepoint.toml``: cluster ``pg-main`` counts in transaction ids, with pressure
thresholds at the example's scale), a PostgreSQL server (Debian's, as the ``postgres`` user), a writer
updating a table (dead row versions pile up) and ``safepoint agent postgres --terminate
idle-in-transaction --vacuum`` beside it. Then:

1. **Three forgotten holds**: a logical replication slot nobody reads, a ``REPEATABLE READ`` session
   left idle in its transaction (``monthly-report``), a prepared transaction nobody decides. The
   holds API and the dashboard name each with its label and cost, and the safe point stays at the
   oldest.
2. **Forced expiry**: the dead tuples reach the critical band; the job force-expires the oldest
   holds; the agent leaves the slot alone (it only says so) and ends the idle session with
   ``pg_terminate_backend``.
3. **Released**: the prepared transaction is committed and the slot dropped; the safe point passes
   them and the agent's ``VACUUM`` takes the dead tuples back.
4. **The dashboard** shows the cluster in xids, a nightly export's snapshot held now with its label
   and its age in seconds and in transactions, and the node's wraparound distance.

Exit 0 when every step did what it says, 1 otherwise (the step that did not is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from safepoint.devtools.broker import EmbeddedBroker
from safepoint.devtools.postgres import LocalPostgres, Writer, postgres_missing
from safepoint.devtools.story import ClusterStory, answers, finish, start_job, stop_processes, wait_until

HERE = Path(__file__).resolve().parent
CLUSTER = "pg-main"
NODE = "pg-primary"
SAFEPOINT = [sys.executable, "-m", "safepoint.cli"]


def say(text: str) -> None:
    print(text, flush=True)


class Story(ClusterStory):
    """The example's four steps against one running job, server and agent."""

    def __init__(self, base: str, work: Path, server: LocalPostgres) -> None:
        super().__init__(base, work, CLUSTER)
        self.server = server
        self.admin = psycopg.connect(server.dsn(), autocommit=True)
        self.keep: list[psycopg.Connection[Any]] = []
        """Sessions the story holds open (closed with the server)."""
        self.report_pid = 0

    def one(self, sql: str, *params: Any) -> Any:
        row = self.admin.execute(sql, params or None).fetchone()
        return None if row is None else row[0]

    def dead_tuples(self) -> int:
        """The writer's table's dead row versions, as PostgreSQL's statistics count them."""
        return int(self.one("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'orders'"))

    def named(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for h in self.holds():
            for what, mark in (("slot", "cdc_forgotten"), ("session", "monthly-report"), ("prepared", "pay-17")):
                if mark in (h["label"] or "") or mark in h["id"]:
                    found[what] = h
        return found

    def forgotten_holds(self) -> int:
        """Step 1; the lowest of the three holds' xids."""
        say("\n1. Three forgotten holds: a logical slot nobody reads, a REPEATABLE READ session left idle, "
            "a prepared transaction")
        self.admin.execute("SELECT pg_create_logical_replication_slot('cdc_forgotten', 'test_decoding')")
        time.sleep(1.5)  # the writer moves on between them: each hold keeps its own stretch of history
        report = self.server.snapshot("monthly-report", "SELECT sum(total) FROM orders")
        self.keep.append(report)
        self.report_pid = int(self.one("SELECT pid FROM pg_stat_activity WHERE application_name = 'monthly-report'"))
        time.sleep(1.5)
        pay = psycopg.connect(self.server.dsn(application_name="payments"), autocommit=True)
        pay.execute("BEGIN")
        pay.execute("UPDATE payments SET state = 'paid' WHERE id = 17")
        pay.execute("PREPARE TRANSACTION 'pay-17'")
        lowest = int(self.one("SELECT min(x) FROM (SELECT catalog_xmin::text::bigint x FROM pg_replication_slots "
                              "UNION ALL SELECT backend_xmin::text::bigint FROM pg_stat_activity "
                              "WHERE application_name = 'monthly-report' UNION ALL "
                              "SELECT transaction::text::bigint FROM pg_prepared_xacts) s"))
        wait_until(lambda: len(self.named()) == 3, 15, "the holds API to name the three")
        wait_until(lambda: ((self.status().get("blocker") or {}).get("id") or "").startswith("slot-cdc_forgotten"), 15,
             "the slot to hold the safe point (once the retention's xids were written above it)")
        wait_until(lambda: all(h["cost_bytes"] for h in self.named().values() if h["id"] != "prepared-pay-17"), 20,
             "the costs of the holds below the retention's bound")
        for what, h in sorted(self.named().items(), key=lambda kv: kv[1]["ts"]):
            say(f"   {what:8} xid {h['ts']}: {h['label']} (alone keeps {h['cost_bytes']:,} bytes)")
        st = self.status()
        self.check(0 < st["safe_ts"] <= lowest, f"the safe point ({st['safe_ts']}) stays at the oldest hold ({lowest})")
        self.check(st["blocker"]["id"].startswith("slot-cdc_forgotten"), "the blocker is the forgotten slot")
        return lowest

    def forced_expiry(self) -> None:
        say("\n2. Forced expiry: the dead tuples reach the critical band; the agent ends the idle session")
        pid = self.report_pid
        wait_until(lambda: self.one("SELECT 1 FROM pg_stat_activity WHERE pid = %s", pid) is None, 180,
             "the idle session to be ended")
        wait_until(lambda: self.agent_stats().get("terminated", 0) >= 1, 10, "the agent's count")
        stats = self.agent_stats()
        say(f"   dead tuples about {stats.get('dead_bytes', 0):,} bytes: the agent ended backend {pid} "
            f"(terminated {stats.get('terminated')}, expiries not acted on {stats.get('expiries_not_acted')})")
        self.check(stats.get("terminated", 0) >= 1, "the agent ended the forgotten session (pg_terminate_backend)")
        self.check(self.one("SELECT count(*) FROM pg_replication_slots") == 1
                   and self.one("SELECT count(*) FROM pg_prepared_xacts") == 1,
                   "the slot and the prepared transaction were left alone")

    def released(self, lowest: int) -> None:
        say("\n3. Released: COMMIT PREPARED, the slot dropped; the safe point passes them and VACUUM reclaims")
        dead_before = self.dead_tuples()
        vacuums = self.agent_stats().get("vacuums", 0)  # step 2's ended session was worth one already
        self.admin.execute("COMMIT PREPARED 'pay-17'")
        self.admin.execute("SELECT pg_drop_replication_slot('cdc_forgotten')")
        released = int(self.one("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))
        wait_until(lambda: self.status().get("safe_ts", 0) >= released - 150, 60, "the safe point to pass the released holds")
        wait_until(lambda: self.agent_stats().get("vacuums", 0) > vacuums, 60, "the agent's VACUUM past the released holds")
        with contextlib.suppress(TimeoutError):  # the statistics trail the vacuum; the check below says it if not
            wait_until(lambda: self.dead_tuples() < dead_before / 2, 10, "the statistics after the vacuum")
        dead_after = self.dead_tuples()
        say(f"   safe point {self.status()['safe_ts']} (released at xid {released}); VACUUM: {dead_before:,} dead "
            f"tuples -> {dead_after:,}")
        self.check(self.status()["safe_ts"] > lowest, "the safe point passed the released holds")
        self.check(dead_after < dead_before / 2, "the agent's VACUUM took the dead tuples back")

    def dashboard(self) -> None:
        say("\n4. The dashboard and the status: a nightly export holds a snapshot now")
        export = self.server.snapshot("nightly-export", "SELECT count(*) FROM orders")
        self.keep.append(export)
        wait_until(lambda: any("nightly-export" in (h["label"] or "") for h in self.holds()), 30, "the export's hold")
        node = self.node(NODE)
        say(f"   {self.base}/ shows cluster {CLUSTER} in xids ({self.status()['mvcc_unit']}); node {NODE}: "
            f"{node.get('wraparound_left', 0):,} transactions before wraparound")
        self.check(self.status()["mvcc_unit"] == "xid" and node.get("wraparound_left", 0) > 2_000_000_000,
                   "the status speaks in xids and shows the wraparound distance")


def start(work: Path, broker: EmbeddedBroker, server: LocalPostgres, port: int,
          writer: Writer) -> list[subprocess.Popen[Any]]:
    """The job, the server with its tables (the writer's among them), and the agent; the job's and the
    agent's processes."""
    kafka = ["--bootstrap", broker.bootstrap]
    base = f"http://127.0.0.1:{port}"
    job = start_job(work, broker.bootstrap, HERE / "safepoint.toml", port)
    server.start()
    writer.create()
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute("CREATE TABLE payments (id int PRIMARY KEY, state text)")
        admin.execute("INSERT INTO payments VALUES (17, 'pending')")
        admin.execute("ALTER TABLE orders SET (autovacuum_enabled = off)")  # the agent's VACUUM is the one seen here
    say(f"PostgreSQL at {server.dsn()}; waiting for the job (a Spark session starts: about 30 s) ...")
    wait_until(lambda: answers(f"{base}/healthz"), 240, "the job's HTTP surface")
    agent = subprocess.Popen([*SAFEPOINT, "agent", "postgres", "--dsn", server.dsn(), *kafka, "--cluster", CLUSTER,
                              "--node", NODE, "--terminate", "idle-in-transaction", "--vacuum", "--vacuum-every", "2",
                              "--poll", "0.5", "--stats-file", str(work / "agent.json")],
                             stdout=(work / "agent.log").open("ab"), stderr=subprocess.STDOUT)
    return [job, agent]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--http-port", type=int, default=8080, help="the job's status API and dashboard (default 8080)")
    ap.add_argument("--keep-running", action="store_true", help="leave everything up at the end until Ctrl-C")
    args = ap.parse_args()
    if postgres_missing():
        sys.exit(str(postgres_missing()))
    work = Path(tempfile.mkdtemp(prefix="safepoint-postgres-example-"))
    broker = EmbeddedBroker(data_dir=str(work / "broker")).start()
    server = LocalPostgres()
    procs: list[subprocess.Popen[Any]] = []
    writer = Writer(server.dsn(), rows=2000, per_tx=200)  # each transaction leaves 200 dead row versions
    base = f"http://127.0.0.1:{args.http_port}"
    try:
        say(f"work dir {work}; broker at {broker.bootstrap}")
        procs = start(work, broker, server, args.http_port, writer)
        writer.start()
        story = Story(base, work, server)
        wait_until(lambda: bool(story.status().get("safe_ts")), 120, "the first directive")
        say(f"the job, the agent and a writer run: safe point at xid {story.status()['safe_ts']} (logs in {work})")
        lowest = story.forgotten_holds()
        story.forced_expiry()
        story.released(lowest)
        story.dashboard()
        failed = story.failed
        return finish(failed, base, args.keep_running)
    finally:
        writer.stop()
        stop_processes(procs)  # the agent, then the job
        server.cleanup()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
