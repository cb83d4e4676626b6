"""``safepoint``: the one console script. Every flag can also come from SAFEPOINT_<FLAG> or --config."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from safepoint import __version__
from safepoint.core.policy import SECRET_FIELDS, Policy
from safepoint.errors import ConfigError, SafepointError
from safepoint.settings import POLICY_KEYS, Settings, env_name, load_settings

__all__ = ["main", "build_parser"]

_DEFAULTS = Settings()
_POLICY_HELP = {
    "retention": "history kept regardless of readers, in MVCC units",
    "node_lease_ms": "a node silent this long in cluster time is stale",
    "directive_interval_ms": "least cluster time between two directives of a cluster",
    "max_message_bytes": "larger input messages are dead-lettered",
    "pinned_warning_enter_bytes": "pinned bytes entering the warning band",
    "pinned_warning_exit_bytes": "pinned bytes below which the warning band is left",
    "pinned_critical_enter_bytes": "pinned bytes entering the critical band",
    "pinned_critical_exit_bytes": "pinned bytes below which the critical band is left",
    "band_enter_window_ms": "a breach must last this long to enter a band",
    "band_exit_window_ms": "a recovery must last this long to leave a band",
    "reader_age_warning_ms": "oldest live reader/transaction age for a warning",
    "reader_age_critical_ms": "oldest live reader/transaction age for critical",
    "stall_ms": "alert when the safe point has not advanced for this much cluster time (0: off)",
    "in_doubt_timeout_ms": "alert on a prepared transaction undecided this long",
    "expire_enabled": "expire readers under sustained critical pressure (true/false)",
    "control_on_events_topic": "accept control events found on the events topic, from publishers older than the "
                               "control topic (true/false; off: refused, since every node may write that topic)",
    "expire_after_ms": "critical pressure must last this long before expiry",
    "max_reader_lifetime_ms": "only readers/transactions open longer than this are expired",
    "expire_grace_ms": "a graceful expiry turns hard after this",
    "max_expiries_per_window": "most expire directives per node per window",
    "expire_window_ms": "the window of max_expiries_per_window",
    "status_holds": "oldest readers and transactions of each node kept in the status (0: no status)",
}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    msg = f"expected true or false, got {text!r}"
    raise argparse.ArgumentTypeError(msg)


def _flag(p: argparse.ArgumentParser, name: str, help_text: str, type_: Any = str, default: Any = None) -> None:
    dest = name.replace("-", "_")
    shown = getattr(_DEFAULTS, dest, default)
    p.add_argument(
        f"--{name}", dest=dest, type=type_, default=None, help=f"{help_text} [env {env_name(dest)}; default {shown!r}]"
    )


def _common_job_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")
    for name in POLICY_KEYS:
        if name in SECRET_FIELDS:
            continue  # a secret: environment or file only (a flag shows in the process list)
        default = getattr(Policy(), name)
        kind = _bool if isinstance(default, bool) else (str if isinstance(default, str) else int)
        _flag(p, name.replace("_", "-"), _POLICY_HELP.get(name, "policy key (see docs/operations.md)"), kind)


def _kafka_flags(p: argparse.ArgumentParser) -> None:
    _flag(p, "bootstrap", "Kafka bootstrap servers HOST:PORT")
    _flag(p, "events-topic", "input topic of the nodes' events")
    _flag(p, "control-topic", "input topic of control events (service holds, pause, resume, gap acknowledgements)")
    _flag(p, "directives-topic", "compacted output topic of directives")
    _flag(p, "alerts-topic", "output topic of alerts")
    _flag(p, "deadletter-topic", "output topic of dead letters")


def _status_flags(p: argparse.ArgumentParser) -> None:
    _flag(p, "status-topic", "compacted topic of the status ('' = no status)")
    _flag(p, "http-port", "serve the status API, /metrics and the dashboard on this port (0 = off)", int)
    _flag(p, "http-host", "address the HTTP surface binds")
    _flag(p, "http-tls-certfile", "PEM certificate chain: serve HTTPS (with --http-tls-keyfile)")
    _flag(p, "http-tls-keyfile", "the certificate's PEM private key")


def _control_flags(p: argparse.ArgumentParser) -> None:
    for name, text in (("bootstrap", "Kafka bootstrap servers HOST:PORT"), ("control-topic", "the control topic"),
                       ("status-topic", "the status topic")):
        _flag(p, name, text)
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")


def _agent_flags(p: argparse.ArgumentParser) -> None:
    for name, text in (("bootstrap", "Kafka bootstrap servers HOST:PORT"), ("events-topic", "input topic")):
        _flag(p, name, text)
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="safepoint", description="MVCC safe-point service for distributed databases.")
    parser.add_argument("--version", action="version", version=f"safepoint {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="run a broker for local use and tests: the embedded one, or Apache Kafka (--kafka)")
    p.add_argument("--port", type=int, default=None,
                   help=f"listen port (--nodes N: ports PORT to PORT+N-1) [env {env_name('port')}; default 9092]")
    p.add_argument(
        "--data-dir", default=None, help=f"data directory [env {env_name('data_dir')}; default: a fresh temporary one]"
    )
    p.add_argument("--kafka", action="store_true",
                   help="run Apache Kafka (KRaft) from the jars setup installs instead of the embedded broker")
    p.add_argument("--nodes", type=int, default=1,
                   help="brokers of the Apache Kafka cluster (3: topics get 3 replicas, min.insync.replicas=2)")

    p = sub.add_parser("acls", help="the Kafka ACLs a role needs on this deployment's topics: print them, or grant them")
    p.add_argument("role", choices=("node", "agent", "job", "operator", "holder"), help="what the principal does")
    p.add_argument("principal", help="User:NAME, the principal Kafka authenticates (its SASL user)")
    p.add_argument("--apply", action="store_true",
                   help="grant them with the admin API, as the principal of the [kafka] settings (else print "
                        "kafka-acls.sh lines)")
    _kafka_flags(p)
    _flag(p, "status-topic", "compacted topic of the status ('' = no status)")
    _flag(p, "accounting-topic", "the accounting topic ('' = none)")
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")

    p = sub.add_parser("run", help="run the streaming job until SIGINT/SIGTERM")
    _kafka_flags(p)
    _flag(p, "checkpoint", "checkpoint directory (shared storage on a cluster)")
    _flag(p, "trigger-ms", "micro-batch interval", int)
    _flag(p, "max-offsets-per-trigger", "most messages one micro-batch reads", int)
    _flag(p, "starting-offsets", "earliest or latest, for a new checkpoint")
    _flag(p, "source-format", "python (no jars) or kafka (Spark's connector)")
    _flag(p, "shuffle-partitions", "tasks the stateful operator spreads its clusters over (1 for one cluster)", int)
    _flag(p, "node-buckets", "map entries a cluster's node state is split into (crc32(node) %% node_buckets; fixed per checkpoint)", int)
    _flag(p, "spark-master", "Spark master URL")
    _flag(p, "spark-ui", "serve Spark's web UI (its address is printed at start)", _bool)
    _flag(p, "events-partitions", "partitions of the events topic if the job creates it", int)
    _flag(p, "accounting-topic", "also write every input offset's outcome to this topic ('' = off)")
    _status_flags(p)
    _common_job_flags(p)

    p = sub.add_parser("serve", help="serve the status API, metrics and dashboard from the status topic alone")
    _flag(p, "bootstrap", "Kafka bootstrap servers HOST:PORT")
    _status_flags(p)
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")

    p = sub.add_parser("replay", help="run the core over a JSONL file of events, without Spark or Kafka")
    p.add_argument("--input", required=True, help="events, one JSON object a line, in log order ('-' for stdin)")
    p.add_argument("--output", default=None, help="directives and alerts, one JSON object a line (default stdout)")
    p.add_argument("--deadletter-output", default=None, help="dead letters, one JSON object a line")
    p.add_argument("--status", default=None, metavar="FILE",
                   help="write each cluster's final status there (JSON, the shape of GET /api/v1/clusters)")
    p.add_argument("--generation", default="",
                   help="the job's generation to stamp directives with, as the job did (its checkpoint's "
                        "safepoint.json keeps it; default: none)")
    _common_job_flags(p)

    p = sub.add_parser("simulate", help="publish a synthetic cluster's events")
    _kafka_flags(p)
    p.add_argument("--nodes", type=int, default=None, help=f"nodes per cluster [env {env_name('nodes')}; default 3]")
    p.add_argument("--rate", type=float, default=None, help=f"events per second [env {env_name('rate')}; default 200]")
    p.add_argument("--duration", type=float, default=None, help=f"seconds, default until Ctrl-C [env {env_name('duration')}]")
    p.add_argument("--clusters", type=int, default=None, help=f"database clusters [env {env_name('clusters')}; default 1]")
    p.add_argument("--namespaces", type=int, default=None, help=f"tenants t0..tN-1 [env {env_name('namespaces')}; default 0]")
    p.add_argument("--seed", type=int, default=None, help=f"random seed [env {env_name('seed')}; default 0]")
    p.add_argument("--flush-timeout", type=float, default=None,
                   help=f"seconds to wait for the last deliveries at the end [env {env_name('flush_timeout')}; default 30]")
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")

    p = sub.add_parser("check-node", help="read what one node publishes and report every departure from the contract")
    _kafka_flags(p)
    _common_job_flags(p)
    p.add_argument("--cluster", required=True, help="the node's cluster id")
    p.add_argument("--node", required=True, help="the node id (its events' key)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds to read (default 30)")
    p.add_argument("--from-beginning", action="store_true",
                   help="read the topic from its beginning (assumes it still holds the node's first event)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p = sub.add_parser("audit", help="check every directive against the holds live when it was made, beside the job")
    _kafka_flags(p)
    p.add_argument("--until-idle", type=float, default=None, metavar="SECONDS",
                   help="stop once both topics were quiet this long; exit 1 if a violation was found")
    p.add_argument("--from-end", action="store_true",
                   help="start at the topics' ends (holds opened before are not known) instead of their beginnings")
    p.add_argument("--no-alerts", action="store_true", help="print violations only (no audit_violation alert)")
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")
    p = sub.add_parser("view", help="live view of the safe point, blockers, bands and alerts of a running job")
    _kafka_flags(p)
    _flag(p, "mvcc-unit", "unit of MVCC timestamps: ns, us, ms or s shows times; none shows the numbers")
    p.add_argument("--duration", type=float, default=None, help=f"seconds, default until Ctrl-C [env {env_name('duration')}]")
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")

    p = sub.add_parser("demo", help="broker + simulated cluster + job + live view, on this machine")
    p.add_argument("--duration", type=float, default=None, help=f"seconds, default until Ctrl-C [env {env_name('duration')}]")
    p.add_argument("--nodes", type=int, default=None, help=f"simulated nodes [env {env_name('nodes')}; default 5]")
    p.add_argument("--rate", type=float, default=None, help=f"events per second [env {env_name('rate')}; default 300]")
    p.add_argument("--namespaces", type=int, default=None, help=f"simulated tenants [env {env_name('namespaces')}; default 3]")
    p.add_argument("--checkpoint", default=None, help=f"checkpoint directory [env {env_name('checkpoint')}; default: temporary]")
    p.add_argument("--engine", action="append", choices=["etcd", "postgres", "mariadb"], default=[],
                   help="a real engine beside the simulated cluster, started on loopback (etcd: Debian's etcd, "
                        "compacted by its agent as cluster etcd-main; postgres: Debian's PostgreSQL with a writer "
                        "and a forgotten report, reported by its agent as cluster pg-main; mariadb: Debian's MariaDB "
                        "likewise, as cluster mdb-main in InnoDB transaction numbers); repeatable")
    p.add_argument("--kafka", action="store_true", dest="apache_kafka",
                   help="run Apache Kafka (KRaft, from the jars setup installs) instead of the embedded broker")
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")

    p = sub.add_parser("soak", help="simulator + job for a set time, then an independent safety/liveness check")
    p.add_argument("--duration", type=float, default=None, help=f"seconds of simulated load [env {env_name('duration')}; default 300]")
    p.add_argument("--nodes", type=int, default=None, help=f"simulated nodes [env {env_name('nodes')}; default 5]")
    p.add_argument("--rate", type=float, default=None, help=f"events per second [env {env_name('rate')}; default 200]")
    p.add_argument(
        "--bad-rate", type=float, default=None, help=f"extra bad messages per event [env {env_name('bad_rate')}; default 0.002]"
    )
    p.add_argument("--seed", type=int, default=None, help=f"random seed [env {env_name('seed')}; default 0]")
    p.add_argument("--report", default=None, help=f"also write the report as JSON to this file [env {env_name('report')}]")

    p = sub.add_parser("node-key", help="print a node's own key, from its cluster's node_key_secret (the node signs "
                                        "its events with it: Reporter(node_key=...))")
    p.add_argument("cluster")
    p.add_argument("node")
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")
    p = sub.add_parser("client-driver", help="one node driven by JSON lines of operations on stdin (conformance of "
                                             "the clients in other languages: schemas/vectors/)")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--cluster", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--incarnation", type=int, required=True)
    p.add_argument("--heartbeat-ms", type=int, default=0, help="heartbeat interval (0: only when an operation asks)")
    p.add_argument("--retention", type=int, default=None, help="lazy registration with this retention (MVCC units)")
    p.add_argument("--node-key", default=None, help="sign every event with this node key")
    p.add_argument("--directive-key", default=None, help="verify directives with these public keys")
    p.add_argument("--events-topic", default="safepoint.events")
    p.add_argument("--directives-topic", default="safepoint.directives")
    p.add_argument("--snapshot-part-bytes", type=int, default=None, help="the size a snapshot's part may reach")
    p.add_argument("--control-topic", default="safepoint.control", help="where service holds are set")
    p.add_argument("--status-topic", default="safepoint.status", help="where the job's outcomes of them are read")
    p = sub.add_parser("directive-key", help="make an Ed25519 key pair that signs directives: the private key for "
                                             "the job's directive_keys, the public one for nodes and agents")
    p.add_argument("--public", action="store_true",
                   help="print instead the public key of each of the job's directive_keys (settings or "
                        f"{env_name('directive_keys')}), for the nodes")
    p.add_argument("--cluster", default=None, help="with --public: this cluster's keys ([clusters.NAME])")
    p.add_argument("--config", default=None, help=f"TOML file of settings [env {env_name('config')}]")
    p = sub.add_parser("spark-classes", help="build the class-data archive that makes Spark's JVM start faster "
                       "(once per machine; scripts/setup.sh runs it)")
    p.add_argument("--if-missing", action="store_true", help="do nothing when this Java and Spark's archive exists")
    p.add_argument("--path", default=None, help="where to write it [default: under the environment's share/safepoint; "
                   "SAFEPOINT_SPARK_CLASSES names another path, or off]")

    from safepoint.ops.control_cli import add_parsers

    add_parsers(sub, _control_flags)
    from safepoint.ops.agent_cli import add_parsers as add_agent_parsers

    add_agent_parsers(sub, _agent_flags)

    # everything after "bench" goes to benchmarks/bench.py as is ("+" prefix: no "-" flag is taken here)
    p = sub.add_parser("bench", help="benchmark: raw consume, plain consumer and the job (see README, Benchmark)",
                       prefix_chars="+", add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    return parser


def _env_or(args: argparse.Namespace, name: str, default: Any, type_: Any) -> Any:
    value = getattr(args, name, None)
    if value is not None:
        return value
    raw = os.environ.get(env_name(name))
    return type_(raw) if raw not in (None, "") else default


def _settings(args: argparse.Namespace, own: tuple[str, ...] = ()) -> Settings:
    """The settings of a command: its flags over the environment over ``--config``'s file; ``own``
    names the command's flags that are no setting (simulate's ``--clusters``, a count, is not the
    ``[clusters.NAME]`` tables of the file)."""
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config", "verbose", *own)}
    return load_settings(getattr(args, "config", None), flags)


def cmd_broker(args: argparse.Namespace) -> int:
    port = _env_or(args, "port", 9092, int)
    data_dir = _env_or(args, "data_dir", None, str)
    if args.kafka:
        from safepoint.devtools.apache_kafka import run_foreground as run_kafka

        return run_kafka(port, data_dir, args.nodes)
    if args.nodes != 1:
        msg = "--nodes needs --kafka: the embedded broker is one process"
        raise ConfigError(msg)
    from safepoint.devtools.broker import run_foreground

    return run_foreground(port, data_dir)


def cmd_acls(args: argparse.Namespace) -> int:
    from safepoint.connectors.kafka.acls import apply, shell_lines

    settings = load_settings(args.config, {k: v for k, v in vars(args).items()
                                           if k not in ("command", "config", "verbose", "role", "principal", "apply")})
    if args.apply:
        n = apply(settings.librdkafka(), args.role, args.principal, settings.topics())
        print(f"safepoint acls: granted {n} ACLs of the {args.role} role to {args.principal}")
        return 0
    for line in shell_lines(args.role, args.principal, settings.topics(), settings.bootstrap):
        print(line)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from safepoint.replay import replay_file, replay_progress, summary_lines

    settings = _settings(args)
    out = sys.stdout if args.output in (None, "-") else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    dl = open(args.deadletter_output, "w", encoding="utf-8") if args.deadletter_output else None  # noqa: SIM115
    try:
        with replay_progress(args.input) as progress:
            engine = replay_file(args.input, out, settings.policies().with_generation(args.generation), dl, progress)
    except FileNotFoundError as exc:
        msg = f"input file not found: {exc.filename}"
        raise SafepointError(msg) from exc
    finally:
        if out is not sys.stdout:
            out.close()
        if dl is not None:
            dl.close()
    for line in summary_lines(engine):
        print(line, file=sys.stderr)
    if args.status:
        from safepoint.replay import final_status

        with open(args.status, "w", encoding="utf-8") as f:
            json.dump(final_status(engine), f, indent=1, sort_keys=True)
            f.write("\n")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from safepoint.devtools.simulate import SimConfig, run_simulator

    settings = _settings(args, own=("nodes", "rate", "duration", "seed", "clusters", "namespaces", "flush_timeout"))
    cfg = SimConfig(_env_or(args, "nodes", 3, int), _env_or(args, "rate", 200.0, float), namespaces=_env_or(args, "namespaces", 0, int))
    return run_simulator(
        settings.bootstrap,
        settings.events_topic,
        cfg,
        _env_or(args, "duration", None, float),
        _env_or(args, "seed", 0, int),
        settings.librdkafka(),
        clusters=_env_or(args, "clusters", 1, int),
        flush_timeout_s=_env_or(args, "flush_timeout", 30.0, float),
    )


def cmd_run(args: argparse.Namespace) -> int:
    from safepoint.ops.serve import JobSurface
    from safepoint.streaming.driver import run_job

    settings = _settings(args)
    return run_job(settings, lambda active: JobSurface(settings, active))


def _tool(module: str, func: str) -> Callable[[argparse.Namespace], int]:
    """A command whose code lives in ``module``: ``func(args, settings)``, imported when it runs."""
    return lambda args: int(getattr(importlib.import_module(module), func)(args, _settings(args)))


def cmd_demo(args: argparse.Namespace) -> int:
    from safepoint.devtools.demo import run_demo

    settings = _settings(args)
    return run_demo(
        settings,
        duration_s=_env_or(args, "duration", None, float),
        nodes=_env_or(args, "nodes", 5, int),
        rate=_env_or(args, "rate", 300.0, float),
        checkpoint=args.checkpoint,
        namespaces=_env_or(args, "namespaces", 3, int),
        engines=tuple(dict.fromkeys(args.engine)),
        kafka=args.apache_kafka,
    )


def cmd_check_node(args: argparse.Namespace) -> int:
    import dataclasses

    from safepoint.checknode import NodeCheck, announced_retention, read_node

    flags = {k: v for k, v in vars(args).items() if k not in ("cluster", "node", "duration", "from_beginning", "json")}
    settings = _settings(argparse.Namespace(**flags))
    policy = settings.policy()
    if args.retention is None and not os.environ.get(env_name("retention")) and settings.retention == _DEFAULTS.retention:
        # a Reporter with lazy registration (retention=R, R at most the job's) leaves the holds above its bound
        # unpublished by design: judge with the job's retention, as its newest directive announces it
        announced = announced_retention(settings.librdkafka(), settings.directives_topic, args.cluster)
        if announced is not None:
            policy = dataclasses.replace(policy, retention=announced)
    check = NodeCheck(args.cluster, args.node, policy, from_first_event=args.from_beginning)
    for key, value, partition, offset, headers in read_node(settings.librdkafka(), settings.events_topic, args.duration,
                                                            args.from_beginning, args.node):
        check.feed(key, value, partition, offset, headers)
    report = check.report()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for f in check.findings():
            print(f.line())
        if not check.events:
            print(f"no event of node {args.node} (cluster {args.cluster}) on {settings.events_topic} in {args.duration:.0f} s")
        else:
            verdict = "conforms" if report["conforms"] else f"{len(report['findings'])} departure(s)"
            print(f"node {args.node} (cluster {args.cluster}): {check.events} event(s) read, {verdict}")
    return 0 if report["conforms"] else 1


def cmd_audit(args: argparse.Namespace) -> int:
    from safepoint.ops.audit import run_audit

    flags = {k: v for k, v in vars(args).items() if k not in ("until_idle", "from_end", "no_alerts")}
    settings = _settings(argparse.Namespace(**flags))
    return run_audit(settings, until_idle_s=args.until_idle, from_beginning=not args.from_end, alerts=not args.no_alerts)


def cmd_view(args: argparse.Namespace) -> int:
    from safepoint.ops.view import follow

    return follow(_settings(args), _env_or(args, "duration", None, float))


def cmd_soak(args: argparse.Namespace) -> int:
    from safepoint.devtools.soak import SoakConfig, run_soak

    cfg = SoakConfig(
        duration_s=_env_or(args, "duration", 300.0, float),
        nodes=_env_or(args, "nodes", 5, int),
        rate=_env_or(args, "rate", 200.0, float),
        bad_rate=_env_or(args, "bad_rate", 0.002, float),
        seed=_env_or(args, "seed", 0, int),
    )
    return run_soak(cfg, _env_or(args, "report", None, str))


def cmd_node_key(args: argparse.Namespace) -> int:
    from safepoint.core.signing import node_key

    secret = load_settings(args.config).policies().of(args.cluster).node_key_secret
    if not secret:
        msg = (f"cluster {args.cluster} has no node_key_secret (set SAFEPOINT_NODE_KEY_SECRET, or node_key_secret in "
               "the TOML file or its [clusters.NAME] table)")
        raise SafepointError(msg)
    print(node_key(secret, args.cluster, args.node))
    return 0


def cmd_client_driver(args: argparse.Namespace) -> int:
    from safepoint.devtools.client_driver import run_driver

    return run_driver(args.bootstrap, args.cluster, args.node, args.incarnation, args.heartbeat_ms, args.retention,
                      args.node_key, args.directive_key, args.events_topic, args.directives_topic,
                      args.snapshot_part_bytes, control_topic=args.control_topic, status_topic=args.status_topic)


def cmd_directive_key(args: argparse.Namespace) -> int:
    import secrets

    from safepoint.core.signing import public_key_of

    if args.public:
        policies = load_settings(args.config).policies()
        keys = (policies.of(args.cluster) if args.cluster else policies.default).directive_keys
        listed = [k.strip() for k in keys.split(",") if k.strip()]
        if not listed:
            msg = f"no directive_keys{' for cluster ' + args.cluster if args.cluster else ''} (set SAFEPOINT_DIRECTIVE_KEYS)"
            raise SafepointError(msg)
        print(",".join(public_key_of(k) for k in listed))
        return 0
    made = secrets.token_hex(32)
    print(f"directive_keys = \"{made}\"   # the job's: a secret (SAFEPOINT_DIRECTIVE_KEYS)")
    print(f"directive_key = \"{public_key_of(made)}\"   # nodes' and agents' (SAFEPOINT_DIRECTIVE_KEY, --directive-key)")
    return 0


def cmd_spark_classes(args: argparse.Namespace) -> int:
    from pathlib import Path

    from safepoint.devtools.spark_classes import make_archive
    from safepoint.streaming.classes import archive_path

    target = Path(args.path) if args.path else archive_path()
    if target is None:
        print("spark-classes: SAFEPOINT_SPARK_CLASSES=off, nothing to build", flush=True)
        return 0
    if args.if_missing and target.is_file():
        print(f"spark-classes: {target} is there", flush=True)
        return 0
    try:
        make_archive(target)
    except RuntimeError as exc:
        raise SafepointError(str(exc)) from exc
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Run benchmarks/bench.py of this source checkout (it is not part of the installed package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench.py"
    spec = importlib.util.spec_from_file_location("safepoint_bench", path) if path.exists() else None
    if spec is None or spec.loader is None:
        msg = f"safepoint bench runs from a source checkout: {path} not found"
        raise SafepointError(msg)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    rc: int = module.main(list(args.bench_args))
    return rc

EXTRAS = {"pyspark": "job", "pyarrow": "job", "pandas": "job", "fastapi": "serve", "uvicorn": "serve",
          "prometheus_client": "serve", "starlette": "serve", "pydantic": "serve", "rich": "serve", "noida_db": "broker",
          "psutil": "dev", "kafka": "kafka-python", "httpx": "etcd", "psycopg": "postgres"}
"""The extra that brings a module a command needs (pyproject.toml: the bare install is the node client)."""
COMMAND_EXTRAS = {"run": "job", "serve": "serve", "view": "serve", "replay": "serve", "broker": "broker", "demo": "dev",
                  "soak": "dev", "bench": "dev", "spark-classes": "dev"}
"""The extra that brings everything a command needs."""
_CONTROL = _tool("safepoint.ops.control_cli", "run_args")
COMMANDS = {"node-key": cmd_node_key, "directive-key": cmd_directive_key, "client-driver": cmd_client_driver, "agent": _tool("safepoint.ops.agent_cli", "run_args"), "hold": _CONTROL, "pause": _CONTROL, "resume": _CONTROL, "ack-gap": _CONTROL, "serve": _tool("safepoint.ops.serve", "serve_args"), "view": cmd_view, "check-node": cmd_check_node, "audit": cmd_audit, "broker": cmd_broker, "acls": cmd_acls, "run": cmd_run, "replay": cmd_replay, "simulate": cmd_simulate, "demo": cmd_demo, "soak": cmd_soak, "bench": cmd_bench, "spark-classes": cmd_spark_classes}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # librdkafka retries an unreachable broker with a FAIL line each time: -v shows them
        logging.getLogger("safepoint.librdkafka").setLevel(logging.CRITICAL)
    try:
        return COMMANDS[args.command](args)
    except SafepointError as exc:
        print(f"safepoint {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in EXTRAS:
            raise
        extra = COMMAND_EXTRAS.get(args.command) or EXTRAS[(exc.name or "").split(".")[0]]
        print(f"safepoint {args.command}: needs {exc.name}, which the bare install (the node client) leaves out: "
              f"pip install 'safepoint[{extra}]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
