"""``safepoint demo``: embedded broker, simulated cluster, the job, and a live terminal view.

``--engine etcd`` runs a real engine beside the simulated cluster: a one-member etcd on loopback
(Debian's ``etcd``, as the tests start it), a writer putting keys, and ``EtcdAgent`` reporting it
as cluster ``etcd-main`` (its own policy: revisions, a retention of ``ETCD_RETENTION``) and
compacting it at each directive, so the dashboard shows a real store's revisions and compactions
beside the simulated cluster's times. ``--engine postgres`` runs a PostgreSQL server (Debian's, as
the ``postgres`` user), a writer, a report that now and then leaves a ``REPEATABLE READ`` snapshot
open, and ``PostgresAgent`` reporting it as cluster ``pg-main`` in xids: the dashboard names the
report's snapshot with its cost, and the safe point waits for it. ``--engine mariadb`` does the same
with a MariaDB server (Debian's, as the ``mysql`` user) and ``MariaDBAgent``, cluster ``mdb-main``
in InnoDB's transaction numbers: the report's read view, its cost and the history list behind it."""

from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from safepoint.ops.audit import follow_and_audit
from safepoint.ops.serve import JobSurface
from safepoint.ops.view import LiveView, show
from safepoint.settings import Settings

__all__ = ["ENGINES", "run_demo"]

ENGINES = ("etcd", "postgres", "mariadb")
"""Real engines the demo can run beside the simulated cluster."""
ETCD_CLUSTER = "etcd-main"
ETCD_RETENTION = 200
"""Revisions etcd keeps under the demo's safe point."""
PG_CLUSTER = "pg-main"
PG_RETENTION = 50
"""Transaction ids the PostgreSQL cluster's safe point trails the next xid by when nothing holds it."""
PG_REPORT_EVERY_S = (20.0, 25.0)
MDB_CLUSTER = "mdb-main"
MDB_RETENTION = 50
"""Transaction numbers the MariaDB cluster's safe point trails the next one by when nothing holds it."""
"""The demo's forgotten report: idle 20 s, then holding a snapshot for 25 s, again and again."""


