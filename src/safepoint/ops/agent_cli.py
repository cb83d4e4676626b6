"""``safepoint agent etcd``, ``postgres`` and ``mariadb``: run the agent that drives one etcd
cluster's compaction (``connectors/etcd_agent.py``), reports and steers one PostgreSQL instance's
vacuum horizon (``connectors/postgres_agent.py``) or one MariaDB server's purge horizon
(``connectors/mariadb_agent.py``) until SIGINT or SIGTERM.

Kafka settings (``--bootstrap``, the topics) come from the flags, ``SAFEPOINT_*`` or ``--config``
like every other command; the agent's own are flags. It logs each compaction (and every failure
and recovery) to standard error; ``--stats-file`` also keeps its counters there as JSON after each
heartbeat, for a supervisor or a test to read.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safepoint.errors import SafepointError
from safepoint.settings import Settings

__all__ = ["add_parsers", "run_args"]


def _directive_key_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--directive-key", dest="directive_key", default=None,
                   help="the job's public key(s) directives must be signed with, comma-separated during a rotation; "
                        "an unsigned or badly signed directive is then never acted on [env SAFEPOINT_DIRECTIVE_KEY; "
                        "default: none, directives taken unsigned]")


def add_parsers(sub: Any, kafka_flags: Any) -> None:
    p = sub.add_parser("agent", help="run an agent that drives a database's own compaction from the directives")
    engines = p.add_subparsers(dest="engine", required=True)
    e = engines.add_parser("etcd", help="compact an etcd cluster at the directives' safe_ts (docs/etcd.md)")
    kafka_flags(e)
    e.add_argument("--endpoints", required=True, help="etcd client URLs, comma-separated (http://127.0.0.1:2379,...)")
    e.add_argument("--cluster", required=True, help="the safepoint cluster id this etcd cluster reports as")
    e.add_argument("--node", default="etcd-agent", help="the agent's node id (default etcd-agent)")
    e.add_argument("--directives-topic", default=None, help="compacted topic of directives")
    _directive_key_flag(e)
    e.add_argument("--compact-every", type=float, default=5.0, metavar="SECONDS",
                   help="least time between two compactions (default 5)")
    e.add_argument("--heartbeat", type=float, default=1.0, metavar="SECONDS",
                   help="time between two readings of etcd and heartbeats (default 1)")
    e.add_argument("--defrag-free-bytes", type=int, default=0, metavar="BYTES",
                   help="after a compaction, defragment one member whose free space is at least this (0: never, "
                        "the default); followers before the leader, one member per compaction interval")
    e.add_argument("--allow-auto-compaction", action="store_true",
                   help="start although etcd's own --auto-compaction-retention is on: it compacts whatever "
                        "safepoint holds, so a held revision may be compacted under its reader")
    e.add_argument("--state-dir", default=None,
                   help="keep the incarnation and the last directive acted on here (survives the agent's restart)")
    e.add_argument("--stats-file", default=None, help="write the agent's counters here as JSON after each heartbeat")
    e.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="one etcd request's timeout")

    g = engines.add_parser("postgres", help="report a PostgreSQL instance's vacuum horizon holds; optionally end "
                                            "expired sessions and vacuum (docs/postgres.md)")
    kafka_flags(g)
    g.add_argument("--dsn", required=True, help="the instance: postgresql://USER@HOST:PORT/DB (a role that may read "
                                                "pg_stat_activity in full: a superuser or pg_monitor)")
    g.add_argument("--cluster", required=True, help="the safepoint cluster id the fleet reports as")
    g.add_argument("--node", required=True, help="this instance's node id (one agent per primary or standby)")
    g.add_argument("--directives-topic", default=None, help="compacted topic of directives")
    _directive_key_flag(g)
    g.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="time between two readings (default 1)")
    g.add_argument("--terminate", choices=["off", "idle-in-transaction", "any"], default="off",
                   help="end a backend whose hold the job force-expires with pg_terminate_backend: off (the "
                        "default), only sessions idle in a transaction, or any backend on a hard expiry")
    g.add_argument("--vacuum", action="store_true",
                   help="VACUUM the tables with the most dead tuples once the safe point passes a hold that went")
    g.add_argument("--vacuum-every", type=float, default=60.0, metavar="SECONDS",
                   help="least time between two vacuums (default 60)")
    g.add_argument("--vacuum-tables", type=int, default=5, help="tables a vacuum takes at most (default 5)")
    g.add_argument("--vacuum-min-dead", type=int, default=1000, metavar="TUPLES",
                   help="a table is vacuumed from this many dead tuples (default 1000)")
    g.add_argument("--stats-dsn", action="append", default=[], metavar="DSN",
                   help="another database of the instance whose dead tuples count too (repeatable)")
    g.add_argument("--state-dir", default=None, help="keep the agent's incarnation here")
    g.add_argument("--stats-file", default=None, help="write the agent's counters here as JSON after each poll")
    g.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="a query's timeout")


    m = engines.add_parser("mariadb", help="report a MariaDB server's purge horizon holds; optionally end expired "
                                           "sessions (docs/mariadb.md)")
    kafka_flags(m)
    m.add_argument("--dsn", required=True,
                   help="the server: mysql://USER@HOST:PORT/DB (a user with PROCESS, and CONNECTION ADMIN to end "
                        "sessions); a password in it or in SAFEPOINT_MARIADB_PASSWORD, never printed")
    m.add_argument("--cluster", required=True, help="the safepoint cluster id the fleet reports as")
    m.add_argument("--node", required=True, help="this server's node id (one agent per server)")
    m.add_argument("--directives-topic", default=None, help="compacted topic of directives")
    _directive_key_flag(m)
    m.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="time between two readings (default 1)")
    m.add_argument("--kill", choices=["off", "idle-in-transaction", "any"], default="off",
                   help="end a session whose hold the job force-expires with KILL CONNECTION: off (the default), only "
                        "sessions idle in a transaction, or any session on a hard expiry; prepared XA never")
    m.add_argument("--state-dir", default=None, help="keep the agent's incarnation here")
    m.add_argument("--stats-file", default=None, help="write the agent's counters here as JSON after each poll")
    m.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="a statement's timeout")


def run_args(args: argparse.Namespace, settings: Settings) -> int:
    logging.getLogger("safepoint.agent").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    logging.getLogger("safepoint.listener").setLevel(logging.WARNING)
    if not args.verbose:  # librdkafka's line per failed connection while a broker is away: -v shows them
        for name in ("safepoint.listener.librdkafka", "safepoint.reporter.librdkafka"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    if args.engine == "postgres":
        return _run_postgres(args, settings)
    if args.engine == "mariadb":
        return _run_mariadb(args, settings)
    from safepoint.connectors.etcd_agent import EtcdAgent

    conf = settings.librdkafka()
    agent = EtcdAgent(args.endpoints, conf.pop("bootstrap.servers"), args.cluster, node=args.node,
                      events_topic=settings.events_topic, directives_topic=settings.directives_topic,
                      compact_every_s=args.compact_every, heartbeat_s=args.heartbeat,
                      defrag_free_bytes=args.defrag_free_bytes, allow_auto_compaction=args.allow_auto_compaction,
                      state_dir=args.state_dir, client=settings.client, kafka_conf=conf, timeout_s=args.timeout,
                      node_key=os.environ.get("SAFEPOINT_NODE_KEY") or None,  # a secret: no flag
                      directive_key=settings.directive_key or None)
    _stats_and_signals(args, agent)
    agent.start()
    print(f"safepoint agent etcd: cluster {args.cluster}, node {args.node}, etcd {args.endpoints}; "
          f"compacting at the directives' safe_ts (Ctrl-C stops)", file=sys.stderr, flush=True)
    agent.run()
    return 0


def _run_postgres(args: argparse.Namespace, settings: Settings) -> int:
    import psycopg

    from safepoint.connectors.postgres_agent import PostgresAgent, public_dsn

    conf = settings.librdkafka()
    agent = PostgresAgent(args.dsn, conf.pop("bootstrap.servers"), args.cluster, node=args.node,
                          events_topic=settings.events_topic, directives_topic=settings.directives_topic,
                          poll_s=args.poll, terminate=args.terminate, vacuum=args.vacuum,
                          vacuum_every_s=args.vacuum_every, vacuum_tables=args.vacuum_tables,
                          vacuum_min_dead=args.vacuum_min_dead, stats_dsns=args.stats_dsn, state_dir=args.state_dir,
                          client=settings.client, kafka_conf=conf, timeout_s=args.timeout,
                          node_key=os.environ.get("SAFEPOINT_NODE_KEY") or None,  # a secret: no flag
                          directive_key=settings.directive_key or None)
    try:
        agent.start()
    except psycopg.Error as exc:
        msg = f"cannot read the instance at {public_dsn(args.dsn)}: {str(exc).strip()}"
        raise SafepointError(msg) from exc
    _stats_and_signals(args, agent)  # once it runs: a start that failed leaves the caller's handlers alone
    print(f"safepoint agent postgres: cluster {args.cluster}, node {args.node}; reporting the vacuum horizon's "
          f"holds every {args.poll:g} s (Ctrl-C stops)", file=sys.stderr, flush=True)
    agent.run()
    return 0


def _run_mariadb(args: argparse.Namespace, settings: Settings) -> int:
    import pymysql

    from safepoint.connectors.mariadb_agent import MariaDBAgent, public_dsn

    conf = settings.librdkafka()
    agent = MariaDBAgent(args.dsn, conf.pop("bootstrap.servers"), args.cluster, node=args.node,
                         password=os.environ.get("SAFEPOINT_MARIADB_PASSWORD") or None,  # a secret: no flag
                         events_topic=settings.events_topic, directives_topic=settings.directives_topic,
                         poll_s=args.poll, kill=args.kill, state_dir=args.state_dir, client=settings.client,
                         kafka_conf=conf, timeout_s=args.timeout,
                         node_key=os.environ.get("SAFEPOINT_NODE_KEY") or None,
                         directive_key=settings.directive_key or None)
    try:
        agent.start()
    except (pymysql.Error, OSError, ValueError) as exc:
        msg = f"cannot read the server at {public_dsn(args.dsn)}: {str(exc).strip()}"
        raise SafepointError(msg) from exc
    _stats_and_signals(args, agent)
    print(f"safepoint agent mariadb: cluster {args.cluster}, node {args.node}; reporting the purge horizon's "
          f"holds every {args.poll:g} s, kill {args.kill} (Ctrl-C stops)", file=sys.stderr, flush=True)
    agent.run()
    return 0


def _stats_and_signals(args: argparse.Namespace, agent: Any) -> None:
    """``--stats-file`` written after each heartbeat; SIGINT and SIGTERM stop the agent."""
    if args.stats_file:
        path = Path(args.stats_file)

        def write_stats() -> None:
            figures = asdict(agent.stats)
            if agent.listener is not None:  # directives refused (unsigned, badly signed) or held back, by its listener
                seen = agent.listener.stats()
                figures.update(unsigned_directives=seen.unsigned, badly_signed_directives=seen.bad_signatures,
                               held_back_directives=seen.held_back, generations=seen.generations)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(figures))
            tmp.replace(path)

        agent.on_beat = write_stats
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: agent.stop())
