"""The ``mariadb`` phase of ``safepoint bench`` (not run by default): InnoDB's history list length
over time with a forgotten session, with the agent ending it against without; from one run.

Two MariaDB servers side by side (Debian's, each as the ``mysql`` user on loopback), each under
the same steady write load (``MariaWriter``: 50 autocommit transactions a second, 20 rows each),
each reported by its own ``safepoint agent mariadb`` as a cluster of its own to one job
(``safepoint run``; both clusters in InnoDB's transaction numbers with the same pressure policy: a
hold older than ``MAX_LIFETIME_MS`` under critical undo may be expired). One agent runs with
``--kill idle-in-transaction``, the other with ``--kill off``. Once both report, a ``REPEATABLE
READ`` session on each server reads once and is left open for ``--mariadb-hold`` seconds (then
rolled back if still there); each server's ``Innodb_history_list_length`` and undo size are
sampled every 0.5 s over ``--mariadb-window`` seconds from the moment the sessions open.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench_common import say
from bench_etcd import _cli, _env, _flags, _stop, _wait, start_job

from safepoint.connectors.mariadb_holds import read_server
from safepoint.devtools.broker import EmbeddedBroker
from safepoint.devtools.mariadb import LocalMariaDB, MariaWriter, mariadb_missing

__all__ = ["mariadb_lines", "mariadb_phase"]

MODES = ("kill", "off")
MAX_LIFETIME_MS = 20_000
SAMPLE_S = 0.5
POLICY = f"""mvcc_unit = "trx"
retention = 20
node_lease_ms = 10000
pinned_warning_enter_bytes = 250000
pinned_warning_exit_bytes = 200000
pinned_critical_enter_bytes = 500000
pinned_critical_exit_bytes = 400000
band_enter_window_ms = 2000
band_exit_window_ms = 5000
expire_after_ms = 5000
max_reader_lifetime_ms = {MAX_LIFETIME_MS}
expire_grace_ms = 5000
"""
TOPICS = {"events_topic": "mdb-bench.events", "control_topic": "mdb-bench.control", "directives_topic": "mdb-bench.directives",
          "alerts_topic": "mdb-bench.alerts", "deadletter_topic": "mdb-bench.deadletter", "status_topic": "mdb-bench.status"}


def _figures(server: LocalMariaDB) -> tuple[int, int]:
    """(history list length, undo bytes) of ``server`` now, as the agent reads them."""
    conn = server.connect()
    try:
        reading = read_server(conn)
    finally:
        conn.close()
    return reading.history_length, reading.undo_bytes or 0


def mariadb_phase(work: Path, args: Any) -> dict[str, Any]:
    why = mariadb_missing()
    if why:
        raise RuntimeError(f"the mariadb phase needs MariaDB: {why}")
    with ExitStack() as stack:
        broker = EmbeddedBroker(data_dir=str(work / "broker")).start()
        stack.callback(broker.stop)
        servers = {m: LocalMariaDB(prefix=f"safepoint-bench-mdb-{m}-").start() for m in MODES}
        for server in servers.values():
            stack.callback(server.cleanup)
        writers = {m: MariaWriter(s, rows=1000, per_tx=20, every_s=0.02).create() for m, s in servers.items()}
        config = work / "safepoint.toml"
        config.write_text("trigger_ms = 200\n" + "".join(f"\n[clusters.mdb-{m}]\n{POLICY}" for m in MODES), encoding="utf-8")
        job = start_job(stack, work, broker.bootstrap, config, TOPICS)
        job_log = work / "job.log"
        stats = {m: work / f"agent-{m}.json" for m in MODES}
        agents = {}
        for m, server in servers.items():
            with (work / f"agent-{m}.log").open("ab") as log:
                agents[m] = subprocess.Popen([*_cli(), "agent", "mariadb", *_flags(
                    dsn=server.dsn(), bootstrap=broker.bootstrap, cluster=f"mdb-{m}", node="db1", kill="idle-in-transaction"
                    if m == "kill" else "off", poll=0.5, stats_file=stats[m], events_topic=TOPICS["events_topic"],
                    directives_topic=TOPICS["directives_topic"])], stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=_env())
            stack.callback(_stop, agents[m], 30)

        def stat(m: str) -> dict[str, Any]:
            try:
                got: dict[str, Any] = json.loads(stats[m].read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
            return got

        for w in writers.values():
            w.start()
            stack.callback(w.stop)
        _wait("both agents' directives", lambda: all(stat(m).get("directive_seq", 0) >= 1 for m in MODES), 180,
              lambda: job.poll() is None and all(a.poll() is None for a in agents.values()), job_log)
        say(f"(mariadb) two servers under the same write load; a REPEATABLE READ session left open on each for "
            f"{args.mariadb_hold:.0f} s, one agent with --kill idle-in-transaction, one with --kill off ...")
        sessions = {m: s.snapshot("SELECT sum(total) FROM shop.orders") for m, s in servers.items()}
        threads = {m: int(c.thread_id()) for m, c in sessions.items()}
        t0 = time.monotonic()
        series: dict[str, list[tuple[float, int, int]]] = {m: [] for m in MODES}
        ended: dict[str, float | None] = dict.fromkeys(MODES)
        closed = False
        rolled_back: set[str] = set()
        while (t := time.monotonic() - t0) < args.mariadb_window:
            for m, server in servers.items():
                length, undo = _figures(server)
                series[m].append((round(t, 1), length, undo))
                if ended[m] is None and not server.sql(f"SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = {threads[m]}"):  # noqa: S608
                    ended[m] = round(t, 1)
            if not closed and t >= args.mariadb_hold:  # the minute is over: its client ends what is left of it
                for m, c in sessions.items():
                    if ended[m] is None:
                        threading.Thread(target=c.rollback, daemon=True).start()
                        ended[m] = round(t, 1)
                        rolled_back.add(m)
                closed = True
            time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - t0 - t)))
        for c in sessions.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001 - killed by the agent: already gone
                pass
        out: dict[str, Any] = {"hold_s": args.mariadb_hold, "window_s": args.mariadb_window, "max_lifetime_s": MAX_LIFETIME_MS / 1000,
                               "writes": {m: w.writes for m, w in writers.items()}}
        for m in MODES:
            lengths = [x[1] for x in series[m]]
            out[m] = {"series": series[m], "ended_s": ended[m], "rolled_back": m in rolled_back, "mean": statistics.fmean(lengths), "max": max(lengths),
                      "end": lengths[-1], "undo_max": max(x[2] for x in series[m]), "killed": stat(m).get("killed", 0)}
        return out
    raise AssertionError("unreachable")  # ExitStack swallows nothing


def _how(run: dict[str, Any]) -> str:
    return "its client's rollback, the hold over" if run["rolled_back"] else f"killed by the agent: {run['killed']}"


def mariadb_lines(res: dict[str, Any]) -> list[str]:
    k, o = res["kill"], res["off"]
    L = ["## MariaDB: the history list with a forgotten session", "",  # noqa: N806
         f"Two servers under the same write load ({res['writes']['kill']:,} and {res['writes']['off']:,} transactions of 20 "
         f"rows in the window), a REPEATABLE READ session left open on each for {res['hold_s']:.0f} s; the policy may "
         f"expire a hold older than {res['max_lifetime_s']:.0f} s under critical undo. With the agent's --kill "
         f"idle-in-transaction the session ended at {k['ended_s']} s ({_how(k)}); with --kill off at "
         f"{o['ended_s']} s ({_how(o)}).", "",
         "| InnoDB history list length | agent kills | agent does not |", "| --- | ---: | ---: |"]
    by_t = {m: {int(t): n for t, n, _ in res[m]["series"]} for m in MODES}
    for t in range(0, int(res["window_s"]) + 1, 10):
        if t in by_t["kill"] and t in by_t["off"]:
            L.append(f"| at {t} s | {by_t['kill'][t]:,} | {by_t['off'][t]:,} |")
    L.append(f"| mean over the window | {k['mean']:,.0f} | {o['mean']:,.0f} |")
    L.append(f"| max | {k['max']:,} | {o['max']:,} |")
    L.append(f"| undo at most | {k['undo_max']:,} B | {o['undo_max']:,} B |")
    L.append("")
    return L