class _Engine:
    """What the demo's real engines share: the agent and the threads that run beside the engine (the
    agent's loop, a writer, ...), started together and stopped once, the engine itself last."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.agent: Any = None

    def _run(self, *targets: tuple[Any, str]) -> None:
        self._threads += [threading.Thread(target=t, name=name, daemon=True) for t, name in targets]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop the agent, the threads and the engine (once; again: nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.agent is not None:
            self.agent.stop()
        for t in self._threads:
            t.join(10)
        self._stop_engine()

    def _stop_engine(self) -> None:
        raise NotImplementedError


class _EtcdEngine(_Engine):
    """One etcd member, a writer and the agent that reports and compacts it, until ``stop``."""

    def __init__(self, work: str, settings: Settings) -> None:
        from safepoint.devtools.etcd import LocalEtcd, etcd_missing
        from safepoint.errors import SafepointError

        why = etcd_missing()
        if why is not None:
            msg = f"safepoint demo --engine etcd: {why}"
            raise SafepointError(msg)

        super().__init__(settings)
        self.etcd = LocalEtcd(Path(work) / "etcd", 1)

    def start(self) -> _EtcdEngine:
        from safepoint.connectors.etcd_agent import EtcdAgent

        self.etcd.start()
        s = self.settings
        self.agent = EtcdAgent(self.etcd.endpoints, s.bootstrap, ETCD_CLUSTER, node="etcd", events_topic=s.events_topic,
                               directives_topic=s.directives_topic, compact_every_s=1.0, heartbeat_s=1.0).start()
        self._run((self._write, "demo-etcd-writer"), (self.agent.run, "demo-etcd-agent"))
        print(f"etcd at {self.etcd.endpoints}: cluster {ETCD_CLUSTER}, compacted by its agent to "
              f"{ETCD_RETENTION} revisions under the safe point", flush=True)
        return self

    def _write(self) -> None:
        from safepoint.connectors.etcd_gateway import EtcdGateway

        etcd, i = EtcdGateway(self.etcd.endpoints, timeout_s=2), 0
        while not self._stop.wait(0.05):  # about 20 puts a second
            try:
                etcd.put(f"/demo/key{i % 50:02d}", f"value {i}")
                i += 1
            except Exception:  # noqa: BLE001, S112 - etcd stopping under the writer at the end
                continue
        etcd.close()

    def _stop_engine(self) -> None:
        self.etcd.stop()


class _PostgresEngine(_Engine):
    """A PostgreSQL server (as the ``postgres`` user), a writer, a report that now and then leaves a
    ``REPEATABLE READ`` snapshot open, and the agent that reports it (``--terminate
    idle-in-transaction --vacuum``), until ``stop``."""

    def __init__(self, settings: Settings) -> None:
        from safepoint.devtools.postgres import LocalPostgres, postgres_missing
        from safepoint.errors import SafepointError

        why = postgres_missing()
        if why is not None:
            msg = f"safepoint demo --engine postgres: {why}"
            raise SafepointError(msg)
        super().__init__(settings)
        self.server = LocalPostgres(prefix="safepoint-demo-engines-pg-")  # a directory the postgres user owns

    def start(self) -> _PostgresEngine:
        from safepoint.connectors.postgres_agent import PostgresAgent
        from safepoint.devtools.postgres import Writer

        self.server.start()
        # 10 transactions a second, 100 row versions each
        writer = Writer(self.server.dsn(), rows=1000, per_tx=100, application_name="demo-writer", stop=self._stop).create()
        s = self.settings
        self.agent = PostgresAgent(self.server.dsn(), s.bootstrap, PG_CLUSTER, node="pg-primary",
                                   events_topic=s.events_topic, directives_topic=s.directives_topic, poll_s=1.0,
                                   terminate="idle-in-transaction", vacuum=True, vacuum_every_s=10.0).start()
        self._run((writer.run, "demo-pg-writer"), (self._report, "demo-pg-report"), (self.agent.run, "demo-pg-agent"))
        print(f"PostgreSQL at {self.server.dsn()}: cluster {PG_CLUSTER} in xids, reported by its agent; a report "
              f"holds a snapshot {PG_REPORT_EVERY_S[1]:.0f} s of every {sum(PG_REPORT_EVERY_S):.0f} s", flush=True)
        return self

    def _report(self) -> None:
        import psycopg

        idle, hold = PG_REPORT_EVERY_S
        while not self._stop.wait(idle):
            try:
                with self.server.snapshot("nightly-report", "SELECT sum(total) FROM orders") as c:
                    self._stop.wait(hold)  # idle in its transaction: its snapshot holds the horizon
                    c.rollback()
            except psycopg.Error:
                continue  # ended by the agent under forced expiry, or the server stopping

    def _stop_engine(self) -> None:
        self.server.cleanup()


class _MariaDBEngine(_Engine):
    """A MariaDB server (as the ``mysql`` user), a writer, a report that now and then leaves a
    ``REPEATABLE READ`` read view open, and the agent that reports it (``--kill
    idle-in-transaction``), until ``stop``."""

    def __init__(self, settings: Settings) -> None:
        from safepoint.devtools.mariadb import LocalMariaDB, mariadb_missing
        from safepoint.errors import SafepointError

        why = mariadb_missing()
        if why is not None:
            msg = f"safepoint demo --engine mariadb: {why}"
            raise SafepointError(msg)
        super().__init__(settings)
        self.server = LocalMariaDB(prefix="safepoint-demo-engines-mdb-")  # a directory the mysql user owns

    def start(self) -> _MariaDBEngine:
        from safepoint.connectors.mariadb_agent import MariaDBAgent
        from safepoint.devtools.mariadb import MariaWriter

        self.server.start()
        # 10 transactions a second, 100 row versions each
        writer = MariaWriter(self.server, rows=1000, per_tx=100, every_s=0.1, stop=self._stop).create()
        s = self.settings
        self.agent = MariaDBAgent(self.server.dsn(), s.bootstrap, MDB_CLUSTER, node="db1", events_topic=s.events_topic,
                                  directives_topic=s.directives_topic, poll_s=1.0, kill="idle-in-transaction").start()
        self._run((writer.run, "demo-mdb-writer"), (self._report, "demo-mdb-report"), (self.agent.run, "demo-mdb-agent"))
        print(f"MariaDB at {self.server.dsn()}: cluster {MDB_CLUSTER} in InnoDB transaction numbers, reported by its "
              f"agent; a report holds a read view {PG_REPORT_EVERY_S[1]:.0f} s of every {sum(PG_REPORT_EVERY_S):.0f} s",
              flush=True)
        return self

    def _report(self) -> None:
        idle, hold = PG_REPORT_EVERY_S
        while not self._stop.wait(idle):
            try:
                c = self.server.snapshot("SELECT sum(total) FROM shop.orders")
                try:
                    self._stop.wait(hold)  # idle in its transaction: its read view holds purge
                    c.rollback()
                finally:
                    c.close()
            except Exception:  # noqa: BLE001, S112 - ended by the agent under forced expiry, or the server stopping
                continue

    def _stop_engine(self) -> None:
        self.server.cleanup()


class _Engines:
    """The real engines a demo runs beside its simulated cluster (``--engine``), in a directory of their own."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.dir = tempfile.mkdtemp(prefix="safepoint-demo-engines-") if names else None
        self.running: list[_Engine] = []

    def policy(self, settings: Settings) -> Settings:
        """``settings`` with each engine's cluster policy (etcd: revisions, ``docs/etcd.md``; PostgreSQL:
        xids, ``docs/postgres.md``; MariaDB: InnoDB's transaction numbers, ``docs/mariadb.md``); what
        the user's own tables say wins."""
        tables = {"etcd": (ETCD_CLUSTER, {"mvcc_unit": "revision", "retention": ETCD_RETENTION}),
                  "postgres": (PG_CLUSTER, {"mvcc_unit": "xid", "retention": PG_RETENTION}),
                  "mariadb": (MDB_CLUSTER, {"mvcc_unit": "trx", "retention": MDB_RETENTION})}
        clusters = dict(settings.clusters)
        for name in self.names:
            cluster, table = tables[name]
            clusters[cluster] = {**table, **settings.clusters.get(cluster, {})}
        return replace(settings, clusters=clusters) if self.names else settings

    def start(self, settings: Settings) -> None:
        for name in dict.fromkeys(self.names):
            assert self.dir is not None
            if name == "etcd":
                self.running.append(_EtcdEngine(self.dir, settings).start())
            elif name == "postgres":
                self.running.append(_PostgresEngine(settings).start())
            else:
                self.running.append(_MariaDBEngine(settings).start())

    def stop(self) -> None:
        for engine in self.running:
            engine.stop()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)


