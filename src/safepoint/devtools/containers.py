"""The project's images as test hosts, through testcontainers' API: a Kafka cluster of three brokers, a
PostgreSQL server, the job and ``safepoint serve``, each a container of the images ``scripts/images.sh``
makes, on a network made for them.

Every container and network is the caller's: ``with TestNetwork() as net: ...`` removes what it made
on every way out, and each carries the labels ``dev.safepoint.test`` and ``dev.safepoint.test.pid``
(the process that made it) so that ``sweep`` removes what a process killed before its cleanup left
behind. testcontainers' own reaper (Ryuk) is an image no registry serves here: it is off
(``TESTCONTAINERS_RYUK_DISABLED``), and this module cleans up itself.

The network has a subnet of its own (``10.213.X.0/24``, the first free X) and every container a fixed
address on it, so that a broker advertises the address the host and the other containers both reach
(the host is the network's gateway: it reaches every container of the network, and nothing else
does). ``docker network disconnect`` cuts a container off from all of them, the host included, and
``connect`` joins it again at the same address; ``docker pause`` freezes it.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

from docker.errors import APIError, NotFound  # noqa: E402 - after the reaper is turned off
from docker.types import EndpointConfig, IPAMConfig, IPAMPool  # noqa: E402
from testcontainers.core.container import DockerContainer  # noqa: E402
from testcontainers.core.docker_client import DockerClient  # noqa: E402
from testcontainers.core.network import Network  # noqa: E402

from safepoint import __version__  # noqa: E402

__all__ = ["KAFKA_IMAGE", "LABEL", "LABEL_PID", "POSTGRES_IMAGE", "SAFEPOINT_IMAGE", "JobContainer", "KafkaCluster",
           "PostgresContainer", "ServeContainer", "TestNetwork", "engine_missing", "images_missing", "sweep"]

ROOT = Path(__file__).resolve().parents[3]


def _kafka_version() -> str:
    pom = (ROOT / "scripts" / "jars" / "kafka" / "pom.xml").read_text()
    found = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    return found.group(1) if found else "?"


SAFEPOINT_IMAGE = f"safepoint:{__version__}"
KAFKA_IMAGE = f"safepoint-kafka:{_kafka_version()}"
POSTGRES_IMAGE = "safepoint-postgres:15"
LABEL = "dev.safepoint.test"
LABEL_PID = "dev.safepoint.test.pid"
CLUSTER_ID = "Wv6QFwAAQACAAMDeWv6QFw"
"""The Kafka cluster's id (a base64 UUID, as ``kafka-storage.sh random-uuid`` makes; docker/compose.yaml's)."""


def _labels() -> dict[str, str]:
    return {LABEL: "1", LABEL_PID: str(os.getpid())}


def engine_missing() -> str | None:
    """None when a Docker engine answers, else why not (what to run)."""
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no Docker CLI or engine ({exc}): apt-get install docker.io, then ./scripts/engine.sh start"
    if done.returncode != 0 or not done.stdout.strip():
        why = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"no Docker engine answers ({why}): ./scripts/engine.sh start starts one (as root)"
    return None


def images_missing(*images: str) -> str | None:
    """None when the engine answers and has ``images`` (all of the project's by default), else why not."""
    why = engine_missing()
    if why:
        return why
    wanted = images or (SAFEPOINT_IMAGE, KAFKA_IMAGE, POSTGRES_IMAGE)
    absent = [i for i in wanted if subprocess.run(["docker", "image", "inspect", i], capture_output=True,
                                                  check=False).returncode != 0]
    return f"the images {absent} are not built: ./scripts/images.sh builds them" if absent else None


def sweep(all_of_them: bool = False) -> int:
    """Remove the containers and networks a test process made and left behind: those whose process has
    ended (or, with ``all_of_them``, every one labelled ``LABEL``). Returns how many."""
    client = DockerClient().client
    removed = 0

    def orphan(labels: dict[str, str]) -> bool:
        if all_of_them:
            return True
        try:
            pid = int(labels.get(LABEL_PID, "0"))
        except ValueError:
            return True
        if pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    for container in client.containers.list(all=True, filters={"label": LABEL}):
        if orphan(container.labels):
            with suppress(NotFound, APIError):
                container.remove(force=True, v=True)
                removed += 1
    for network in client.networks.list(filters={"label": LABEL}):
        if orphan(network.attrs.get("Labels") or {}):
            with suppress(NotFound, APIError):
                network.remove()
                removed += 1
    return removed


class TestNetwork(Network):
    """A network of its own subnet (the first free ``10.213.X.0/24``), labelled as this module's.
    ``address(n)`` is the n-th host address of it; ``remove`` also removes every container still on it."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self) -> None:
        super().__init__(docker_network_kw={"labels": _labels()})
        self.subnet = ""
        self._base = ""
        self.containers: list[DockerContainer] = []

    def create(self) -> TestNetwork:
        last: Exception | None = None
        for third in random.sample(range(1, 255), 254):  # noqa: S311 - a free subnet, not a secret
            base = f"10.213.{third}"
            ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=f"{base}.0/24", gateway=f"{base}.1")])
            self._docker_network_kw = {"labels": _labels(), "ipam": ipam}
            try:
                super().create()
            except APIError as exc:  # "Pool overlaps with other one on this address space": the next one
                last = exc
                continue
            self.subnet, self._base = f"{base}.0/24", base
            return self
        msg = f"no free subnet 10.213.X.0/24 for a test network: {last}"
        raise RuntimeError(msg)

    def address(self, n: int) -> str:
        assert 2 <= n <= 254, n
        return f"{self._base}.{n}"

    def attach(self, container: DockerContainer, n: int, *aliases: str) -> DockerContainer:
        """``container`` on this network at ``address(n)``, named ``aliases`` there, labelled as this module's."""
        self.containers.append(container)
        return container.with_network(self).with_kwargs(
            labels=_labels(),
            networking_config={self.name: EndpointConfig("1.41", aliases=list(aliases), ipv4_address=self.address(n))})

    def disconnect(self, container: DockerContainer) -> None:
        """Cut ``container`` off from every other host of the network, this one included; it runs on."""
        self._unwrap_network.disconnect(container.get_wrapped_container(), force=True)

    def reconnect(self, container: DockerContainer, n: int, *aliases: str) -> None:
        """Join ``container`` again at ``address(n)``."""
        self._unwrap_network.connect(container.get_wrapped_container(), ipv4_address=self.address(n), aliases=list(aliases))

    def remove(self) -> None:
        for container in reversed(self.containers):
            with suppress(Exception):
                container.stop()
        self.containers.clear()
        with suppress(NotFound):
            super().remove()

    def __enter__(self) -> TestNetwork:
        try:
            return self.create()
        except BaseException:
            self.remove()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()


def _wait(check: Any, timeout_s: float, what: str, logs: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001, S110 - not ready yet: asked again
            pass
        if time.monotonic() > deadline:
            tail = f":\n{logs()}" if logs is not None else ""
            msg = f"timed out after {timeout_s:.0f} s waiting for {what}{tail}"
            raise TimeoutError(msg)
        time.sleep(0.25)


def logs_of(container: DockerContainer, lines: int = 40) -> str:
    """The last ``lines`` of what the container printed (both streams)."""
    try:
        out = container.get_wrapped_container().logs(tail=lines)
    except Exception as exc:  # noqa: BLE001 - a container already gone
        return f"(no logs: {exc})"
    return bytes(out).decode(errors="replace")


class KafkaCluster:
    """Three brokers of the Kafka image on ``net`` (each its own controller too, a static quorum of the
    three, as docker/compose.yaml runs them): three replicas and ``min.insync.replicas=2`` for the topics
    made without settings, the broker's own timeouts (a broker is fenced after
    ``broker.session.timeout.ms``, 9 s). ``bootstrap`` lists the brokers' addresses on ``net``."""

    SESSION_TIMEOUT_S = 9.0
    """Kafka's ``broker.session.timeout.ms`` (its default): a broker silent that long loses its leaderships."""

    def __init__(self, net: TestNetwork, first: int = 10, heap: str = "-Xmx384m -Xms64m") -> None:
        self.net = net
        self.slots = {node: first + node - 1 for node in (1, 2, 3)}
        self.brokers: dict[int, DockerContainer] = {}
        voters = ",".join(f"{node}@{net.address(slot)}:9093" for node, slot in self.slots.items())
        for node, slot in self.slots.items():
            ip = net.address(slot)
            env = {
                "CLUSTER_ID": CLUSTER_ID, "KAFKA_NODE_ID": str(node), "KAFKA_PROCESS_ROLES": "broker,controller",
                "KAFKA_CONTROLLER_QUORUM_VOTERS": voters,
                "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
                "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{ip}:9092",
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT", "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
                "KAFKA_LOG_DIRS": "/var/lib/kafka/data", "KAFKA_DEFAULT_REPLICATION_FACTOR": "3",
                "KAFKA_MIN_INSYNC_REPLICAS": "2", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "3",
                "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "3", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "2",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "3",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "2", "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
                "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0", "KAFKA_HEAP_OPTS": heap,
                # a test's JVM lives minutes: C1 only, as the suite's other JVMs
                "KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true",
            }
            container = DockerContainer(KAFKA_IMAGE).with_envs(**env)
            self.brokers[node] = net.attach(container, slot, f"kafka{node}")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.net.address(slot)}:9092" for slot in self.slots.values())

    def start(self, timeout_s: float = 120) -> KafkaCluster:
        from safepoint.devtools.broker import wait_for_kafka

        for container in self.brokers.values():
            container.start()
        wait_for_kafka(self.bootstrap, timeout_s)
        _wait(lambda: self._brokers_seen() == 3, timeout_s, "three brokers in the cluster's metadata",
              lambda: "\n".join(logs_of(c, 10) for c in self.brokers.values()))
        return self

    def _brokers_seen(self) -> int:
        from confluent_kafka.admin import AdminClient

        return len(AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5).brokers)

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> the id of the broker leading it, as the cluster's majority says ({} while none answers)."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 5000})
        try:
            description = admin.describe_topics(TopicCollection([topic]), request_timeout=5)[topic].result(10)
        except Exception:  # noqa: BLE001 - asked again by the caller
            return {}
        return {p.id: p.leader.id if p.leader is not None else -1 for p in description.partitions}

    def in_sync(self, topic: str) -> dict[int, list[int]]:
        """Partition -> the ids of its in-sync replicas ({} while none answers)."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 5000})
        try:
            description = admin.describe_topics(TopicCollection([topic]), request_timeout=5)[topic].result(10)
        except Exception:  # noqa: BLE001 - asked again by the caller
            return {}
        return {p.id: sorted(r.id for r in p.isr) for p in description.partitions}

    def cut_off(self, node: int) -> None:
        """``docker network disconnect``: broker ``node`` runs on, reaching nobody and reached by nobody."""
        self.net.disconnect(self.brokers[node])

    def join(self, node: int) -> None:
        self.net.reconnect(self.brokers[node], self.slots[node], f"kafka{node}")

    def freeze(self, node: int) -> None:
        """``docker pause``: every process of broker ``node`` stopped where it stands (cgroup freezer).
        The freezer gives up on a busy process now and then ("unable to freeze"): asked again, a few times."""
        wrapped = self.brokers[node].get_wrapped_container()
        for attempt in range(5):
            try:
                wrapped.pause()
                return
            except APIError as exc:
                if "unable to freeze" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2)

    def thaw(self, node: int) -> None:
        self.brokers[node].get_wrapped_container().unpause()

    def logs(self, node: int, lines: int = 40) -> str:
        return logs_of(self.brokers[node], lines)


class PostgresContainer:
    """PostgreSQL 15 of the PostgreSQL image on ``net`` (logical WAL and prepared transactions, as the
    PostgreSQL agent's tests want them); ``dsn`` reaches it from the host and from the network."""

    PASSWORD = "safepoint-test"  # noqa: S105 - a throwaway server's, on a network of the test's own

    def __init__(self, net: TestNetwork, slot: int = 20) -> None:
        self.net = net
        self.slot = slot
        container = DockerContainer(POSTGRES_IMAGE).with_env("POSTGRES_PASSWORD", self.PASSWORD).with_command(
            ["postgres", "-c", "wal_level=logical", "-c", "max_prepared_transactions=10", "-c", "fsync=off"])
        self.container = net.attach(container, slot, "postgres")

    @property
    def host(self) -> str:
        return self.net.address(self.slot)

    def dsn(self, dbname: str = "postgres", application_name: str | None = None) -> str:
        app = f"?application_name={application_name}" if application_name else ""
        return f"postgresql://postgres:{self.PASSWORD}@{self.host}:5432/{dbname}{app}"

    def start(self, timeout_s: float = 60) -> PostgresContainer:
        self.container.start()
        self.wait_ready(timeout_s)
        return self

    def ready(self) -> bool:
        import psycopg

        with psycopg.connect(self.dsn(), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True

    def wait_ready(self, timeout_s: float = 60) -> None:
        _wait(self.ready, timeout_s, f"PostgreSQL at {self.host}", lambda: logs_of(self.container))

    def restart(self, timeout_s: float = 60) -> None:
        """``docker restart``: a fast shutdown (SIGINT, every session ended), then the same data started again."""
        self.container.get_wrapped_container().restart(timeout=30)
        self.wait_ready(timeout_s)


class JobContainer:
    """``safepoint run`` in the safepoint image on ``net`` (its own Spark, ``local[2]``), its checkpoint
    a folder of the host mounted at ``/var/lib/safepoint/checkpoints`` (so that a test reads it back and a
    new container takes it up). ``flags``: the run's flags, as ``tests_support.job_flags`` writes them."""

    def __init__(self, net: TestNetwork, flags: dict[str, Any], checkpoint: Path, slot: int = 30,
                 env: dict[str, str] | None = None) -> None:
        self.net = net
        self.env = env or {}
        self.slot = slot
        checkpoint.mkdir(parents=True, exist_ok=True)
        checkpoint.chmod(0o777)  # noqa: S103 - the image's user (uid 10001) writes it; a test's own folder
        self.checkpoint = checkpoint
        argv = ["safepoint", "run"]
        for key, value in {**flags, "checkpoint": "/var/lib/safepoint/checkpoints/job"}.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        self.argv = argv
        self.container = self._make()

    def _make(self) -> DockerContainer:
        container = (DockerContainer(SAFEPOINT_IMAGE).with_command(self.argv)
                     .with_env("SAFEPOINT_HTTP_PORT", "8000").with_env("SAFEPOINT_HTTP_HOST", "0.0.0.0")  # noqa: S104
                     .with_env("SPARK_LOCAL_IP", self.net.address(self.slot))
                     .with_volume_mapping(str(self.checkpoint), "/var/lib/safepoint/checkpoints", "rw")
                     .with_envs(**self.env))
        return self.net.attach(container, self.slot, "job")

    @property
    def folder(self) -> Path:
        """The job's checkpoint as the host sees it."""
        return self.checkpoint / "job"

    @property
    def url(self) -> str:
        return f"http://{self.net.address(self.slot)}:8000"

    def start(self) -> JobContainer:
        self.container.start()
        return self

    def kill(self) -> None:
        """SIGKILL the container's every process (the driver, its JVM, the Python workers) and remove it."""
        with suppress(Exception):
            self.container.get_wrapped_container().kill()
        with suppress(Exception):
            self.container.stop()

    def replace(self) -> JobContainer:
        """A new container of the same job on the same checkpoint (after ``kill``)."""
        if self.container in self.net.containers:
            self.net.containers.remove(self.container)
        self.container = self._make()
        return self.start()

    def stop(self, timeout_s: int = 60) -> int:
        """``docker stop`` (SIGTERM: the job stops its query and exits); the exit code."""
        wrapped = self.container.get_wrapped_container()
        with suppress(Exception):
            wrapped.stop(timeout=timeout_s)
        wrapped.reload()
        return int(wrapped.attrs["State"]["ExitCode"])

    def alive(self) -> bool:
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return bool(wrapped.status == "running")

    def ended(self) -> str:
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return f"container {wrapped.status}, exit {wrapped.attrs['State']['ExitCode']}"

    def tail(self, n: int = 40) -> str:
        return logs_of(self.container, n)


class ServeContainer:
    """``safepoint serve`` in the safepoint image on ``net``: the status API, metrics and dashboard of
    the status topic, at ``url`` (port 8000 of its address on the network)."""

    def __init__(self, net: TestNetwork, bootstrap: str, status_topic: str, slot: int = 40) -> None:
        self.net = net
        self.slot = slot
        container = DockerContainer(SAFEPOINT_IMAGE).with_command(
            ["safepoint", "serve", "--bootstrap", bootstrap, "--status-topic", status_topic, "--http-host", "0.0.0.0",  # noqa: S104
             "--http-port", "8000"]).with_env("SAFEPOINT_HTTP_PORT", "8000")
        self.container = net.attach(container, slot, "serve")

    @property
    def url(self) -> str:
        return f"http://{self.net.address(self.slot)}:8000"

    def start(self, timeout_s: float = 60) -> ServeContainer:
        import urllib.request

        self.container.start()
        _wait(lambda: urllib.request.urlopen(f"{self.url}/healthz", timeout=3).status == 200,  # noqa: S310
              timeout_s, f"safepoint serve at {self.url}", lambda: logs_of(self.container))
        return self


def containers_of_this_process() -> Iterator[str]:
    """The names of the containers this process made that still exist (a test's cleanup check)."""
    client = DockerClient().client
    for container in client.containers.list(all=True, filters={"label": f"{LABEL_PID}={os.getpid()}"}):
        yield str(container.name)
