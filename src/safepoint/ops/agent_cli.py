"""``safepoint agent etcd``: run the agent that drives one etcd cluster's compaction
(``connectors/etcd_agent.py``) until SIGINT or SIGTERM.

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

from safepoint.settings import Settings

__all__ = ["add_parsers", "run_args"]


def add_parsers(sub: Any, kafka_flags: Any) -> None:
    p = sub.add_parser("agent", help="run an agent that drives a database's own compaction from the directives")
    engines = p.add_subparsers(dest="engine", required=True)
    e = engines.add_parser("etcd", help="compact an etcd cluster at the directives' safe_ts (docs/etcd.md)")
    kafka_flags(e)
    e.add_argument("--endpoints", required=True, help="etcd client URLs, comma-separated (http://127.0.0.1:2379,...)")
    e.add_argument("--cluster", required=True, help="the safepoint cluster id this etcd cluster reports as")
    e.add_argument("--node", default="etcd-agent", help="the agent's node id (default etcd-agent)")
    e.add_argument("--directives-topic", default=None, help="compacted topic of directives")
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


def run_args(args: argparse.Namespace, settings: Settings) -> int:
    from safepoint.connectors.etcd_agent import EtcdAgent

    logging.getLogger("safepoint.agent").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    logging.getLogger("safepoint.listener").setLevel(logging.WARNING)
    if not args.verbose:  # librdkafka's line per failed connection while a broker is away: -v shows them
        for name in ("safepoint.listener.librdkafka", "safepoint.reporter.librdkafka"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    conf = settings.librdkafka()
    agent = EtcdAgent(args.endpoints, conf.pop("bootstrap.servers"), args.cluster, node=args.node,
                      events_topic=settings.events_topic, directives_topic=settings.directives_topic,
                      compact_every_s=args.compact_every, heartbeat_s=args.heartbeat,
                      defrag_free_bytes=args.defrag_free_bytes, allow_auto_compaction=args.allow_auto_compaction,
                      state_dir=args.state_dir, client=settings.client, kafka_conf=conf, timeout_s=args.timeout,
                      node_key=os.environ.get("SAFEPOINT_NODE_KEY") or None)  # a secret: no flag
    if args.stats_file:
        path = Path(args.stats_file)

        def write_stats() -> None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(agent.stats)))
            tmp.replace(path)

        agent.on_beat = write_stats
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: agent.stop())
    agent.start()
    print(f"safepoint agent etcd: cluster {args.cluster}, node {args.node}, etcd {args.endpoints}; "
          f"compacting at the directives' safe_ts (Ctrl-C stops)", file=sys.stderr, flush=True)
    agent.run()
    return 0