def run_demo(settings: Settings, duration_s: float | None, nodes: int, rate: float, checkpoint: str | None,
             namespaces: int = 3, engines: tuple[str, ...] = (), kafka: bool = False) -> int:
    from safepoint.connectors.kafka.topics import ensure_topics, topic_specs
    from safepoint.devtools.broker import EmbeddedBroker
    from safepoint.devtools.simulate import SimConfig, run_simulator
    from safepoint.streaming.job import batch_accounting, build_query, messages_in
    from safepoint.streaming.session import build_session, check_java, stop_on_signals, stop_session

    check_java()
    tty = sys.stdout.isatty()
    own_ckpt = checkpoint is None
    checkpoint = checkpoint or tempfile.mkdtemp(prefix="safepoint-demo-ckpt-")
    broker: Any
    if kafka:
        from safepoint.devtools.apache_kafka import ApacheKafka, kafka_version

        print(f"starting Apache Kafka {kafka_version()} ...", flush=True)
        broker = ApacheKafka(quick_jit=False).start()
    else:
        print("starting the embedded broker ...", flush=True)
        broker = EmbeddedBroker().start()
    settings = replace(
        settings,
        bootstrap=broker.bootstrap,
        checkpoint=checkpoint,
        **_demo_policy(settings),
    )
    real = _Engines(engines)
    settings = real.policy(settings)
    print(f"broker ready at {broker.bootstrap}; retention {settings.retention} us, lease {settings.node_lease_ms} ms", flush=True)
    spark = query = view = None
    surface: JobSurface | None = None
    sim_thread = None
    start = time.monotonic()
    try:
        ensure_topics(settings.librdkafka(), topic_specs(settings.topics(), settings.events_partitions))
        expiries: queue.Queue[tuple[str, str, str]] = queue.Queue()
        halt = threading.Event()
        sim_cfg = SimConfig(nodes=nodes, rate=rate, stuck_reader_every_ms=60_000, namespaces=namespaces,
                            history_curve=True)
        sim_thread = threading.Thread(
            target=run_simulator,
            args=(broker.bootstrap, settings.events_topic, sim_cfg, duration_s, 0),
            kwargs={"quiet_output": True, "expiries": expiries, "halt": halt},
            daemon=True,
        )
        sim_thread.start()
        real.start(settings)
        audit_stop = threading.Event()
        audit_box: list[Any] = []
        audit_thread = threading.Thread(  # the live auditor beside the job (safepoint audit)
            target=lambda: audit_box.append(follow_and_audit(settings, stop=audit_stop, out=sys.stdout)),
            name="demo-audit", daemon=True)
        audit_thread.start()
        log_fd, log_file = tempfile.mkstemp(prefix="safepoint-demo-", suffix=".log")
        os.close(log_fd)
        print(f"simulating {nodes} nodes at {rate:.0f} events/s; starting Spark (its log: {log_file}) ...", flush=True)
        surface = JobSurface(settings, lambda: bool(query is not None and query.isActive), "demo",
                             port=settings.http_port or 0)  # before Spark: nothing else takes the port
        spark = build_session(settings.spark_master, settings.shuffle_partitions, app="safepoint-demo", log_file=log_file,
                              **settings.jvm())
        stopping = stop_on_signals()  # Ctrl-C ends the demo as its duration does: the summary, then a clean stop
        query = build_query(spark, settings)

        view = LiveView(settings, expiries)
        last_print = 0.0
        last_batch = None
        while not stopping.is_set() and (duration_s is None or time.monotonic() - start < duration_s):
            view.poll(1.0)
            if not query.isActive:
                print(f"the job stopped: {query.exception()}", file=sys.stderr)
                return 1
            if not sim_thread.is_alive() and (duration_s is None or time.monotonic() - start < duration_s - 1):
                print("the simulator stopped early (its error is printed above); stopping the demo", file=sys.stderr)
                return 1
            prog = query.lastProgress
            job = f"batch {prog['batchId']}, {messages_in(prog)} events" if prog else "starting"
            if prog and prog["batchId"] != last_batch:
                last_batch = prog["batchId"]
                surface.batch(prog, batch_accounting(prog), messages_in(prog))
            group = view.render(f"safepoint demo ({nodes} nodes, {rate:.0f} events/s)",
                                f"t+{time.monotonic() - start:.0f}s   job: {job}")
            last_print = show(group, tty, last_print)
        if stopping.is_set():
            print(flush=True)  # past the ^C a terminal echoes
        print(f"demo finished: {view.count} directives; final:", flush=True)
        for name, d in sorted(view.latest.items()):
            print(f"  cluster {name}: seq {d['seq']}, safe point {view.state.ts_full(d['safe_ts'], name)}", flush=True)
        halt.set()  # the simulator and an agent's heartbeats end, so that the auditor finds the topics quiet
        real.stop()
        audit_stop.set()
        audit_thread.join(15)
        if audit_box:
            print(audit_box[0].summary(), flush=True)
        return 0 if view.count > 0 and not (audit_box and audit_box[0].violations) else 1
    except KeyboardInterrupt:  # before the live view ran: nothing to sum up
        return 0
    finally:
        if view is not None:
            view.close()
        if query is not None and query.isActive:
            query.stop()
        if surface is not None:
            surface.close()
        if spark is not None:
            stop_session(spark)
        real.stop()
        broker.cleanup()
        if own_ckpt:
            shutil.rmtree(checkpoint, ignore_errors=True)


def _demo_policy(settings: Settings) -> dict[str, Any]:
    """Thresholds scaled to a demo: the simulator pins 50 MB per second a reader stays open.
    Values the user set (flag, environment or file) are kept."""
    defaults = Settings()
    demo = {
        "mvcc_unit": "us",
        "retention": 2_000_000,
        "node_lease_ms": 10_000,
        "directive_interval_ms": 1_000,
        "pinned_warning_enter_bytes": 1_000_000_000,
        "pinned_warning_exit_bytes": 800_000_000,
        "pinned_critical_enter_bytes": 2_000_000_000,
        "pinned_critical_exit_bytes": 1_600_000_000,
        "band_enter_window_ms": 3_000,
        "band_exit_window_ms": 5_000,
        "reader_age_warning_ms": 30_000,
        "reader_age_critical_ms": 60_000,
        "stall_ms": 30_000,
        "expire_after_ms": 5_000,
        "max_reader_lifetime_ms": 30_000,
        "expire_grace_ms": 10_000,
    }
    return {k: v if getattr(settings, k) == getattr(defaults, k) else getattr(settings, k) for k, v in demo.items()}
