"""Apache Kafka (KRaft, no ZooKeeper) from the jars setup installs, for tests, benchmarks and local runs.

``ApacheKafka(nodes=1)`` runs one broker that is its own controller; ``nodes=3`` a cluster of three
on loopback, each a broker and a voter of a static controller quorum, where the topics made
without a replication factor get 3 replicas and ``min.insync.replicas=2`` (an acks=all write then
succeeds while any two brokers live). Each broker is a JVM of its own (``kafka.Kafka``), its storage
formatted first by Kafka's ``StorageTool``, its log in ``server.log`` of its folder.

Maintenance runs every second rather than every few minutes (retention checks, the log cleaner's
back-off, the delay before a deleted segment's file goes), so that a test can watch retention and
compaction happen. With ``users`` the client listener asks for SASL (SCRAM-SHA-512) and the broker
authorizes every request with Kafka's ``StandardAuthorizer``: ``admin`` (``ADMIN_USER``) is its
super user, every other principal gets only what ACLs grant.

Not for production: one machine, memory and maintenance set for quick tests.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from safepoint.devtools.broker import free_port, serve
from safepoint.errors import BrokerError
from safepoint.jars import KAFKA, require
from safepoint.streaming.java import C1_ONLY, java_binary, java_version_text

__all__ = ["ADMIN_USER", "ApacheKafka", "classes_archive", "kafka_version", "run_foreground"]

ADMIN_USER = ("admin", "admin-secret")
"""The super user of a broker started with ``users`` (it makes topics and grants ACLs)."""
SCRAM = "SCRAM-SHA-512"
_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""
QUICK_MAINTENANCE = {
    "log.retention.check.interval.ms": "1000",
    "log.cleaner.backoff.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
    "log.initial.task.delay.ms": "0",
    "group.initial.rebalance.delay.ms": "0",
}


_QUIET_CDS = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def classes_archive(java: str, jars: list[Path]) -> Path:
    """The brokers' class-data archive for this Java and these jars (JDK 13+ dynamic CDS, as
    ``streaming/classes.py`` makes Spark's): the classes a broker loads, mapped at start instead of
    read and verified. The first broker of a machine that stops cleanly writes it at its exit (a few
    CPU-s once); every JVM started after maps it: on 2 cores a one-broker cluster formatted, started
    and stopped in 1.8-1.9 CPU-s instead of 2.6-2.8, ready in 1.3-1.4 s instead of 2.0-2.1. It lives
    beside the jars (its classpath is theirs); the JVM ignores one that does not match
    (``-Xshare:auto``); remove it to make it again."""
    return jars[0].parent.parent / f"kafka-classes-{_archive_key(java, tuple(j.name for j in jars))}.jsa"


@functools.cache
def _archive_key(java: str, jars: tuple[str, ...]) -> str:
    """What an archive is bound to (``java -version`` asked once a process)."""
    text = json.dumps([java_version_text(java), list(jars)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kafka_version() -> str:
    """The version of the installed Apache Kafka (from its jar's name)."""
    for jar in require(KAFKA):
        if jar.name.startswith("kafka_2.13-"):
            return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")
    return "?"


def _jaas(module: str, user: tuple[str, str], users: dict[str, str] | None = None) -> str:
    extra = "".join(f' user_{name}="{password}"' for name, password in (users or {}).items())
    return f'{module} required username="{user[0]}" password="{user[1]}"{extra};'


@dataclass
class KafkaNode:
    """One broker (and controller) of the cluster."""

    node_id: int
    port: int
    controller_port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    exited: int | None = field(default=None)
    told: bool = False
    """Whether ``newly_ended`` said it ended."""
    dump: Path | None = None
    """Where its JVM writes a class-data archive at its exit (none was made yet), else None."""

    @property
    def log_path(self) -> Path:
        return self.folder / "server.log"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0


class ApacheKafka:
    """Start and stop Apache Kafka brokers as child processes (see the module's text)."""

    def __init__(self, nodes: int = 1, port: int | None = None, data_dir: str | None = None, host: str = "127.0.0.1",
                 users: dict[str, str] | None = None, overrides: dict[str, str] | None = None,
                 heap: str = "512m", quick_jit: bool = True) -> None:
        if nodes < 1:
            msg = f"a Kafka cluster needs at least one node, not {nodes}"
            raise BrokerError(msg)
        self.host = host
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="safepoint-kafka-"))
        self.users = users
        self.overrides = overrides or {}
        self.heap = heap
        self.quick_jit = quick_jit
        ports = [port + i for i in range(nodes)] if port else [free_port() for _ in range(nodes)]
        self.nodes = [KafkaNode(i + 1, p, free_port(), self.data_dir / f"node-{i + 1}") for i, p in enumerate(ports)]
        self.started_s = 0.0
        """How long the last ``start`` took, from the first JVM to every broker answering."""

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    @property
    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes]

    def client_conf(self, user: tuple[str, str] | None = None) -> dict[str, str]:
        """librdkafka settings that reach this cluster (as ``user``, or the super user, when it asks for SASL)."""
        conf = {"bootstrap.servers": self.bootstrap}
        if self.users is not None:
            name, password = user or ADMIN_USER
            conf.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM, "sasl.username": name,
                         "sasl.password": password})
        return conf

    def properties(self, node: KafkaNode) -> dict[str, str]:
        """The server properties of ``node``."""
        n = len(self.nodes)
        voters = ",".join(f"{x.node_id}@{self.host}:{x.controller_port}" for x in self.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"CLIENT://{self.host}:{node.port},CONTROLLER://{self.host}:{node.controller_port}",
            "advertised.listeners": f"CLIENT://{self.host}:{node.port}",
            "inter.broker.listener.name": "CLIENT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.folder / "log"),
            "num.partitions": "1",
            "default.replication.factor": str(min(n, 3)),
            "min.insync.replicas": str(min(n, 3) - 1 if n >= 3 else 1),
            "offsets.topic.replication.factor": str(min(n, 3)),
            "transaction.state.log.replication.factor": str(min(n, 3)),
            "transaction.state.log.min.isr": str(min(n, 3) - 1 if n >= 3 else 1),
            "share.coordinator.state.topic.replication.factor": str(min(n, 3)),
            "share.coordinator.state.topic.min.isr": str(min(n, 3) - 1 if n >= 3 else 1),
            **QUICK_MAINTENANCE,
        }
        if self.users is not None:
            plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
            props.update({
                "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": SCRAM,
                "sasl.mechanism.inter.broker.protocol": SCRAM,
                "listener.name.client.scram-sha-512.sasl.jaas.config":
                    _jaas("org.apache.kafka.common.security.scram.ScramLoginModule", ADMIN_USER),
                "sasl.mechanism.controller.protocol": "PLAIN",
                "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
                "listener.name.controller.plain.sasl.jaas.config": _jaas(plain, ADMIN_USER, dict([ADMIN_USER])),
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{ADMIN_USER[0]}",
                "allow.everyone.if.no.acl.found": "false",
            })
        props.update(self.overrides)
        return props

    def _java(self, node: KafkaNode, dump: Path | None = None) -> list[str]:
        """The JVM's command up to its main class: with the brokers' class-data archive where one was
        made (``classes_archive``), else, with ``dump``, writing one there when the JVM exits."""
        java = java_binary()
        if java is None:
            msg = "Java not found: Apache Kafka needs Java 17 or newer (set JAVA_HOME or put java on PATH)"
            raise BrokerError(msg)
        jars = require(KAFKA)
        classpath = os.pathsep.join(str(j) for j in jars)
        opts = [f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={node.folder / 'log4j2.properties'}", f"-Dkafka.logs.dir={node.folder}"]
        if self.quick_jit:
            opts.append(C1_ONLY)
        archive = classes_archive(java, jars)
        if archive.is_file():
            opts += [f"-XX:SharedArchiveFile={archive}", "-Xshare:auto", *_QUIET_CDS]
        elif dump is not None:
            opts += [f"-XX:ArchiveClassesAtExit={dump}", *_QUIET_CDS]
        return [java, *opts, "-cp", classpath]

    def _format(self, node: KafkaNode, cluster_id: str) -> None:
        node.folder.mkdir(parents=True, exist_ok=True)
        config = node.folder / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties(node).items()))
        (node.folder / "log4j2.properties").write_text(_LOG4J2.format(log=node.log_path))
        if (node.folder / "log" / "meta.properties").exists():
            return  # formatted by an earlier start on this data dir
        cmd = [*self._java(node), "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)]
        for name, password in ({**dict([ADMIN_USER]), **self.users} if self.users is not None else {}).items():
            cmd += ["--add-scram", f"{SCRAM}=[name={name},password={password}]"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if proc.returncode != 0:
            msg = f"formatting Kafka's storage in {node.folder} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}"
            raise BrokerError(msg)

    def start(self, timeout_s: float = 90.0) -> ApacheKafka:
        began = time.monotonic()
        cluster_id = self._cluster_id()
        for node in self.nodes:
            self._format(node, cluster_id)
        try:
            for node in self.nodes:
                self.start_node(node)
            self._wait_ready(began + timeout_s)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        return self

    def _cluster_id(self) -> str:
        stored = self.data_dir / "cluster.id"
        if stored.exists():
            return stored.read_text().strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cid = "-"
        while cid.startswith("-"):  # as Kafka's own Uuid.randomUuid: an id starting with "-" reads as a flag
            cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        stored.write_text(cid)
        return cid

    def start_node(self, node: KafkaNode) -> None:
        """Start ``node``'s JVM (again, after ``kill``: its data is kept)."""
        config = node.folder / "server.properties"
        out = open(node.folder / "stdout.log", "ab")  # noqa: SIM115 - the child owns it
        # a session of its own: a Ctrl-C to the command that runs it lets that command stop it last
        node.dump = node.folder / f"classes-{os.getpid()}-{node.node_id}.jsa"  # this start's archive, if it makes one
        node.proc = subprocess.Popen([*self._java(node, dump=node.dump), "kafka.Kafka", str(config)], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        node.exited, node.told = None, False
        out.close()

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        from safepoint.devtools.broker import _QuietLogger

        conf: dict[str, Any] = {**self.client_conf(), "logger": _QuietLogger()}
        admin = AdminClient(conf)
        seen = 0
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    msg = (f"Kafka node {node.node_id} exited with code {node.proc.returncode} before it was ready:\n"
                           f"{self.tail(node)}")
                    raise BrokerError(msg)
            try:
                seen = len(admin.list_topics(timeout=2).brokers)
            except Exception:  # noqa: BLE001 - not answering yet
                seen = 0
            if seen == len(self.nodes):
                return
            time.sleep(0.2)
        msg = f"Apache Kafka at {self.bootstrap}: {seen} of {len(self.nodes)} brokers answered in time"
        raise BrokerError(msg)

    def tail(self, node: KafkaNode, chars: int = 3000) -> str:
        text = ""
        for path in (node.folder / "stdout.log", node.log_path):
            if path.exists():
                text += path.read_text(errors="replace")[-chars:]
        return text

    def kill(self, index: int) -> int:
        """SIGKILL the broker ``index`` (0-based); returns its pid. Its data stays; ``start_node`` brings it back."""
        node = self.nodes[index]
        pid = node.pid
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.exited = node.proc.wait()
        return pid

    def alive(self) -> list[bool]:
        return [n.proc is not None and n.proc.poll() is None for n in self.nodes]

    def about(self) -> str:
        return (f"Apache Kafka {kafka_version()}, {len(self.nodes)} node{'s' if len(self.nodes) > 1 else ''}, "
                f"started in {self.started_s:.1f} s")

    def newly_ended(self) -> tuple[list[str], bool]:
        """(a line for each broker that ended since the last call, whether none is left)."""
        said = []
        for node in self.nodes:
            if not node.told and node.proc is not None and node.proc.poll() is not None:
                node.told = True
                said.append(f"Kafka node {node.node_id} (pid {node.pid}) exited with code {node.proc.returncode}; "
                            f"see {node.log_path}")
        return said, not any(self.alive())

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every broker at once (a clean shutdown), then SIGKILL what has not ended in ``timeout_s``."""
        running = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for node in running:
            assert node.proc is not None
            node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node in running:
            assert node.proc is not None
            try:
                node.exited = node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.exited = node.proc.wait()
        self._keep_archive(running)

    def _keep_archive(self, stopped: list[KafkaNode]) -> None:
        """The class-data archive a cleanly stopped broker wrote at its exit, moved into place (atomic:
        brokers of other processes may be starting now); the others' removed."""
        java = java_binary()
        if java is None:
            return
        archive = classes_archive(java, require(KAFKA))
        for node in stopped:
            if node.dump is None or not node.dump.is_file():
                continue
            if node.exited in (0, 128 + signal.SIGTERM) and not archive.is_file():  # a clean stop: SIGTERM
                archive.parent.mkdir(parents=True, exist_ok=True)
                os.replace(node.dump, archive)
            else:
                node.dump.unlink(missing_ok=True)

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.cleanup()


def run_foreground(port: int, data_dir: str | None, nodes: int = 1) -> int:
    """``safepoint broker --kafka``: Apache Kafka until SIGINT/SIGTERM (``devtools/broker.py`` ``serve``);
    a broker of several that dies is said once, and the command goes on while any lives."""
    kafka = ApacheKafka(nodes=nodes, port=port, data_dir=data_dir, quick_jit=False)
    return serve(kafka, kafka.data_dir, own_dir=data_dir is None)
